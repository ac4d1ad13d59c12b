//! Remote devices: a `mopt-train serve` server's devices, reached over Burn's remote backend
//! (WebSocket), and the server itself.
//!
//! A remote device is an ordinary Burn [`Device`]: the data-parallel workers of
//! [`crate::parallel`] fork the model to it, run the shard's forward and backward there and move
//! the gradients back to the main device, exactly as for local devices.

use std::sync::mpsc;
use std::time::Duration;

use burn::prelude::*;
use burn::remote::{ConnectError, RemoteHost};
use burn::server::{RemoteServer, ServeError, TokenAuthorizer, WebSocketTransport};

use crate::backend::{one_plus_two, panic_text, RemoteSpec, Token};
use crate::error::TrainError;

/// How long opening a remote device may take before it is called unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The device, its session opened (or the one already open).
pub fn connect(r: &RemoteSpec) -> Result<Device, ConnectError> {
    let mut host = RemoteHost::websocket(&r.addr.url);
    if let Some(t) = &r.token {
        host = host.with_credential(t.secret());
    }
    Device::remote_options(&host)
        .device_index(r.addr.index)
        .init()
}

/// Open the device before a run folder exists, within [`CONNECT_TIMEOUT`], and check that it
/// computes; an input error naming the address and the fix otherwise.
pub fn open(r: &RemoteSpec) -> Result<Device, TrainError> {
    let (tx, rx) = mpsc::channel();
    let spec = r.clone();
    std::thread::spawn(move || {
        let out = std::panic::catch_unwind(|| {
            connect(&spec).map(|d| {
                let s = one_plus_two(&d);
                (d, s)
            })
        });
        let _ = tx.send(out);
    });
    let addr = &r.addr;
    match rx.recv_timeout(CONNECT_TIMEOUT) {
        Ok(Ok(Ok((d, 3.0)))) => Ok(d),
        Ok(Ok(Ok((_, s)))) => Err(TrainError::Failed(format!(
            "remote device {addr} computed 1 + 2 = {s}"
        ))),
        Ok(Ok(Err(e))) => Err(TrainError::Input(connect_message(r, &e))),
        Ok(Err(payload)) => Err(TrainError::Input(format!(
            "remote device {addr}: the connection failed ({}); check that `mopt-train serve` runs there",
            panic_text(payload.as_ref())
        ))),
        Err(_) => Err(TrainError::Input(format!(
            "remote device {addr}: no answer within {} s; check the address, that `mopt-train serve` runs there and that the port is open",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Why `r` could not be opened, and what to do.
fn connect_message(r: &RemoteSpec, e: &ConnectError) -> String {
    let addr = &r.addr;
    let fix = match e {
        ConnectError::Unreachable { .. } => format!(
            "start `mopt-train serve --port {}` on that machine, or fix the address in [run] devices / --devices",
            addr.url.rsplit(':').next().unwrap_or("PORT")
        ),
        ConnectError::Handshake { .. } => {
            "check that a `mopt-train serve` of this same mopt build answers there (an older Burn release's server ends its sessions this way)".into()
        }
        ConnectError::Unauthorized => if r.token.is_some() {
            "the server refused this token: give the one its --token-file holds ([run] token-file or --token-file)"
        } else {
            "the server asks for a token: give its --token-file's file with [run] token-file or --token-file"
        }
        .to_string(),
        ConnectError::NoSuchDevice { device_count } => format!(
            "write a device number from #0 to #{} after the address",
            device_count.saturating_sub(1)
        ),
        ConnectError::IncompatibleProtocol { .. } => {
            "build this mopt-train and the server's from the same mopt (one Burn release)".into()
        }
        _ => "check the address and the server's log".into(),
    };
    format!("remote device {addr}: {e}; {fix}")
}

/// Serve `devices` over WebSocket on `listener`, presenting `token` to clients if given:
/// blocks until SIGTERM or Ctrl+C.
pub fn serve(
    devices: Vec<Device>,
    listener: std::net::TcpListener,
    token: Option<&Token>,
) -> Result<(), TrainError> {
    let mut server = RemoteServer::new(devices);
    if let Some(t) = token {
        let auth = TokenAuthorizer::new(t.secret())
            .map_err(|e| TrainError::Input(format!("serve --token-file: {e}")))?;
        server = server.with_authorizer(auth);
    }
    server
        .serve(WebSocketTransport::from_listener(listener))
        .map_err(|e| match e {
            ServeError::Bind { .. } => TrainError::Input(format!("cannot listen: {e}")),
            e => TrainError::Failed(format!("the server stopped: {e}")),
        })
}
