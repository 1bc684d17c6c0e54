//! `kiln bench --device cuda[:N]` (and `--quick`): the inference workloads
//! W1-W4 and W7 with their inputs and weights on one device, eager and
//! compiled, the clock read after the device finished. Beside the timings it
//! checks that compiled and eager outputs agree, lists any ops that ran on
//! the host between two copies (which a reader of GPU timings needs to
//! know), and times `compile()` of the small CNN to its first output.
//!
//! W5/W6 (training steps), W2F, W8 (host copy bandwidth) and the digits
//! models stay CPU-only: asked for on a device they are listed as skipped.

use super::{measure_on, modes, traced, Mode, Row};
use super::{w1_at, w2_at, w3_at, w4_at, w7_at, Size, Workload};
use crate::{Device, Error, Result, Tensor};
use std::path::Path;

/// The workloads a device run times, in table order.
pub const DEVICE_WORKLOADS: [&str; 5] = ["W1", "W2", "W3", "W4", "W7"];

/// Compiled and eager outputs further apart than this (relative above 1,
/// absolute below) are reported as a mismatch.
pub const AGREE_TOL: f64 = 1e-4;

/// `cpu`, `cuda` (device 0) or `cuda:N`, opened (so a machine without the
/// device fails here, with the reason).
pub fn parse_device(s: &str) -> Result<Device> {
    let s = s.trim().to_ascii_lowercase();
    let bad = || {
        Error::op(
            "bench",
            format!("unknown device `{s}`: expected cpu, cuda or cuda:N"),
        )
    };
    match s.as_str() {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Device::cuda(0),
        _ => {
            let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
            Device::cuda(n.parse().map_err(|_| bad())?)
        }
    }
}

/// What a device run measured, and what it did not.
pub struct DeviceBench {
    pub device: Device,
    /// The device as its driver names it ("NVIDIA H200 (sm_90)", "CPU emulator ...").
    pub describe: String,
    pub size: Size,
    pub rows: Vec<Row>,
    /// Requested workloads that a device run does not time, with why.
    pub skipped: Vec<String>,
    /// Ops that ran on the host for device tensors, with counts (whole process).
    pub host_fallbacks: Vec<(&'static str, usize)>,
    /// Compile-to-first-output of the small CNN: [first, warm] (see `cnn_compile_ms`).
    pub cnn_compile_ms: [f64; 2],
}

fn make(name: &str, size: Size, dev: Device) -> Result<Workload> {
    match name {
        "W1" => w1_at(size, dev),
        "W2" => w2_at(size, dev),
        "W3" => w3_at(size, dev),
        "W4" => w4_at(size, dev),
        _ => w7_at(size, dev),
    }
}

/// Largest elementwise difference of two output lists, relative above 1.
fn max_diff(got: &[Tensor], want: &[Tensor]) -> Result<f64> {
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        if g.dims() != w.dims() {
            return Err(Error::op(
                "bench",
                format!("compiled output {:?} vs eager {:?}", g.dims(), w.dims()),
            ));
        }
        for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    Ok(worst)
}

/// Times the selected workloads of [`DEVICE_WORKLOADS`] (`only` empty: all)
/// on `device` at `size`, `iters` timed runs each. A compiled row carries
/// its largest difference from the eager outputs in `max_diff` (only when
/// both modes ran); a difference beyond [`AGREE_TOL`] is an error.
pub fn run_on(
    only: &[String],
    iters: usize,
    mode: Mode,
    size: Size,
    device: Device,
    profile_dir: Option<&Path>,
) -> Result<DeviceBench> {
    let want = |w: &str| only.is_empty() || only.iter().any(|o| o.eq_ignore_ascii_case(w));
    let skipped = only
        .iter()
        .filter(|o| !DEVICE_WORKLOADS.iter().any(|w| w.eq_ignore_ascii_case(o)))
        .map(|o| {
            let why = match o.to_ascii_uppercase().as_str() {
                "W5" | "W6" => "training steps are benchmarked on the CPU only",
                "W8" => "the host copy bandwidth reference has no device form",
                _ => "not a device workload (W1-W4, W7)",
            };
            format!("{o}: {why}; run it without --device/--quick")
        })
        .collect();
    let describe = match device {
        Device::Cpu => "host".to_string(),
        Device::Cuda(n) => crate::cuda::gpu(n)?.describe(),
    };
    let mut rows = vec![];
    for name in DEVICE_WORKLOADS.into_iter().filter(|w| want(w)) {
        let w = make(name, size, device)?;
        let mut eager: Option<Vec<Tensor>> = None;
        for compiled in modes(mode) {
            let mut outs = None;
            let mut r = traced(profile_dir, name, || {
                let (r, o) = measure_on(&w, compiled, iters, device)?;
                outs = Some(o);
                Ok(vec![r])
            })?;
            let outs = outs.unwrap_or_default();
            if let (true, Some(e)) = (compiled, &eager) {
                let d = max_diff(&outs, e)?;
                if d > AGREE_TOL {
                    return Err(Error::op(
                        "bench",
                        format!("{name} on {device}: compiled differs from eager by {d:e}"),
                    ));
                }
                r[0].max_diff = Some(d);
            }
            if !compiled {
                eager = Some(outs);
            }
            rows.extend(r);
        }
    }
    Ok(DeviceBench {
        device,
        describe,
        size,
        rows,
        skipped,
        host_fallbacks: crate::host_fallbacks(),
        cnn_compile_ms: cnn_compile_ms(device, size)?,
    })
}

/// Milliseconds from `compile()` of the small CNN (eval mode, a 64-image
/// batch on `device`, 4 at quick sizes) to its first output on the host: first in this
/// process (kernels from the disk cache, or NVRTC when it is cold), then
/// for a second `compile()` of the same model (warm: every kernel cached).
fn cnn_compile_ms(device: Device, size: Size) -> Result<[f64; 2]> {
    use crate::nn::ModuleExt;
    let mut m = super::train::small_cnn()?;
    m.to_device(device)?;
    m.eval();
    let x = super::randn(&[size.pick(64, 4), 1, 8, 8], 7).to_device(device)?;
    let _ng = crate::autograd::no_grad();
    let once = || -> Result<f64> {
        let t = std::time::Instant::now();
        let c = crate::compile::compile(&m);
        let y = c.forward(&x)?;
        device.synchronize()?;
        drop(y.to_f64_vec());
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    Ok([once()?, once()?])
}

impl DeviceBench {
    /// The table of the CPU bench, under a line naming the device, and
    /// notes: compiled-vs-eager agreement, host fallbacks, skipped workloads.
    pub fn report(&self) -> String {
        let sizes = match self.size {
            Size::Full => "WORKLOADS.md sizes",
            Size::Quick => "quick sizes",
        };
        let mut s = format!("device: {}", self.device);
        if self.device.is_cuda() {
            s += &format!(" ({})", self.describe);
        }
        s += &format!(", {sizes}\n{}", super::table(&self.rows));
        let agree: Vec<String> = self
            .rows
            .iter()
            .filter_map(|r| r.max_diff.map(|d| format!("{} {d:.1e}", r.workload)))
            .collect();
        if !agree.is_empty() {
            s += &format!("compiled vs eager max diff: {}\n", agree.join(", "));
        }
        if self.device.is_cuda() {
            let fb: Vec<String> = self
                .host_fallbacks
                .iter()
                .map(|(op, n)| format!("{op} x{n}"))
                .collect();
            let fb = if fb.is_empty() {
                "none".to_string()
            } else {
                fb.join(", ")
            };
            s += &format!("ran on the host between copies: {fb}\n");
        }
        let [first, warm] = self.cnn_compile_ms;
        s += &format!(
            "compile() to first output, small CNN: {first:.1} ms first, {warm:.1} ms warm (kernels cached)\n"
        );
        for k in &self.skipped {
            s += &format!("skipped {k}\n");
        }
        s
    }
}
