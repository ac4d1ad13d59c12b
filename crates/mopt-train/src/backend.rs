//! The one place that maps a device name to a Burn device.
//!
//! | name | backend | cargo feature |
//! |---|---|---|
//! | `cpu` (alias `flex`) | Burn Flex on the CPU (mopt's fused kernels) | always built |
//! | `cuda:N` | Burn CUDA (CubeCL) on NVIDIA GPU N | `cuda` |
//! | `wgpu:N` | Burn wgpu (Vulkan/Metal/DX12 through CubeCL) on discrete GPU N; `wgpu` alone: the best adapter | `wgpu` |
//! | `tch-cuda:N`, `tch-cpu` | LibTorch through `tch` | `tch` |
//! | `ws://host:port[#N]` | Burn's remote backend: device N of a `mopt-train serve` server | `remote` |
//!
//! Names of backends this build lacks parse into an error that names the feature to build with.

use burn::prelude::*;

use mopt_recipe::{DeviceRef, RemoteAddr};

use crate::error::TrainError;

/// The credential a remote server checks (`mopt-train serve --token-file`); never printed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// The token in `file` (surrounding whitespace trimmed); an input error naming the file when
    /// it cannot be read or is empty.
    pub fn read(file: &std::path::Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(file).map_err(|e| {
            TrainError::Input(format!(
                "{}: cannot read the token file: {e}",
                file.display()
            ))
        })?;
        let t = text.trim();
        if t.is_empty() {
            return Err(TrainError::Input(format!(
                "{}: the token file is empty; write the server's token in it",
                file.display()
            )));
        }
        Ok(Token(t.to_string()))
    }

    /// The token itself.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// A remote server's device and the credential to present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    /// `ws://host:port` and the device's number there.
    pub addr: RemoteAddr,
    /// What the server's `--token-file` holds, if it asks for one.
    pub token: Option<Token>,
}

/// A parsed `--device` / `[run] device` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Burn Flex on the CPU.
    Cpu,
    /// Burn's CUDA backend on GPU `n`.
    Cuda(usize),
    /// Burn's wgpu backend: discrete GPU `n`, or `None` for wgpu's default adapter.
    Wgpu(Option<usize>),
    /// LibTorch on CUDA GPU `n`.
    TchCuda(usize),
    /// LibTorch on the CPU.
    TchCpu,
    /// A device of a remote server (`mopt-train serve`), through Burn's remote backend.
    Remote(RemoteSpec),
}

impl DeviceSpec {
    /// The device named `name` (`cpu`, `cuda:0`, `wgpu:0`, `tch-cuda:0`, `tch-cpu`).
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        if name.trim().starts_with("ws://") || name.trim().starts_with("wss://") {
            let spec = match DeviceRef::parse(name).map_err(|e| TrainError::Input(e.to_string()))? {
                DeviceRef::Remote(addr) => DeviceSpec::Remote(RemoteSpec { addr, token: None }),
                DeviceRef::Local(_) => unreachable!("a ws:// name is an address"),
            };
            return spec.built_or_err(name);
        }
        let lower = name.trim().to_ascii_lowercase();
        let (kind, index) = match lower.split_once(':') {
            Some((k, i)) => {
                let i = i.parse::<usize>().map_err(|_| {
                    TrainError::Input(format!(
                        "device `{name}`: `{i}` is not a device index; write e.g. `cuda:0`"
                    ))
                })?;
                (k, Some(i))
            }
            None => (lower.as_str(), None),
        };
        let spec = match kind {
            "cpu" | "flex" if index.is_none() => DeviceSpec::Cpu,
            "cuda" => DeviceSpec::Cuda(index.unwrap_or(0)),
            "wgpu" | "vulkan" => DeviceSpec::Wgpu(index),
            "tch-cuda" => DeviceSpec::TchCuda(index.unwrap_or(0)),
            "tch-cpu" if index.is_none() => DeviceSpec::TchCpu,
            _ => {
                return Err(TrainError::Input(format!(
                    "unknown device `{name}`; use `cpu`, `cuda:N`, `wgpu:N`, `tch-cuda:N` or `tch-cpu` (GPU names need their cargo feature: {})",
                    Self::built_note()
                )))
            }
        };
        spec.built_or_err(name)
    }

    /// `self`, or the error saying which cargo feature this build lacks for it.
    fn built_or_err(self, name: &str) -> Result<Self, TrainError> {
        match self.feature() {
            Some(feature) if !Self::built(feature) => Err(TrainError::Input(format!(
                "device `{name}` needs the `{feature}` backend, and this mopt-train was built without it; \
                 rebuild with `cargo build --release --features {feature}` (docs/src/gpu.md){}",
                if feature == "tch" {
                    " with LibTorch available (LIBTORCH_USE_PYTORCH=1 and PyTorch 2.9 on PATH)"
                } else {
                    ""
                }
            ))),
            _ => Ok(self),
        }
    }

    /// The cargo feature a device needs (`None`: always built).
    pub fn feature(&self) -> Option<&'static str> {
        match self {
            DeviceSpec::Cpu => None,
            DeviceSpec::Cuda(_) => Some("cuda"),
            DeviceSpec::Wgpu(_) => Some("wgpu"),
            DeviceSpec::TchCuda(_) | DeviceSpec::TchCpu => Some("tch"),
            DeviceSpec::Remote(_) => Some("remote"),
        }
    }

    fn built(feature: &str) -> bool {
        match feature {
            "cuda" => cfg!(feature = "cuda"),
            "wgpu" => cfg!(feature = "wgpu"),
            "tch" => cfg!(feature = "tch"),
            "remote" => cfg!(feature = "remote"),
            _ => false,
        }
    }

    /// `this build has: ...` for messages.
    fn built_note() -> String {
        let have: Vec<&str> = ["cuda", "wgpu", "tch", "remote"]
            .into_iter()
            .filter(|f| Self::built(f))
            .collect();
        if have.is_empty() {
            "this build has the CPU only".into()
        } else {
            format!("this build has cpu, {}", have.join(", "))
        }
    }

    /// The inference device (no autodiff); call `.autodiff()` on it to train.
    pub fn device(&self) -> Device {
        match self {
            DeviceSpec::Cpu => Device::flex(),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(i) => Device::cuda(*i),
            #[cfg(feature = "wgpu")]
            DeviceSpec::Wgpu(i) => Device::wgpu(match i {
                Some(i) => DeviceKind::DiscreteGpu(*i),
                None => DeviceKind::DefaultDevice,
            }),
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            DeviceSpec::TchCuda(i) => Device::libtorch_cuda(*i),
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            DeviceSpec::TchCpu => Device::libtorch(),
            #[cfg(feature = "remote")]
            DeviceSpec::Remote(r) => crate::remote::connect(r)
                .unwrap_or_else(|e| panic!("remote device {}: {e}", r.addr)),
            #[allow(unreachable_patterns)]
            other => unreachable!("`parse` refuses {other:?} in a build without its feature"),
        }
    }

    /// The device, or an error naming it when it cannot be reached now (a remote server that
    /// died since the run started: the run stops there, its last state kept for `--resume`).
    pub fn try_device(&self) -> Result<Device, TrainError> {
        #[cfg(feature = "remote")]
        if let DeviceSpec::Remote(r) = self {
            return crate::remote::connect(r).map_err(|e| {
                TrainError::Failed(format!(
                    "remote device {}: {e}; restart its server (or name a replacement with --devices) and rerun with --resume",
                    r.addr
                ))
            });
        }
        Ok(self.device())
    }

    /// Open the device with a first tensor, turning a backend's panic (no driver, no GPU with
    /// that index) into an error that names the device.
    pub fn open(&self) -> Result<Device, TrainError> {
        #[cfg(feature = "remote")]
        if let DeviceSpec::Remote(r) = self {
            return crate::remote::open(r);
        }
        let spec = self.clone();
        let probe = std::panic::catch_unwind(move || {
            let d = spec.device();
            let s = one_plus_two(&d);
            (d, s)
        });
        match probe {
            Ok((d, 3.0)) => Ok(d),
            Ok((_, s)) => Err(TrainError::Failed(format!(
                "device {} computed 1 + 2 = {s}",
                self.name()
            ))),
            Err(payload) => {
                let msg = panic_text(payload.as_ref());
                Err(TrainError::Input(format!(
                    "cannot open device {}: {msg}; check that the GPU and its driver are present (nvidia-smi / vulkaninfo) or pick another --device",
                    self.name()
                )))
            }
        }
    }

    /// The training (autodiff) device for `train`: with Burn's balanced gradient
    /// checkpointing when `train.gradient-checkpointing` is on.
    pub fn train_device(&self, train: &mopt_recipe::TrainSpec) -> Device {
        let ad = self.device().autodiff();
        if train.gradient_checkpointing {
            ad.gradient_checkpointing()
        } else {
            ad
        }
    }

    /// The device's name as a recipe writes it.
    pub fn name(&self) -> String {
        match self {
            DeviceSpec::Cpu => "cpu (burn-flex)".into(),
            DeviceSpec::Cuda(i) => format!("cuda:{i} (burn-cuda)"),
            DeviceSpec::Wgpu(Some(i)) => format!("wgpu:{i} (burn-wgpu)"),
            DeviceSpec::Wgpu(None) => "wgpu (burn-wgpu, default adapter)".into(),
            DeviceSpec::TchCuda(i) => format!("tch-cuda:{i} (LibTorch)"),
            DeviceSpec::TchCpu => "tch-cpu (LibTorch)".into(),
            DeviceSpec::Remote(r) => format!("{} (burn-remote)", r.addr),
        }
    }

    /// The main device and the data-parallel replicas for `[run] devices` on this backend
    /// (empty: this device alone): an index is this backend's device, an address a remote
    /// server's (presenting `token`). On the CPU every index is the one Flex device: local
    /// replicas then share the cores (the data-parallel code path without a speed-up).
    pub fn data_parallel(
        &self,
        devices: &[DeviceRef],
        token: Option<&Token>,
    ) -> (DeviceSpec, Vec<DeviceSpec>) {
        let at = |d: &DeviceRef| match d {
            DeviceRef::Local(i) => self.with_index(*i).unwrap_or_else(|| self.clone()),
            DeviceRef::Remote(addr) => DeviceSpec::Remote(RemoteSpec {
                addr: addr.clone(),
                token: token.cloned(),
            }),
        };
        match devices.split_first() {
            None => (self.clone(), Vec::new()),
            Some((first, rest)) => (at(first), rest.iter().map(at).collect()),
        }
    }

    /// Whether this is a remote server's device.
    pub fn is_remote(&self) -> bool {
        matches!(self, DeviceSpec::Remote(_))
    }

    /// A remote device presenting `token` (other devices unchanged).
    pub fn with_token(self, token: Option<&Token>) -> Self {
        match self {
            DeviceSpec::Remote(r) => DeviceSpec::Remote(RemoteSpec {
                token: token.cloned(),
                ..r
            }),
            other => other,
        }
    }

    /// The same backend on device index `i` (data-parallel replicas); `None` for a backend
    /// with one device (the CPU).
    pub fn with_index(&self, i: usize) -> Option<Self> {
        match self {
            DeviceSpec::Cpu | DeviceSpec::TchCpu | DeviceSpec::Remote(_) => None,
            DeviceSpec::Cuda(_) => Some(DeviceSpec::Cuda(i)),
            DeviceSpec::Wgpu(_) => Some(DeviceSpec::Wgpu(Some(i))),
            DeviceSpec::TchCuda(_) => Some(DeviceSpec::TchCuda(i)),
        }
    }
}

/// A device's first computation, 1 + 2 (3 on a device that works).
pub(crate) fn one_plus_two(d: &Device) -> f32 {
    Tensor::<1>::from_floats([1.0, 2.0], d).sum().into_scalar()
}

/// A panic's message.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown error".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_unknown() {
        assert_eq!(DeviceSpec::parse("CPU").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("flex").unwrap(), DeviceSpec::Cpu);
        let err = DeviceSpec::parse("tpu").unwrap_err().to_string();
        assert!(err.contains("unknown device `tpu`"), "{err}");
        let err = DeviceSpec::parse("cuda:x").unwrap_err().to_string();
        assert!(err.contains("not a device index"), "{err}");
        assert!(DeviceSpec::parse("cpu:1").is_err());
    }

    #[test]
    fn gpu_names_need_their_feature() {
        for (name, spec, feature) in [
            ("cuda:1", DeviceSpec::Cuda(1), "cuda"),
            ("cuda", DeviceSpec::Cuda(0), "cuda"),
            ("wgpu:0", DeviceSpec::Wgpu(Some(0)), "wgpu"),
            ("wgpu", DeviceSpec::Wgpu(None), "wgpu"),
            ("tch-cuda:2", DeviceSpec::TchCuda(2), "tch"),
            ("tch-cpu", DeviceSpec::TchCpu, "tch"),
        ] {
            assert_eq!(spec.feature(), Some(feature));
            match DeviceSpec::parse(name) {
                Ok(s) => {
                    assert!(
                        DeviceSpec::built(feature),
                        "{name} parsed without its feature"
                    );
                    assert_eq!(s, spec);
                }
                Err(e) => {
                    assert!(!DeviceSpec::built(feature));
                    let e = e.to_string();
                    assert!(e.contains(&format!("--features {feature}")), "{e}");
                }
            }
        }
    }

    #[test]
    fn the_cpu_opens() {
        let d = DeviceSpec::Cpu.open().unwrap();
        assert!(!d.is_autodiff());
        assert_eq!(DeviceSpec::Cpu.with_index(1), None);
        assert_eq!(DeviceSpec::Cuda(0).with_index(1), Some(DeviceSpec::Cuda(1)));
        let (main, rest) =
            DeviceSpec::Cuda(0).data_parallel(&[DeviceRef::Local(2), DeviceRef::Local(3)], None);
        assert_eq!(
            (main, rest),
            (DeviceSpec::Cuda(2), vec![DeviceSpec::Cuda(3)])
        );
        let local = [0, 1, 2].map(DeviceRef::Local);
        let (main, rest) = DeviceSpec::Cpu.data_parallel(&local, None);
        assert_eq!((main, rest.len()), (DeviceSpec::Cpu, 2));
        assert_eq!(DeviceSpec::Cpu.data_parallel(&[], None).1.len(), 0);
        let remote = DeviceRef::parse("ws://h:9#1").unwrap();
        let (main, rest) = DeviceSpec::Cpu.data_parallel(&[DeviceRef::Local(0), remote], None);
        assert_eq!(main, DeviceSpec::Cpu);
        assert_eq!(rest[0].name(), "ws://h:9#1 (burn-remote)");
        assert_eq!(rest[0].feature(), Some("remote"));
    }
}
