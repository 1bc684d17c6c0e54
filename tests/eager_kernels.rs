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

/// softmax over rows: amax; exp(x - max) stored once (exp is the costly part);
/// its sum; the division.
#[test]
fn softmax_rows() {
    let x = Tensor::full(&[8, 16], 1.0, DType::F32);
    insta::assert_snapshot!(kernels_text(|| drop(x.softmax(-1).unwrap())));
}
