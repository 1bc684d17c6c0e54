//! Snapshots of KernelIR text and the Cranelift IR the CPU backend makes of it.
//! Regenerate with `INSTA_UPDATE=always cargo test -p kiln-codegen --test snapshots`.

use kiln_codegen::cpu::CpuJit;
use kiln_codegen::{Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};

#[path = "online_kernels/mod.rs"]
mod online_kernels;

use online_kernels::{layer_norm_moments, softmax_lse};

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

/// out[i, j] = a[i, j] + b[i] (b broadcast along the inner dim).
fn broadcast_add() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let y = b.load(2, DType::F32);
    let z = b.binary(BinaryOp::Add, x, y, DType::F32);
    Kernel {
        name: "add".into(),
        rank: 2,
        operands: vec![
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Broadcast),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: z,
        extra_out: vec![],
        rows: None,
    }
}

/// out = exp(x) with x a permuted (transposed) view: scalar loop.
fn strided_exp() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let e = b.unary(UnaryOp::Exp, x, DType::F32);
    Kernel {
        name: "exp".into(),
        rank: 2,
        operands: vec![
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Strided),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: e,
        extra_out: vec![],
        rows: None,
    }
}

/// softmax's row sum: out[i] = sum_j exp(x[i, j] - m[i]), m the row max
/// (broadcast along the reduced dim).
fn softmax_sum() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let m = b.load(2, DType::F32);
    let d = b.binary(BinaryOp::Sub, x, m, DType::F32);
    let e = b.unary(UnaryOp::Exp, d, DType::F32);
    let n = b.instrs.len();
    Kernel {
        name: "softmax.sum".into(),
        rank: 2,
        operands: vec![
            op(DType::F32, Inner::Broadcast),
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Broadcast),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::Sum,
            value: e,
            dtype: DType::F32,
        }),
        epilogue: vec![(Instr::Acc, DType::F32)],
        out: n,
        extra_out: vec![],
        rows: None,
    }
}

/// A Linear bias gradient: out[j] = sum_i dy[i, j] of a row-major `dy`, the
/// kernel's dims `[j, i]`: the reduced dim strided, `j` reduced 16 at a time
/// (`columns.rs`) when contiguous, else a row at a time.
fn column_sum() -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let n = b.instrs.len();
    Kernel {
        name: "sum".into(),
        rank: 2,
        operands: vec![
            op(DType::F32, Inner::Broadcast),
            op(DType::F32, Inner::Strided),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::Sum,
            value: x,
            dtype: DType::F32,
        }),
        epilogue: vec![(Instr::Acc, DType::F32)],
        out: n,
        extra_out: vec![],
        rows: None,
    }
}

#[test]
fn column_sum_kernel() {
    let k = column_sum();
    insta::assert_snapshot!("column_sum_kernel", k.to_text());
    insta::assert_snapshot!("column_sum_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn broadcast_add_kernel() {
    let k = broadcast_add();
    insta::assert_snapshot!("broadcast_add_kernel", k.to_text());
    insta::assert_snapshot!("broadcast_add_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn strided_exp_kernel() {
    let k = strided_exp();
    insta::assert_snapshot!("strided_exp_kernel", k.to_text());
    insta::assert_snapshot!("strided_exp_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn softmax_sum_kernel() {
    let k = softmax_sum();
    insta::assert_snapshot!("softmax_sum_kernel", k.to_text());
    insta::assert_snapshot!("softmax_sum_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn softmax_lse_kernel() {
    let k = softmax_lse();
    insta::assert_snapshot!("softmax_lse_kernel", k.to_text());
    insta::assert_snapshot!("softmax_lse_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn layer_norm_moments_kernel() {
    let k = layer_norm_moments();
    insta::assert_snapshot!("layer_norm_moments_kernel", k.to_text());
    insta::assert_snapshot!("layer_norm_moments_clif", CpuJit::clif_text(&k).unwrap());
}

#[test]
fn clif_text_is_deterministic() {
    let ks = [
        broadcast_add(),
        strided_exp(),
        softmax_sum(),
        softmax_lse(),
        layer_norm_moments(),
    ];
    for k in ks {
        assert_eq!(
            CpuJit::clif_text(&k).unwrap(),
            CpuJit::clif_text(&k).unwrap()
        );
    }
}
