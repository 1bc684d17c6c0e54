//! Snapshots of the CUDA C the cuda backend makes of the same kernels as
//! `snapshots.rs` (broadcast add, strided exp, softmax row sum, the one-pass
//! log-sum-exp and Welford moments).
//! Regenerate with `INSTA_UPDATE=always cargo test -p kiln-codegen --test cuda_snapshots`.

use kiln_codegen::cuda::{cuda_kernel_name, cuda_source};
use kiln_codegen::{Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};

#[path = "online_kernels/mod.rs"]
mod online_kernels;

use online_kernels::{layer_norm_moments, softmax_lse};

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

fn kernel(name: &str, ops: Vec<Operand>, b: KernelBuilder, out: usize) -> Kernel {
    Kernel {
        name: name.into(),
        rank: 2,
        operands: ops,
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
        extra_out: vec![],
    }
}

/// out[i, j] = a[i, j] + b[i] (b broadcast along the inner dim).
fn broadcast_add() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let y = b.load(2, DType::F32);
    let z = b.binary(BinaryOp::Add, x, y, DType::F32);
    let ops = vec![
        op(DType::F32, Inner::Contiguous),
        op(DType::F32, Inner::Contiguous),
        op(DType::F32, Inner::Broadcast),
    ];
    kernel("add", ops, b, z)
}

/// out = exp(x) with x a permuted (transposed) view.
fn strided_exp() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let e = b.unary(UnaryOp::Exp, x, DType::F32);
    let ops = vec![
        op(DType::F32, Inner::Contiguous),
        op(DType::F32, Inner::Strided),
    ];
    kernel("exp", ops, b, e)
}

/// softmax's row sum: out[i] = sum_j exp(x[i, j] - m[i]).
fn softmax_sum() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let m = b.load(2, DType::F32);
    let d = b.binary(BinaryOp::Sub, x, m, DType::F32);
    let e = b.unary(UnaryOp::Exp, d, DType::F32);
    let n = b.instrs.len();
    let ops = vec![
        op(DType::F32, Inner::Broadcast),
        op(DType::F32, Inner::Contiguous),
        op(DType::F32, Inner::Broadcast),
    ];
    let mut k = kernel("softmax.sum", ops, b, n);
    k.reduce = Some(Reduction {
        kind: ReduceKind::Sum,
        value: e,
        dtype: DType::F32,
    });
    k.epilogue = vec![(Instr::Acc, DType::F32)];
    k
}

#[test]
fn broadcast_add_cuda() {
    insta::assert_snapshot!("broadcast_add_cuda", cuda_source(&broadcast_add()).unwrap());
}

#[test]
fn strided_exp_cuda() {
    insta::assert_snapshot!("strided_exp_cuda", cuda_source(&strided_exp()).unwrap());
}

#[test]
fn softmax_sum_cuda() {
    insta::assert_snapshot!("softmax_sum_cuda", cuda_source(&softmax_sum()).unwrap());
}

#[test]
fn softmax_lse_cuda() {
    insta::assert_snapshot!("softmax_lse_cuda", cuda_source(&softmax_lse()).unwrap());
}

#[test]
fn layer_norm_moments_cuda() {
    insta::assert_snapshot!(
        "layer_norm_moments_cuda",
        cuda_source(&layer_norm_moments()).unwrap()
    );
}

#[test]
fn cuda_source_is_deterministic_and_names_are_stable() {
    let ks = [
        broadcast_add(),
        strided_exp(),
        softmax_sum(),
        softmax_lse(),
        layer_norm_moments(),
    ];
    for k in ks {
        assert_eq!(cuda_source(&k).unwrap(), cuda_source(&k).unwrap());
        let name = cuda_kernel_name(&k);
        assert!(name.starts_with("kiln_") && name.len() > 16, "{name}");
        assert!(cuda_source(&k).unwrap().contains(&name));
    }
    assert_ne!(
        cuda_kernel_name(&broadcast_add()),
        cuda_kernel_name(&strided_exp())
    );
}

#[test]
fn malformed_kernel_is_an_error() {
    let mut k = strided_exp();
    k.body[0].0 = Instr::Load(7);
    let e = cuda_source(&k).unwrap_err().to_string();
    assert!(e.contains("loads operand 7"), "{e}");
}
