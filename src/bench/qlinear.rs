//! QLINEAR: a dynamically quantized int8 Linear against the f32 Linear at
//! (256 x 1024) @ (1024 x 1024)^T + bias, eager and compiled (one
//! `quantized_linear` kernel), timed in turn in the same run.

use super::{randn, Row};
use crate::quantization::{Isa, QScheme, QuantizedLinear};
use crate::{Device, Result};
use std::time::Instant;

/// Rows `QLINEAR`/`f32`, `int8` and `int8-compiled` (GFLOP/s counts 2·M·N·K).
pub fn qlinear_rows(iters: usize) -> Result<Vec<Row>> {
    let (m, k, n) = (256usize, 1024usize, 1024usize);
    let x = randn(&[m, k], 41);
    let w = randn(&[n, k], 42).mul(&crate::Tensor::scalar(0.03f32))?;
    let b = randn(&[n], 43);
    let q = QuantizedLinear::from_float(&w, Some(&b), QScheme::PerTensor)?;
    let isa = Isa::detect();
    let _g = crate::autograd::no_grad();
    let f32_run = || crate::functional::linear(&x, &w, Some(&b)).map(std::hint::black_box);
    let int8_run = || q.forward_with(&x, isa).map(std::hint::black_box);
    let compiled = crate::compile::compile(&q);
    let compiled_run = || compiled.forward(&x).map(std::hint::black_box);
    for _ in 0..2 {
        f32_run()?;
        int8_run()?;
        compiled_run()?;
    }
    // take turns so drifting machine load hits all three alike
    let (mut tf, mut tq, mut tc) = (vec![], vec![], vec![]);
    let time = |f: &dyn Fn() -> Result<crate::Tensor>, v: &mut Vec<f64>| -> Result<()> {
        let s = Instant::now();
        f()?;
        v.push(s.elapsed().as_secs_f64() * 1e3);
        Ok(())
    };
    for _ in 0..iters.max(1) {
        time(&f32_run, &mut tf)?;
        time(&int8_run, &mut tq)?;
        time(&compiled_run, &mut tc)?;
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        v[v.len() / 2]
    };
    let (mf, mq, mc) = (med(tf), med(tq), med(tc));
    let flops = 2.0 * (m * n * k) as f64;
    let row = |mode: &str, ms: f64, what: String| Row {
        workload: "QLINEAR".into(),
        mode: mode.into(),
        what,
        median_ms: ms,
        unit: "gflops",
        rate: flops / (ms * 1e-3) / 1e9,
        compile_ms: None,
        device: Device::Cpu,
        max_diff: None,
        peak_bytes: None,
    };
    Ok(vec![
        row(
            "f32",
            mf,
            format!("linear f32 ({m}x{k}) @ ({k}x{n})^T + bias"),
        ),
        row(
            "int8",
            mq,
            format!(
                "dynamic int8 ({}), {:.2}x f32 (target >= 1.3x on AVX2, >= 2x with VNNI)",
                isa.name(),
                mf / mq
            ),
        ),
        row(
            "int8-compiled",
            mc,
            format!(
                "compile(QuantizedLinear): one quantized_linear kernel, {:.2}x f32",
                mf / mc
            ),
        ),
    ])
}
