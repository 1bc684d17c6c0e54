//! The benchmark workloads of `../shared/bench/WORKLOADS.md`, timed in-process
//! (median of N samples after warm-up, as the PyTorch baseline script times them). Shared by `kiln bench` and `benches/`.

use crate::profiler;
use crate::{DType, Device, Result, Tensor};
use std::path::Path;
use std::time::Instant;

pub mod ddp;
pub mod device;
pub mod qlinear;
pub mod serve;
pub mod train;
pub mod vision;
mod workloads;
pub use device::{parse_device, run_on, DeviceBench, DEVICE_WORKLOADS};
pub use train::{gpt2, measure_train, w5, w6, TrainWorkload};
pub use workloads::{w1, w1_at, w2, w2_at, w2f, w3, w3_at, w4, w4_at, w7, w7_at};
pub use workloads::{Size, Workload, WorkloadFn};

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: String,
    pub mode: String,
    pub what: String,
    pub median_ms: f64,
    /// "gbps", "gflops" or "" (the unit of `rate`).
    pub unit: &'static str,
    pub rate: f64,
    /// Compiled rows: the first call (trace, passes, codegen, run).
    pub compile_ms: Option<f64>,
    /// Where the inputs and weights lived.
    pub device: Device,
    /// Compiled rows of a device run: the largest difference from the eager
    /// outputs (relative above 1, absolute below).
    pub max_diff: Option<f64>,
    /// CPU rows: the most bytes one more call held at once beyond what was
    /// live before it (`max_memory_allocated` after a reset; its outputs included).
    pub peak_bytes: Option<usize>,
}

impl Row {
    /// `{"workload":"W1","mode":"eager","median_ms":..,"gbps":..}`
    pub fn json(&self) -> String {
        let mut s = format!(
            "{{\"workload\":\"{}\",\"mode\":\"{}\",\"median_ms\":{:.4}",
            self.workload, self.mode, self.median_ms
        );
        if !self.unit.is_empty() {
            s += &format!(",\"{}\":{:.3}", self.unit, self.rate);
        }
        if let Some(c) = self.compile_ms {
            s += &format!(",\"compile_ms\":{c:.3}");
        }
        // CPU rows keep their old shape; device runs say where they ran
        if self.device != Device::Cpu {
            s += &format!(",\"device\":\"{}\"", self.device);
        }
        if let Some(d) = self.max_diff {
            s += &format!(",\"max_diff\":{d:e}");
        }
        if let Some(p) = self.peak_bytes {
            s += &format!(",\"peak_mb\":{:.3}", p as f64 / MIB);
        }
        s + "}"
    }
}

/// Deterministic pseudo-random normal-ish data (sum of uniforms), no RNG crate needed.
pub fn randn(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let v: Vec<f32> = (0..n)
        .map(|_| ((next() + next() + next() + next()) - 2.0) as f32 * 1.7)
        .collect();
    Tensor::from_vec(v, dims).expect("sized")
}

/// Shortest timed sample of [`time_ms`]: calls faster than this are timed
/// `k` back to back per sample, as `benches/torch_baseline.py` does, so a
/// sub-millisecond workload's median is not one call's luck on a busy machine.
const SAMPLE_MS: f64 = 50.0;

/// Median wall time per call of `f` in ms over `iters` samples after `warmup`
/// calls; a sample is `k` calls lasting at least [`SAMPLE_MS`] (`k` from one
/// more timed call), the same method as the PyTorch baseline script.
pub fn time_ms(iters: usize, warmup: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let s = Instant::now();
    f()?;
    let one = s.elapsed().as_secs_f64() * 1e3;
    let k = (SAMPLE_MS / one.max(1e-6)).ceil().max(1.0) as usize;
    sample_median_ms(iters, k, f)
}

/// Median over `iters` samples of the mean time per call of `k` back-to-back
/// calls. [`time_ms`] picks `k` per process, so ranks that must call in
/// step (DDP) use `k = 1`.
pub fn sample_median_ms(iters: usize, k: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let s = Instant::now();
        for _ in 0..k {
            f()?;
        }
        t.push(s.elapsed().as_secs_f64() * 1e3 / k as f64);
    }
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(t[t.len() / 2])
}

const MIB: f64 = 1024.0 * 1024.0;

fn row(w: &str, what: &str, ms: f64, unit: &'static str, amount: f64) -> Row {
    // amount: bytes for gbps, flops for gflops
    let rate = if unit.is_empty() {
        0.0
    } else {
        amount / (ms * 1e-3) / 1e9
    };
    Row {
        workload: w.into(),
        mode: "eager".into(),
        what: what.into(),
        median_ms: ms,
        unit,
        rate,
        compile_ms: None,
        device: Device::Cpu,
        max_diff: None,
        peak_bytes: None,
    }
}

/// Peak bytes held during one `f()` beyond what was live before it
/// (the runtime's `max_memory_allocated` after a reset).
pub fn peak_of(f: impl FnOnce() -> Result<Vec<Tensor>>) -> Result<usize> {
    use crate::memory;
    let base = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    let outs = f()?;
    let peak = memory::max_memory_allocated().saturating_sub(base);
    drop(outs);
    Ok(peak)
}

/// The digits CNN or MLP (`kiln train`'s models) in eval mode on a batch of 256.
pub fn model(kind: crate::train::ModelKind) -> Result<Workload> {
    model_at(kind, 256)
}

/// The digits CNN at batch 1 (`CNN-b1`): per-call overhead, eager vs compiled.
pub fn cnn_b1() -> Result<Workload> {
    let mut w = model_at(crate::train::ModelKind::Cnn, 1)?;
    w.name = "CNN-b1";
    Ok(w)
}

/// [`model`] on a batch of `batch`.
pub fn model_at(kind: crate::train::ModelKind, batch: usize) -> Result<Workload> {
    use crate::nn::{Module, ModuleExt};
    crate::manual_seed(0);
    let m = kind.build()?;
    m.eval();
    let name = match kind {
        crate::train::ModelKind::Cnn => "CNN",
        crate::train::ModelKind::Mlp => "MLP",
    };
    Ok(Workload {
        name,
        what: format!("digits model inference, batch {batch}"),
        unit: "",
        amount: 0.0,
        inputs: vec![randn(&[batch, 1, 8, 8], 17)],
        f: Box::new(move |t: &[Tensor]| Ok(vec![m.forward(&t[0])?])),
    })
}

/// The workload or model `name` (W1-W4, cnn, mlp).
pub fn workload(name: &str) -> Result<Workload> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "w1" => w1(),
        "w2" => w2(),
        "w3" => w3(),
        "w4" => w4(),
        "cnn" => model(crate::train::ModelKind::Cnn)?,
        "mlp" => model(crate::train::ModelKind::Mlp)?,
        other => {
            return Err(crate::Error::op(
                "dump",
                format!("unknown model `{other}`: expected cnn, mlp, W1, W2, W3 or W4"),
            ))
        }
    })
}

/// `kiln dump`: the text of compile `stage` for `name` (see [`workload`]).
/// `stage` `explain` prints `Compiled::explain()` instead.
pub fn dump(name: &str, stage: &str) -> Result<String> {
    let w = workload(name)?;
    let c = crate::compile::compile_fn(w.name, |t: &[Tensor]| (w.f)(t));
    if stage == "explain" {
        let _ng = crate::autograd::no_grad();
        c.call(&w.inputs)?;
        return Ok(c.explain().to_string());
    }
    c.dump(crate::compile::Stage::parse(stage)?, &w.inputs)
}

/// `kiln dump --train`: `stage` of the digits model `name` (cnn, mlp)
/// compiled for training (joint graph, forward and backward halves).
pub fn dump_train(name: &str, stage: &str) -> Result<String> {
    use crate::nn::ModuleExt;
    let kind = crate::train::ModelKind::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
        crate::Error::op(
            "dump",
            format!("--train needs a model (cnn or mlp), got `{name}`"),
        )
    })?;
    crate::manual_seed(0);
    let m = kind.build()?;
    m.train();
    let c = crate::compile::compile(&m);
    let x = [randn(&[256, 1, 8, 8], 17)];
    if stage == "explain" {
        c.dump_training(crate::compile::Stage::Graph, &x)?;
        return Ok(c.explain().to_string());
    }
    c.dump_training(crate::compile::Stage::parse(stage)?, &x)
}

/// Compile latency of a digits model (first call of a fresh `compile`, which
/// traces, runs the passes, compiles kernels and runs): `cold` in a process
/// that has compiled nothing (run it first; the plan disk cache is bypassed),
/// `warm` for a second `compile` of the same model (kernels in the in-memory
/// cache, plan from the disk cache). `median_ms` is the steady-state call.
pub fn compile_latency(kind: crate::train::ModelKind) -> Result<Vec<Row>> {
    let w = model(kind)?;
    let _ng = crate::autograd::no_grad();
    let mut rows = vec![];
    for mode in ["compile-cold", "compile-warm"] {
        let c = crate::compile::compile_fn(w.name, |t: &[Tensor]| (w.f)(t)).with_options(
            crate::compile::CompileOptions {
                disk_cache: mode == "compile-warm",
                ..Default::default()
            },
        );
        let s = Instant::now();
        c.call(&w.inputs)?;
        let first = s.elapsed().as_secs_f64() * 1e3;
        let ms = time_ms(20, 1, || {
            std::hint::black_box(c.call(&w.inputs)?);
            Ok(())
        })?;
        let mut r = row(w.name, "", ms, "", 0.0);
        r.mode = mode.into();
        r.compile_ms = Some(first);
        let report = c.explain();
        r.what = format!(
            "first call {first:.2} ms: {}",
            report.entries[0].times_line()
        );
        rows.push(r);
    }
    Ok(rows)
}

/// Times `w` eagerly, or compiled (the first call, which traces and compiles,
/// is reported as `compile_ms`).
pub fn measure(w: &Workload, compiled: bool, iters: usize) -> Result<Row> {
    measure_on(w, compiled, iters, Device::Cpu).map(|(r, _)| r)
}

/// [`measure`] for a workload whose tensors are on `device`: each timed run
/// ends with `device.synchronize()` (kernels on a GPU are queued, not done,
/// when the launch returns). Also returns the outputs of one more call, for
/// comparing compiled with eager.
pub fn measure_on(
    w: &Workload,
    compiled: bool,
    iters: usize,
    device: Device,
) -> Result<(Row, Vec<Tensor>)> {
    let _ng = crate::autograd::no_grad();
    let sync = || device.synchronize();
    let (ms, compile_ms, outs, peak) = if compiled {
        let c = crate::compile::compile_fn(w.name, |t: &[Tensor]| (w.f)(t));
        let s = Instant::now();
        c.call(&w.inputs)?;
        sync()?;
        let compile_ms = s.elapsed().as_secs_f64() * 1e3;
        let ms = time_ms(iters, 2, || {
            std::hint::black_box(c.call(&w.inputs)?);
            sync()
        })?;
        let peak = (device == Device::Cpu)
            .then(|| peak_of(|| c.call(&w.inputs)))
            .transpose()?;
        (ms, Some(compile_ms), c.call(&w.inputs)?, peak)
    } else {
        let ms = time_ms(iters, 2, || {
            std::hint::black_box((w.f)(&w.inputs)?);
            sync()
        })?;
        let peak = (device == Device::Cpu)
            .then(|| peak_of(|| (w.f)(&w.inputs)))
            .transpose()?;
        (ms, None, (w.f)(&w.inputs)?, peak)
    };
    let mut r = row(w.name, &w.what, ms, w.unit, w.amount);
    r.peak_bytes = peak;
    if compiled {
        r.mode = "compiled".into();
    }
    r.compile_ms = compile_ms;
    r.device = device;
    Ok((r, outs))
}

/// W8: copy bandwidth references — a copy moving W1's 64 MiB (32 MiB in, 32 MiB
/// out) and W8's 64M-float copy (512 MiB moved), those whose name `want`s.
pub fn w8(iters: usize, want: impl Fn(&str) -> bool) -> Result<Vec<Row>> {
    let mut rows = vec![];
    for (name, n, what) in [
        (
            "W8-64MiB",
            8 * 1024 * 1024,
            "copy 8M f32 (64 MiB moved, W1's traffic)",
        ),
        ("W8", 64 * 1024 * 1024, "copy 64M f32 (512 MiB moved)"),
    ] {
        if !want(name) {
            continue;
        }
        let x = Tensor::full(&[n], 1.0, DType::F32);
        let y = Tensor::zeros(&[n], DType::F32);
        let ms = time_ms(iters.min(10), 2, || y.copy_(&x))?;
        rows.push(row(name, what, ms, "gbps", 2.0 * 4.0 * n as f64));
    }
    Ok(rows)
}

/// Runs the selected workloads (`only` empty = all: W1-W8) with `iters` timed runs each.
pub fn run(only: &[String], iters: usize) -> Result<Vec<Row>> {
    run_profiled(only, iters, Mode::Both, None)
}

/// Which rows `kiln bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Eager,
    Compiled,
    Both,
}

fn modes(m: Mode) -> Vec<bool> {
    match m {
        Mode::Eager => vec![false],
        Mode::Compiled => vec![true],
        Mode::Both => vec![false, true],
    }
}

/// [`run`], and with `profile_dir` each workload (warm-up and timed runs) is
/// profiled into `DIR/W1.json`, ... (Chrome traces); the times then include
/// the profiler's small per-op cost.
pub fn run_profiled(
    only: &[String],
    iters: usize,
    mode: Mode,
    profile_dir: Option<&Path>,
) -> Result<Vec<Row>> {
    let want = |w: &str| only.is_empty() || only.iter().any(|o| o.eq_ignore_ascii_case(w));
    if let Some(d) = profile_dir {
        std::fs::create_dir_all(d).map_err(|e| crate::Error::Io {
            path: d.display().to_string(),
            msg: format!("cannot create the profile folder: {e}"),
        })?;
    }
    let mut rows = vec![];
    // DDP starts MPI ranks: only when asked for by name.
    if only.iter().any(|o| o.eq_ignore_ascii_case("DDP")) {
        if ddp::is_rank() {
            ddp::rank_main(iters, profile_dir)?;
            return Ok(rows);
        }
        rows.extend(ddp::bench(iters, profile_dir)?);
    }
    // `W8` names both copies; `W8-64MiB` the first alone (W1's floor)
    let copy = |name: &str| want("W8") || want(name);
    if copy("W8-64MiB") && mode != Mode::Compiled {
        rows.extend(traced(profile_dir, "W8", || w8(iters, copy))?);
    }
    type Make = fn() -> Workload;
    let table: [(&str, Make); 6] = [
        ("W1", w1),
        ("W2", w2),
        ("W2F", w2f),
        ("W3", w3),
        ("W4", w4),
        ("W7", w7),
    ];
    for (name, make) in table {
        if want(name) {
            let w = make();
            for c in modes(mode) {
                rows.extend(traced(profile_dir, name, || {
                    Ok(vec![measure(&w, c, iters)?])
                })?);
            }
        }
    }
    type MakeTrain = fn() -> TrainWorkload;
    let steps: [(&str, MakeTrain); 2] = [("W5", w5), ("W6", w6)];
    for (name, make) in steps {
        if want(name) {
            let w = make();
            for c in modes(mode) {
                rows.extend(traced(profile_dir, name, || {
                    Ok(vec![measure_train(&w, c, iters)?])
                })?);
            }
        }
    }
    for (name, kind) in [
        ("CNN", crate::train::ModelKind::Cnn),
        ("MLP", crate::train::ModelKind::Mlp),
    ] {
        if only.iter().any(|o| o.eq_ignore_ascii_case(name)) {
            let w = model(kind)?;
            for c in modes(mode) {
                rows.push(measure(&w, c, iters)?);
            }
        }
        if only
            .iter()
            .any(|o| o.eq_ignore_ascii_case(&format!("{name}-compile")))
        {
            rows.extend(compile_latency(kind)?);
        }
    }
    if only.iter().any(|o| o.eq_ignore_ascii_case("QLINEAR")) {
        rows.extend(qlinear::qlinear_rows(iters)?);
    }
    if only.iter().any(|o| o.eq_ignore_ascii_case("CNN-b1")) {
        let w = cnn_b1()?;
        for c in modes(mode) {
            rows.push(measure(&w, c, iters)?);
        }
    }
    // GPT2 is a heavy training step: only when named
    if only.iter().any(|o| o.eq_ignore_ascii_case("GPT2")) {
        let w = gpt2();
        for c in modes(mode) {
            rows.extend(traced(profile_dir, "GPT2", || {
                Ok(vec![measure_train(&w, c, iters.min(10))?])
            })?);
        }
    }
    for v in &vision::WORKLOADS {
        if only.iter().any(|o| o.eq_ignore_ascii_case(v.name)) {
            let w = v.workload()?;
            for c in modes(mode) {
                rows.extend(traced(profile_dir, v.name, || {
                    Ok(vec![measure(&w, c, iters.min(10))?])
                })?);
            }
        }
    }
    Ok(rows)
}

/// Runs `f`, profiled into `dir/{name}.json` when there is a `dir`.
fn traced(
    dir: Option<&Path>,
    name: &str,
    f: impl FnOnce() -> Result<Vec<Row>>,
) -> Result<Vec<Row>> {
    let Some(d) = dir else { return f() };
    let (rows, p) = profiler::profile(f);
    p.export_chrome_trace(d.join(format!("{name}.json")))?;
    rows
}

/// The human-readable table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<9} {:<8} {:>10} {:>12} {:>11}  {}\n",
        "workload", "mode", "median ms", "rate", "compile ms", "what"
    );
    for r in rows {
        let rate = match r.unit {
            "gbps" => format!("{:.1} GB/s", r.rate),
            "gflops" => format!("{:.1} GFLOP/s", r.rate),
            _ => String::new(),
        };
        let c = r.compile_ms.map(|c| format!("{c:.1}")).unwrap_or_default();
        let peak = r
            .peak_bytes
            .map(|p| format!(" (peak {:.2} MiB)", p as f64 / MIB))
            .unwrap_or_default();
        s += &format!(
            "{:<9} {:<8} {:>10.3} {:>12} {:>11}  {}{peak}\n",
            r.workload, r.mode, r.median_ms, rate, c, r.what
        );
    }
    s
}
