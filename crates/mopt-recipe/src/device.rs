//! `[run] devices` entries: a device index of `[run] device`'s backend, or a remote server.

use std::fmt;

/// One data-parallel device of a recipe.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceRef {
    /// Device `i` of `[run] device`'s backend (on the CPU every index is the one Flex device).
    Local(usize),
    /// A device served by `mopt-train serve` (Burn's remote backend over WebSocket).
    Remote(RemoteAddr),
}

/// A remote server's device: `ws://host:port`, device `index` of those it serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemoteAddr {
    /// `ws://host:port`.
    pub url: String,
    /// The device's position in the server's list (`#N`; 0 unless written).
    pub index: usize,
}

impl DeviceRef {
    /// How an address is written, for error messages.
    pub const EXAMPLE: &'static str =
        "write a remote device as \"ws://HOST:PORT\" (device 0 of the server `mopt-train serve --port PORT` started) or \"ws://HOST:PORT#N\" for its device N";

    /// A remote device from its address (`ws://host:port`, `ws://host:port#N`).
    pub fn parse(text: &str) -> Result<Self, DeviceError> {
        let t = text.trim();
        let Some(rest) = t.strip_prefix("ws://") else {
            return Err(if t.starts_with("wss://") {
                DeviceError::Encrypted(t.into())
            } else {
                DeviceError::NotAnAddress(t.into())
            });
        };
        let (hostport, index) = match rest.split_once('#') {
            Some((hp, i)) => {
                let i = i.parse::<usize>().map_err(|_| DeviceError::DeviceNumber {
                    text: t.into(),
                    number: i.into(),
                })?;
                (hp, i)
            }
            None => (rest, 0),
        };
        let hostport = hostport.trim_end_matches('/');
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(DeviceError::NoPort(t.into()));
        };
        if host.is_empty() || hostport.contains('/') {
            return Err(DeviceError::Path(t.into()));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(DeviceRef::Remote(RemoteAddr {
                url: format!("ws://{host}:{p}"),
                index,
            })),
            _ => Err(DeviceError::Port {
                text: t.into(),
                port: port.into(),
            }),
        }
    }

    /// A command-line entry: a device index, or an address as [`parse`](Self::parse) reads it.
    pub fn parse_entry(text: &str) -> Result<Self, DeviceError> {
        match text.trim().parse::<usize>() {
            Ok(i) => Ok(DeviceRef::Local(i)),
            Err(_) => Self::parse(text),
        }
    }

    /// Whether this is a remote server's device.
    pub fn is_remote(&self) -> bool {
        matches!(self, DeviceRef::Remote(_))
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index == 0 {
            write!(f, "{}", self.url)
        } else {
            write!(f, "{}#{}", self.url, self.index)
        }
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRef::Local(i) => write!(f, "{i}"),
            DeviceRef::Remote(a) => write!(f, "{a}"),
        }
    }
}

/// A device list as a run uses it: each device once, at most 64, and `[0]` the same as none.
pub fn checked(d: Vec<DeviceRef>) -> Result<Vec<DeviceRef>, DeviceError> {
    if let Some(dup) = crate::spec::first_repeat(&d) {
        return Err(DeviceError::Repeated(dup.to_string()));
    }
    if d.len() > 64 {
        return Err(DeviceError::TooMany(d.len()));
    }
    Ok(if d == [DeviceRef::Local(0)] {
        Vec::new()
    } else {
        d
    })
}

/// Why a device entry or list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `wss://`: Burn's transport has no TLS.
    #[error("`{0}`: Burn's WebSocket transport is unencrypted (ws://); run it on a trusted network or tunnel it")]
    Encrypted(String),
    /// Neither an index nor `ws://`.
    #[error("`{0}` is neither a device index nor a ws:// address")]
    NotAnAddress(String),
    /// `#N` that is not a number.
    #[error("`{text}`: `#{number}` is not a device number")]
    DeviceNumber {
        /// The entry.
        text: String,
        /// What followed `#`.
        number: String,
    },
    /// No `:PORT`.
    #[error("`{0}` has no port")]
    NoPort(String),
    /// No host, or a path after the port.
    #[error("`{0}`: expected ws://HOST:PORT with no path")]
    Path(String),
    /// A port outside 1-65535.
    #[error("`{text}`: `{port}` is not a port (1-65535)")]
    Port {
        /// The entry.
        text: String,
        /// The port as written.
        port: String,
    },
    /// A device listed twice.
    #[error("device {0} is listed twice")]
    Repeated(String),
    /// More than 64 devices.
    #[error("{0} devices")]
    TooMany(usize),
}

impl DeviceError {
    /// How to write the entry or list instead.
    pub fn fix(&self) -> &'static str {
        match self {
            DeviceError::Repeated(_) => {
                "list each device once, e.g. devices = [0, 1] or [0, \"ws://10.0.0.2:3000\"]"
            }
            DeviceError::TooMany(_) => "at most 64 devices",
            _ => DeviceRef::EXAMPLE,
        }
    }
}

/// `[0, ws://a:1]` as a list.
pub fn list(devices: &[DeviceRef]) -> String {
    let items: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_their_device_number() {
        let r = |url: &str, index| {
            DeviceRef::Remote(RemoteAddr {
                url: url.into(),
                index,
            })
        };
        assert_eq!(
            DeviceRef::parse("ws://10.0.0.2:3000").unwrap(),
            r("ws://10.0.0.2:3000", 0)
        );
        assert_eq!(
            DeviceRef::parse(" ws://gpu-a:3001/#2 ").unwrap(),
            r("ws://gpu-a:3001", 2)
        );
        assert_eq!(
            DeviceRef::parse("ws://h:1#2").unwrap().to_string(),
            "ws://h:1#2"
        );
        for (bad, why) in [
            ("10.0.0.2:3000", "neither a device index"),
            ("wss://h:3000", "unencrypted"),
            ("ws://h", "no port"),
            ("ws://h:0", "not a port"),
            ("ws://h:70000", "not a port"),
            ("ws://:3000", "no path"),
            ("ws://h:3000/x", "no path"),
            ("ws://h:3000#x", "not a device number"),
        ] {
            let e = DeviceRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(
            list(&[DeviceRef::Local(0), r("ws://a:1", 0)]),
            "[0, ws://a:1]"
        );
    }
}
