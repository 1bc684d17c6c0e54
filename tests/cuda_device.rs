//! Every forward case of the PyTorch fixtures on a CUDA device: the stored
//! inputs moved there (views taken there), the op run there — every
//! pointwise op and reduction as generated CUDA C launched with a grid and a
//! block — and the outputs compared, after the copy back, under the
//! manifest's tolerances. Eagerly (`cuda-shim SUITE: P/T`) and through
//! `compile()` (`cuda-shim compiled SUITE: P/T`).
//!
//! Without a GPU the device is the emulator (`kiln::cuda::use_emulator`): the
//! same CUDA C compiled by `c++` against the shim header and run on the CPU.
//! With `KILN_CUDA=driver` (scripts/gpu-check.sh on the GPU machine) it is the
//! real device and the lines read `cuda SUITE: P/T`. Ops with no device
//! kernel yet (GEMM, convolution, pooling, embedding, gather) run on the host
//! between two copies; the test lists them.

mod fixture_support;

use fixture_support::{compare, load_suite, Case, Fixtures};
use kiln::{DType, Device, Tensor};
use std::io::Write;

const FORWARD_SUITES: [&str; 11] = [
    "ops_unary",
    "ops_binary",
    "reduce",
    "views",
    "matmul",
    "conv",
    "pool",
    "norm",
    "loss",
    "embedding",
    "half",
];

/// The device under test and its label in the summary lines.
fn device() -> Option<(Device, &'static str)> {
    let real = std::env::var("KILN_CUDA").as_deref() == Ok("driver");
    if !real {
        if !kiln_codegen_present() {
            return None;
        }
        kiln::cuda::use_emulator();
    }
    let d = Device::cuda(0).unwrap_or_else(|e| panic!("{e}"));
    Some((d, if real { "cuda" } else { "cuda-shim" }))
}

/// The emulator needs a C++ compiler; without one the test says so and passes.
fn kiln_codegen_present() -> bool {
    let ok = std::process::Command::new("c++")
        .arg("--version")
        .output()
        .is_ok();
    if !ok {
        let _ = writeln!(
            std::io::stderr(),
            "cuda-shim: no c++ compiler found, skipped"
        );
    }
    ok
}

/// The view-of-a-transpose error case, on the device.
fn expect_error(dev: Device) -> Result<(), String> {
    let x = Tensor::zeros(&[4, 6], DType::F32)
        .to_device(dev)
        .map_err(|e| e.to_string())?;
    match x.t().and_then(|t| t.view_as_shape(&[-1])) {
        Err(e) if e.to_string().contains("reshape") => Ok(()),
        Err(e) => Err(format!("error does not suggest reshape: {e}")),
        Ok(_) => Err("view of a transpose succeeded".into()),
    }
}

fn run_case(fx: &Fixtures, c: &Case, dev: Device, compiled: bool) -> Result<(), String> {
    if c.expect_error {
        return expect_error(dev);
    }
    let inputs = fx.inputs_on(c, dev)?;
    let outs = if compiled {
        let f = kiln::compile::compile_fn(&c.op, |xs: &[Tensor]| fixture_support::ops::run(c, xs));
        let outs = f
            .call(&inputs)
            .map_err(|e| format!("kiln compile error: {e}"))?;
        if let Some(b) = f
            .explain()
            .entries
            .first()
            .and_then(|e| e.graph_break.clone())
        {
            return Err(format!("did not compile: {b}"));
        }
        outs
    } else {
        fixture_support::ops::run(c, &inputs).map_err(|e| format!("kiln error: {e}"))?
    };
    if outs.len() != c.outputs.len() {
        return Err(format!(
            "{} outputs, expected {}",
            outs.len(),
            c.outputs.len()
        ));
    }
    for (k, (got, name)) in outs.iter().zip(&c.outputs).enumerate() {
        if got.device() != dev {
            return Err(format!("out{k} is on {}, expected {dev}", got.device()));
        }
        let want = fx.tensor(c, name)?;
        let host = got.to_device(Device::Cpu).map_err(|e| e.to_string())?;
        compare(&host, &want, c.rtol, c.atol).map_err(|e| format!("out{k}: {e}"))?;
        if let Some(v) = c.views.get(k) {
            fixture_support::check_view(got, v, &inputs).map_err(|e| format!("out{k}: {e}"))?;
        }
    }
    Ok(())
}

/// Compiles the kernels the CPU launches for the suites in one batch, so the
/// emulator does not run `c++` once per kernel (misses still compile alone).
fn prepare(fx: &Fixtures) {
    let ((), kernels) = kiln_runtime::record_kernels(|| {
        for suite in FORWARD_SUITES {
            for c in load_suite(fx, suite).iter().filter(|c| !c.expect_error) {
                if let Ok(inputs) = fx.inputs(c) {
                    let _ = fixture_support::ops::run(c, &inputs);
                }
            }
        }
    });
    kiln::cuda::gpu(0)
        .and_then(|g| g.prepare(&kernels))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn forward_fixtures_on_cuda() {
    let Some((dev, label)) = device() else { return };
    let fx = Fixtures::load();
    prepare(&fx);
    let mut failed = vec![];
    let mut summary = vec![];
    for compiled in [false, true] {
        let label = if compiled {
            format!("{label} compiled")
        } else {
            label.to_string()
        };
        for suite in FORWARD_SUITES {
            let cases = load_suite(&fx, suite);
            let mut pass = 0;
            for c in &cases {
                match run_case(&fx, c, dev, compiled) {
                    Ok(()) => pass += 1,
                    Err(e) => failed.push(format!("{label} {suite}/{}: {e}", c.case)),
                }
            }
            summary.push(format!("{label} {suite}: {pass}/{}", cases.len()));
        }
    }
    let fallbacks: Vec<String> = kiln::host_fallbacks()
        .iter()
        .map(|(op, n)| format!("{op} x{n}"))
        .collect();
    summary.push(format!("{label} host fallbacks: {}", fallbacks.join(", ")));
    let mut err = std::io::stderr();
    for line in summary.iter().chain(failed.iter()) {
        let _ = writeln!(err, "{line}");
    }
    assert!(
        failed.is_empty(),
        "{} cases failed on {dev}:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
