//! `kiln doctor`: checks an installation in three layers — the device is
//! visible, a real kernel runs and gives the right numbers, and the fast
//! code path is the one in use — and ends with one verdict per backend.
//!
//! ```text
//! cpu: ok (avx2)
//! cuda: unavailable (no libcuda.so.1 found)
//! ```
//!
//! Each backend runs a 1000x1000 f32 matmul (checked against an f64 dot
//! product at 64 sampled entries) and a compiled pointwise chain that must
//! come out as one fused kernel (checked element by element against the
//! same formula on the host). `KILN_CUDA=emulator` checks the CUDA path on
//! the CPU emulator (a smaller matmul: the emulator runs CUDA C threads one
//! by one).

use crate::compile::compile_fn;
use crate::cuda::nvrtc::{nvrtc_version, KernelCache};
use crate::{Device, Tensor};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One backend's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Works; the detail names the code path (`avx2`, `sm_90`, `emulator`).
    Ok(String),
    /// Not there at all (no library, no device): the reason.
    Unavailable(String),
    /// There, but a check failed: what failed.
    Failed(String),
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok(_))
    }

    /// `ok (avx2)`, `unavailable (no libcuda.so.1 found)`, `FAILED (...)`.
    pub fn line(&self) -> String {
        match self {
            Verdict::Ok(d) => format!("ok ({d})"),
            Verdict::Unavailable(d) => format!("unavailable ({d})"),
            Verdict::Failed(d) => format!("FAILED ({d})"),
        }
    }
}

/// The whole report: its text and the verdict of each backend.
pub struct Report {
    pub text: String,
    pub cpu: Verdict,
    pub cuda: Verdict,
}

impl Report {
    /// The verdict of `backend` (`cpu` or `cuda`), if it is one.
    pub fn verdict(&self, backend: &str) -> Option<&Verdict> {
        match backend {
            "cpu" => Some(&self.cpu),
            "cuda" => Some(&self.cuda),
            _ => None,
        }
    }
}

/// The ISA flags that matter to kiln, as `/proc/cpuinfo` spells them.
const ISA_FLAGS: [(&str, &str); 9] = [
    ("sse4_2", "SSE4.2"),
    ("avx", "AVX"),
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512F"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("amx_tile", "AMX"),
];

/// The CPU's model name and flags (Linux's `/proc/cpuinfo`; empty elsewhere).
fn cpuinfo() -> (String, Vec<String>) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let flags = field("flags")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (model, flags)
}

/// The GEMM path the `gemm` crate picks at run time (built with `x86-v4`)
/// and its short name for the verdict.
fn gemm_path(has: &dyn Fn(&str) -> bool) -> (&'static str, &'static str) {
    if has("avx512f") {
        ("AVX-512 kernels (gemm x86-v4)", "avx512")
    } else if has("avx2") && has("fma") {
        ("AVX2+FMA kernels (gemm x86-v3)", "avx2")
    } else {
        ("SSE/scalar kernels", "sse")
    }
}

fn dir_size(dir: &Path) -> (usize, u64) {
    let mut files = 0;
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => {
                    files += 1;
                    bytes += m.len();
                }
                Err(_) => {}
            }
        }
    }
    (files, bytes)
}

fn describe_dir(dir: Option<PathBuf>) -> String {
    match dir {
        None => "off".into(),
        Some(d) if !d.exists() => format!("{} (not created yet)", d.display()),
        Some(d) => {
            let (n, b) = dir_size(&d);
            format!(
                "{} ({n} files, {})",
                d.display(),
                crate::memory::format_bytes(b as usize)
            )
        }
    }
}

/// Deterministic data in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `n x n` matmul on `dev`, checked at 64 sampled entries against f64
/// dot products; returns GFLOP/s of the timed (second) run.
fn check_matmul(dev: Device, n: usize) -> std::result::Result<f64, String> {
    let (a, b) = (data(n * n, 1), data(n * n, 2));
    let err = |e: crate::Error| e.to_string();
    let ta = Tensor::from_vec(a.clone(), &[n, n])
        .map_err(err)?
        .to_device(dev)
        .map_err(err)?;
    let tb = Tensor::from_vec(b.clone(), &[n, n])
        .map_err(err)?
        .to_device(dev)
        .map_err(err)?;
    let _warm = crate::functional::matmul(&ta, &tb)
        .map_err(err)?
        .to_device(Device::Cpu)
        .map_err(err)?;
    let t = Instant::now();
    let c = crate::functional::matmul(&ta, &tb)
        .map_err(err)?
        .to_device(Device::Cpu)
        .map_err(err)?;
    let secs = t.elapsed().as_secs_f64();
    let c = c.to_vec::<f32>().map_err(err)?;
    let idx = data(128, 3);
    for k in 0..64 {
        let i = ((idx[2 * k] + 1.0) / 2.0 * n as f32) as usize % n;
        let j = ((idx[2 * k + 1] + 1.0) / 2.0 * n as f32) as usize % n;
        let want: f64 = (0..n)
            .map(|l| a[i * n + l] as f64 * b[l * n + j] as f64)
            .sum();
        let got = c[i * n + j] as f64;
        // f32 accumulation over n terms of size <= 1
        let tol = 1e-4 * (n as f64).sqrt() * 4.0 + 1e-5 * want.abs();
        if (got - want).abs() > tol {
            return Err(format!(
                "matmul {n}x{n}: C[{i}, {j}] = {got}, expected {want} (tolerance {tol:.1e})"
            ));
        }
    }
    Ok(2.0 * (n as f64).powi(3) / secs / 1e9)
}

/// `relu(x * 2 + 1) - x` compiled: must run as one fused kernel and match
/// the host formula exactly (each step is exactly rounded in f32).
fn check_fused(dev: Device) -> std::result::Result<String, String> {
    let err = |e: crate::Error| e.to_string();
    let n = 4096;
    let x = data(n, 4);
    let tx = Tensor::from_vec(x.clone(), &[n])
        .map_err(err)?
        .to_device(dev)
        .map_err(err)?;
    let f = compile_fn("doctor_fused", |xs: &[Tensor]| {
        let x = &xs[0];
        let y = x
            .mul(&Tensor::scalar(2.0f32))?
            .add(&Tensor::scalar(1.0f32))?
            .relu()?
            .sub(x)?;
        Ok(vec![y])
    });
    let y = f.call(std::slice::from_ref(&tx)).map_err(err)?;
    let got = y[0]
        .to_device(Device::Cpu)
        .map_err(err)?
        .to_vec::<f32>()
        .map_err(err)?;
    for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
        let want = (v * 2.0 + 1.0).max(0.0) - v;
        if (g - want).abs() > 1e-6 {
            return Err(format!("fused kernel: y[{i}] = {g}, expected {want}"));
        }
    }
    let rep = f.explain();
    let kernels: Vec<String> = rep.entries.iter().flat_map(|e| e.kernels.clone()).collect();
    if kernels.len() != 1 {
        return Err(format!(
            "fused kernel: expected 1 kernel for mul+add+relu+sub, got {}: {kernels:?}",
            kernels.len()
        ));
    }
    Ok(kernels[0].clone())
}

/// Runs every check and builds the report.
pub fn run() -> Report {
    let mut t = String::new();
    let w = &mut t;
    let _ = writeln!(
        w,
        "kiln {} ({} build, {} {})",
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::env::consts::ARCH,
        std::env::consts::OS
    );
    let _ = writeln!(
        w,
        "  backends built in: cpu (Cranelift JIT, gemm), cuda (cudarc, libraries loaded at run time)"
    );
    let cpu = cpu_section(w);
    let cuda = cuda_section(w);
    let _ = writeln!(w, "cache directories:");
    let _ = writeln!(
        w,
        "  compile plans: {}",
        describe_dir(crate::compile::plan_cache_dir())
    );
    let _ = writeln!(
        w,
        "  NVRTC cubins:  {}",
        describe_dir(KernelCache::global().dir().map(Path::to_path_buf))
    );
    let _ = writeln!(w, "cpu: {}", cpu.line());
    let _ = writeln!(w, "cuda: {}", cuda.line());
    Report { text: t, cpu, cuda }
}

fn cpu_section(w: &mut String) -> Verdict {
    let (model, flags) = cpuinfo();
    let has = |f: &str| flags.iter().any(|x| x == f);
    let isa: Vec<&str> = ISA_FLAGS
        .iter()
        .filter(|(f, _)| has(f))
        .map(|(_, n)| *n)
        .collect();
    let missing: Vec<&str> = ISA_FLAGS
        .iter()
        .filter(|(f, _)| !has(f))
        .map(|(_, n)| *n)
        .collect();
    let (gemm, short) = gemm_path(&has);
    let _ = writeln!(w, "cpu: {model}");
    let _ = writeln!(w, "  ISA: {}", isa.join(", "));
    if !missing.is_empty() {
        let _ = writeln!(w, "  not present: {}", missing.join(", "));
    }
    let _ = writeln!(
        w,
        "  code paths: matmul/conv {gemm}; JIT kernels Cranelift f32x4 (128-bit{})",
        if has("avx") { ", VEX-encoded" } else { "" }
    );
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let _ = writeln!(w, "  threads: {threads} (RAYON_NUM_THREADS overrides)");
    let _ = writeln!(
        w,
        "  deterministic algorithms: {}",
        if crate::are_deterministic_algorithms_enabled() {
            "on"
        } else {
            "off"
        }
    );
    let mm = check_matmul(Device::Cpu, 1000);
    let fused = check_fused(Device::Cpu);
    report_checks(w, "cpu", 1000, &mm, &fused);
    match (mm, fused) {
        (Ok(_), Ok(_)) => Verdict::Ok(short.into()),
        (Err(e), _) | (_, Err(e)) => Verdict::Failed(e),
    }
}

fn report_checks(
    w: &mut String,
    name: &str,
    n: usize,
    mm: &std::result::Result<f64, String>,
    fused: &std::result::Result<String, String>,
) {
    match mm {
        Ok(g) => writeln!(w, "  {name} matmul {n}x{n}: correct, {g:.1} GFLOP/s"),
        Err(e) => writeln!(w, "  {name} matmul: WRONG: {e}"),
    }
    .ok();
    match fused {
        Ok(k) => writeln!(w, "  {name} fused kernel: correct, one kernel {k}"),
        Err(e) => writeln!(w, "  {name} fused kernel: WRONG: {e}"),
    }
    .ok();
}

fn cuda_section(w: &mut String) -> Verdict {
    let emulated = std::env::var("KILN_CUDA").as_deref() == Ok("emulator");
    let _ = writeln!(w, "cuda:");
    let driver = crate::cuda::driver_present();
    let nvrtc = nvrtc_version();
    if emulated {
        let _ = writeln!(w, "  KILN_CUDA=emulator: devices are the CPU emulator");
    } else {
        let _ = writeln!(
            w,
            "  driver: {}",
            match driver_version() {
                Some(v) => format!("libcuda loaded, CUDA {v}"),
                None if driver => "libcuda loaded, version unknown".into(),
                None => "not found (no libcuda.so.1)".into(),
            }
        );
    }
    let _ = writeln!(
        w,
        "  NVRTC: {}",
        match &nvrtc {
            Ok((a, b)) => format!("{a}.{b}"),
            Err(_) => "not found (no libnvrtc.so)".into(),
        }
    );
    if !emulated && !driver {
        return Verdict::Unavailable("no libcuda.so.1 found".into());
    }
    let dev = match crate::runtime::cuda::gpu(0) {
        Ok(g) => g,
        Err(e) => {
            let msg = e.to_string();
            let _ = writeln!(w, "  cuda:0: {msg}");
            return Verdict::Unavailable(msg.trim_start_matches("cuda: ").to_string());
        }
    };
    let mut short = "emulator".to_string();
    if !emulated {
        for line in device_lines() {
            let _ = writeln!(w, "  {line}");
        }
        if let Ok(d) = crate::runtime::cuda::open_driver(0) {
            let (a, b) = d.compute_capability;
            short = format!("sm_{a}{b}");
            let cache = KernelCache::global();
            let cubins = cache.dir().map_or(0, |dir| {
                std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .ends_with(&format!("_sm{a}{b}.cubin"))
                    })
                    .count()
            });
            let _ = writeln!(w, "  NVRTC disk cache: {cubins} cubins for sm_{a}{b}");
        }
    } else {
        let _ = writeln!(w, "  cuda:0: {}", dev.describe());
    }
    let before = KernelCache::global().stats();
    let n = if emulated { 96 } else { 1000 };
    let mm = check_matmul(Device::Cuda(0), n);
    let fused = check_fused(Device::Cuda(0));
    report_checks(w, "cuda:0", n, &mm, &fused);
    if !emulated {
        let after = KernelCache::global().stats();
        let (disk, compiled) = (
            after.disk_hits - before.disk_hits,
            after.compiles - before.compiles,
        );
        let warm = if compiled == 0 {
            "warm"
        } else if disk == 0 {
            "cold"
        } else {
            "partly warm"
        };
        let _ = writeln!(
            w,
            "  NVRTC disk cache {warm}: {disk} kernels read from disk, {compiled} compiled"
        );
    }
    match (mm, fused) {
        (Ok(_), Ok(_)) => Verdict::Ok(short),
        (Err(e), _) | (_, Err(e)) => Verdict::Failed(e),
    }
}

/// The CUDA version the driver supports, when libcuda loads.
fn driver_version() -> Option<String> {
    crate::runtime::cuda::info::driver_version().map(|(a, b)| format!("{a}.{b}"))
}

/// `cuda:N: NAME, X GiB, compute capability a.b` for every device.
fn device_lines() -> Vec<String> {
    match crate::runtime::cuda::info::devices() {
        Ok(ds) => std::iter::once(format!("devices: {}", ds.len()))
            .chain(ds.iter().map(|d| {
                format!(
                    "cuda:{}: {}, {}, compute capability {}.{}",
                    d.ordinal,
                    d.name,
                    crate::memory::format_bytes(d.total_memory),
                    d.compute_capability.0,
                    d.compute_capability.1
                )
            }))
            .collect(),
        Err(e) => vec![format!("devices: {e}")],
    }
}
