//! Snapshots of the kernels the eager path really launches (KernelIR text, as
//! specialised for launch). Reviewed by hand: see the comments on each.

use kiln::runtime::record_kernels;
use kiln::{DType, Tensor};

fn kernels_text(f: impl FnOnce()) -> String {
    let ((), ks) = record_kernels(f);
    ks.iter()
        .map(|k| k.to_text())
        .collect::<Vec<_>>()
        .join("\n")
}

/// [32,1] + [32]: rank 2, the first input broadcast along the inner dim.
#[test]
fn broadcast_add() {
    let a = Tensor::full(&[32, 1], 1.0, DType::F32);
    let b = Tensor::full(&[32], 2.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(a.add(&b).unwrap())));
}

/// exp of a permuted tensor: no copy, the input is read with strides.
#[test]
fn strided_unary() {
    let x = Tensor::full(&[4, 5, 6], 1.0, DType::F32)
        .permute(&[2, 0, 1])
        .unwrap();
    insta::assert_snapshot!(kernels_text(|| drop(x.exp().unwrap())));
}

/// softmax over rows: one kernel, the online log-sum-exp storing (shift,
/// logsum) per row to out0, and its row pass exp((x - shift) - logsum) to
/// out1, re-reading the reduction's own operand in2 (from cache).
#[test]
fn softmax_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(x.softmax(-1).unwrap())));
}

/// log_softmax: the same log-sum-exp pass, then (x - shift) - logsum.
#[test]
fn log_softmax_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(x.log_softmax(-1).unwrap())));
}

/// logsumexp: one kernel, the reduction's value (`acc`) stored directly.
#[test]
fn logsumexp_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(x.logsumexp(&[-1], false).unwrap())));
}

/// layer_norm with weight and bias: one Welford pass storing (mean, var,
/// rstd = rsqrt(var + eps)) per row, then (x - mean) * rstd * w + b.
#[test]
fn layer_norm_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    let (w, b) = (
        Tensor::full(&[16], 2.0, DType::F32),
        Tensor::full(&[16], 0.5, DType::F32),
    );
    let f = || drop(kiln::functional::layer_norm(&x, &[16], Some(&w), Some(&b), 1e-5).unwrap());
    insta::assert_snapshot!(kernels_text(f));
}

/// var (unbiased): one Welford pass, its biased variance rescaled by n / (n - 1).
#[test]
fn var_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(x.var(&[-1], 1.0, false).unwrap())));
}
