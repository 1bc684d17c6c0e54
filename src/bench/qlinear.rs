//! QLINEAR: a dynamically quantized int8 Linear against the f32 Linear at
//! (256 x 1024) @ (1024 x 1024)^T + bias, timed alternately in the same run.

use super::{randn, Row};
use crate::quantization::{Isa, QScheme, QuantizedLinear};
use crate::{Device, Result};
use std::time::Instant;

/// Rows `QLINEAR`/`f32` and `QLINEAR`/`int8` (GFLOP/s counts 2·M·N·K).
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
    for _ in 0..2 {
        f32_run()?;
        int8_run()?;
    }
    // alternate the two so drifting machine load hits both alike
    let (mut tf, mut tq) = (vec![], vec![]);
    for _ in 0..iters.max(1) {
        let s = Instant::now();
        f32_run()?;
        tf.push(s.elapsed().as_secs_f64() * 1e3);
        let s = Instant::now();
        int8_run()?;
        tq.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        v[v.len() / 2]
    };
    let (mf, mq) = (med(tf), med(tq));
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
    ])
}
