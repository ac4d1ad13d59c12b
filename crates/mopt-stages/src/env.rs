//! The environment a report was measured in: versions, CPU model and SIMD features, threads, OS.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
/// The machine and versions a run was measured on.
pub struct Environment {
    /// mopt's version.
    pub mopt_version: String,
    /// Burn's version.
    pub burn_version: String,
    /// The CPU's model name.
    pub cpu_model: String,
    /// SIMD features the CPU reports (`avx2`, `fma`, `avx512f`, …).
    pub simd: Vec<String>,
    /// Logical CPUs.
    pub logical_cpus: usize,
    /// Threads the CPU kernels use (rayon's pool).
    pub threads: usize,
    /// The GEMM path mopt's CPU kernels take here ([`mopt_kernels::gemm::path`]).
    #[serde(default)]
    pub gemm_path: String,
    /// Where bf16 products run here ([`mopt_kernels::bf16::path`]: `amx`, `avx512-bf16` or
    /// `emulated`, f32 kernels on rounded operands).
    #[serde(default)]
    pub bf16_path: String,
    /// The operating system.
    pub os: String,
}

impl Environment {
    /// This machine's environment.
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let simd = field("flags")
            .split_whitespace()
            .filter(|f| {
                f.starts_with("avx") || f.starts_with("sse") || *f == "fma" || f.starts_with("amx")
            })
            .map(str::to_string)
            .collect();
        let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let pretty = os_release
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        Self {
            mopt_version: env!("CARGO_PKG_VERSION").into(),
            burn_version: "0.22.1".into(),
            cpu_model: {
                let m = field("model name");
                if m.is_empty() {
                    std::env::consts::ARCH.to_string()
                } else {
                    m
                }
            },
            simd,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: rayon::current_num_threads(),
            gemm_path: mopt_kernels::gemm::path().into(),
            bf16_path: mopt_kernels::bf16::path().into(),
            os: format!("{pretty} ({})", std::env::consts::ARCH),
        }
    }
}
