//! Snapshots of the CUDA C the cuda backend makes of the same kernels as
//! `snapshots.rs` (broadcast add, strided exp, softmax row sum, the one-pass
//! log-sum-exp and Welford moments), and of a rank-1 contiguous f16 kernel
//! (half loads and stores, the vector path).
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
        rows: None,
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

/// out = f16(f32(x) * y + s0), x and out f16, y f32, rank 1, all contiguous:
/// as the frontend builds a half op (widen, compute in f32, round once).
fn half_axpy() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F16);
    let x = b.cast(x, DType::F32);
    let y = b.load(2, DType::F32);
    let s = b.scalar(0, DType::F32);
    let m = b.binary(BinaryOp::Mul, x, y, DType::F32);
    let a = b.binary(BinaryOp::Add, m, s, DType::F32);
    let h = b.cast(a, DType::F16);
    let ops = vec![
        op(DType::F16, Inner::Contiguous),
        op(DType::F16, Inner::Contiguous),
        op(DType::F32, Inner::Contiguous),
    ];
    let mut k = kernel("axpy.f16", ops, b, h);
    k.rank = 1;
    k.scalars = vec![DType::F32];
    k
}

#[test]
fn half_axpy_cuda() {
    insta::assert_snapshot!("half_axpy_cuda", cuda_source(&half_axpy()).unwrap());
}

#[test]
fn vector_path_only_for_rank1_contiguous_pointwise() {
    use kiln_codegen::cuda::vector_width;
    assert_eq!(vector_width(&half_axpy()), Some(4));
    assert!(cuda_source(&half_axpy()).unwrap().contains("nvec"));
    let mut k = half_axpy();
    k.operands[2].inner = Inner::Broadcast;
    assert_eq!(vector_width(&k), None);
    assert!(!cuda_source(&k).unwrap().contains("nvec"));
    for k in [broadcast_add(), strided_exp(), softmax_sum(), softmax_lse()] {
        assert_eq!(vector_width(&k), None, "{}", k.name);
        assert!(!cuda_source(&k).unwrap().contains("kiln_vec"), "{}", k.name);
    }
}

#[test]
fn half_helpers_only_when_used() {
    let f32_src = cuda_source(&broadcast_add()).unwrap();
    assert!(!f32_src.contains("kiln_f16") && !f32_src.contains("kiln_f32_to"));
    let src = cuda_source(&half_axpy()).unwrap();
    assert!(src.contains("kiln_f16_to_f32") && !src.contains("kiln_bf16"));
    assert!(
        src.contains("const unsigned short* __restrict__ p1"),
        "{src}"
    );
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
        half_axpy(),
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
