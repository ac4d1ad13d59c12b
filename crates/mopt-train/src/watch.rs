//! The watchdog of a training on remote devices: Burn's remote client waits for a server's
//! reply without a time limit, so a server that stops answering without closing its connection
//! (a machine frozen, a network cut) would block the run for ever. While a fit on remote
//! devices runs it holds a [`Watch`]; every micro-batch and every evaluation batch is a
//! [`beat`]; when none comes for the limit, the process ends with exit code 1 and a message
//! naming the devices. The training state saved last is on disk (written atomically), so
//! `--resume` goes on from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What is watched: the last beat, the limit, the devices for the message.
struct Watched {
    /// The [`Watch`] that armed it.
    id: u64,
    last: Instant,
    limit: Duration,
    devices: String,
}

static WATCHED: Mutex<Option<Watched>> = Mutex::new(None);
static THREAD: OnceLock<()> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Armed while it lives (the latest one armed: a Watch dropped after a newer one was armed
/// leaves the newer one in place).
#[must_use = "the watchdog is disarmed when the Watch is dropped"]
pub struct Watch(u64);

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        if watched.as_ref().is_some_and(|w| w.id == self.0) {
            *watched = None;
        }
    }
}

/// How long work on remote devices may go without a beat: `MOPT_REMOTE_STEP_TIMEOUT_S`
/// seconds, 600 unless set.
pub fn remote_limit() -> Duration {
    let Ok(text) = std::env::var("MOPT_REMOTE_STEP_TIMEOUT_S") else {
        return Duration::from_secs(600);
    };
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
        _ => {
            eprintln!(
                "warning: MOPT_REMOTE_STEP_TIMEOUT_S={text} is not a number of seconds above 0; using 600"
            );
            Duration::from_secs(600)
        }
    }
}

/// Watch from now: without a [`beat`] for `limit`, the process ends naming `devices`.
pub fn arm(limit: Duration, devices: String) -> Watch {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    *WATCHED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Watched {
        id,
        last: Instant::now(),
        limit,
        devices,
    });
    THREAD.get_or_init(|| {
        std::thread::spawn(watch_loop);
    });
    Watch(id)
}

/// Progress: a batch finished (a no-op when nothing is watched).
pub fn beat() {
    if let Some(w) = WATCHED.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        w.last = Instant::now();
    }
}

fn watch_loop() {
    loop {
        let tick = {
            let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = watched.as_ref() {
                if w.last.elapsed() > w.limit {
                    eprintln!(
                        "error: training on devices {} made no progress for {:.0} s (MOPT_REMOTE_STEP_TIMEOUT_S): a server stopped answering; the run stopped at its last saved point: restart the server (or name a replacement with --devices) and rerun with --resume",
                        w.devices,
                        w.limit.as_secs_f64()
                    );
                    std::process::exit(1);
                }
                (w.limit / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
            } else {
                Duration::from_millis(500)
            }
        };
        std::thread::sleep(tick);
    }
}
