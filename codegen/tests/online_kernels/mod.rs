//! The one-pass reduction kernels eager softmax and layer_norm launch, for
//! the snapshot tests (KernelIR, Cranelift IR, CUDA C).

use kiln_codegen::{AccPart, Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

/// softmax's first kernel: one online log-sum-exp pass storing (shift, logsum) per row.
pub fn softmax_lse() -> Kernel {
    let f = DType::F32;
    Kernel {
        name: "lse".into(),
        rank: 2,
        operands: vec![op(f, Inner::Broadcast), op(f, Inner::Contiguous)],
        scalars: vec![],
        body: vec![(Instr::Load(1), f)],
        reduce: Some(Reduction {
            kind: ReduceKind::LogSumExp,
            value: 0,
            dtype: f,
        }),
        epilogue: vec![
            (Instr::Acc, f),
            (Instr::AccPart(AccPart::Shift), f),
            (Instr::AccPart(AccPart::LogSum), f),
        ],
        out: 2,
        extra_out: vec![3],
        rows: None,
    }
}

/// layer_norm's first kernel: one Welford pass storing (mean, var, rstd) per
/// row, rstd = rsqrt(var + eps) with eps a scalar argument.
pub fn layer_norm_moments() -> Kernel {
    let f = DType::F32;
    let mut e = KernelBuilder::default();
    let var = e.push(Instr::Acc, f);
    let mean = e.push(Instr::AccPart(AccPart::Mean), f);
    let eps = e.scalar(0, f);
    let ve = e.binary(BinaryOp::Add, var, eps, f);
    let rstd = e.unary(UnaryOp::Rsqrt, ve, f);
    // epilogue ids follow the body's single value
    let shift = |v: usize| v + 1;
    let epilogue = e
        .instrs
        .into_iter()
        .map(|(i, d)| match i {
            Instr::Binary(o, a, b) => (Instr::Binary(o, shift(a), shift(b)), d),
            Instr::Unary(o, a) => (Instr::Unary(o, shift(a)), d),
            other => (other, d),
        })
        .collect();
    Kernel {
        name: "moments".into(),
        rank: 2,
        operands: vec![op(f, Inner::Broadcast), op(f, Inner::Contiguous)],
        scalars: vec![f],
        body: vec![(Instr::Load(1), f)],
        reduce: Some(Reduction {
            kind: ReduceKind::Welford,
            value: 0,
            dtype: f,
        }),
        epilogue,
        out: shift(mean),
        extra_out: vec![shift(var), shift(rstd)],
        rows: None,
    }
}
