//! Deterministic mode (`kiln::use_deterministic_algorithms(true)`): conv2d's
//! weight and input gradients are bit-identical from run to run while
//! several threads share the work (the weight gradient's per-thread partial
//! sums are then added in a fixed order).

use kiln::functional as F;
use kiln::ir::op::conv::{ConvParams, Padding};
use kiln::Tensor;

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// `(x.grad, w.grad)` of `sum(conv2d(x, w) * r)` for fixed random tensors.
fn conv_grads() -> (Vec<u32>, Vec<u32>) {
    let x = kiln::bench::randn(&[16, 8, 20, 20], 1).requires_grad_(true);
    let w = kiln::bench::randn(&[16, 8, 3, 3], 2).requires_grad_(true);
    let p = ConvParams {
        padding: Padding::Explicit(vec![1]),
        ..Default::default()
    };
    let y = F::conv2d(&x, &w, None, &p).unwrap();
    let r = kiln::bench::randn(y.dims(), 3);
    y.mul(&r)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    (bits(&x.grad().unwrap()), bits(&w.grad().unwrap()))
}

#[test]
fn conv_gradients_are_bit_identical_with_several_threads() {
    kiln::use_deterministic_algorithms(true);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let first = pool.install(conv_grads);
    assert!(first.1.iter().any(|&b| b != 0), "a zero weight gradient");
    for run in 1..6 {
        let again = pool.install(conv_grads);
        assert!(again.0 == first.0, "run {run}: the input gradient differs");
        assert!(again.1 == first.1, "run {run}: the weight gradient differs");
    }
}
