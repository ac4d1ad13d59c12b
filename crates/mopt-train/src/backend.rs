//! The one place that maps a device name to a Burn device.
//!
//! `cpu` (alias `flex`) is Burn's Flex CPU backend, always built. GPU backends will be cargo
//! features of this crate adding arms here (`cuda:0`, `wgpu`), nothing else.

use burn::prelude::*;

use crate::error::TrainError;

/// A parsed `--device` / `[run] device` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Burn Flex on the CPU.
    Cpu,
}

impl DeviceSpec {
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "cpu" | "flex" => Ok(DeviceSpec::Cpu),
            other => Err(TrainError::Input(format!(
                "unknown device `{other}`; this build supports `cpu` (GPU backends are a later cargo feature)"
            ))),
        }
    }

    /// The inference device (no autodiff); call `.autodiff()` on it to train.
    pub fn device(&self) -> Device {
        match self {
            DeviceSpec::Cpu => Device::flex(),
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

    pub fn name(&self) -> &'static str {
        match self {
            DeviceSpec::Cpu => "cpu (burn-flex)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_unknown() {
        assert_eq!(DeviceSpec::parse("CPU").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("flex").unwrap(), DeviceSpec::Cpu);
        assert!(DeviceSpec::parse("tpu")
            .unwrap_err()
            .to_string()
            .contains("unknown device `tpu`"));
    }
}
