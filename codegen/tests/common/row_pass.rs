//! Reduction kernels with a row pass (softmax, log_softmax, layer_norm in
//! one kernel) and their operands, shared by the CPU and CUDA shim tests.

use super::*;
use kiln_codegen::{AccPart, RowPass};

/// What the row pass computes from the input row and the per-row parts.
#[derive(Clone, Copy, Debug)]
pub enum Norm {
    Softmax,
    LogSoftmax,
    /// `(x - mean) * rstd * w + b`, w and b of the row's length.
    LayerNorm,
    /// `(x - mean) * rstd`, no weight or bias.
    Normalize,
    /// `b + w * (rstd * (x - mean))`: layer_norm with every commutative
    /// operand the other way round.
    LayerNormSwapped,
}

impl Norm {
    /// The variants normalising by moments (a Welford reduction).
    pub const MOMENTS: [Norm; 3] = [Norm::LayerNorm, Norm::Normalize, Norm::LayerNormSwapped];

    fn affine(self) -> bool {
        matches!(self, Norm::LayerNorm | Norm::LayerNormSwapped)
    }
}

pub fn kernel(norm: Norm, dt: DType, x_inner: Inner) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(2, dt);
    let nb = b.instrs.len();
    let (kind, epilogue, out, extra) = match norm {
        Norm::Softmax | Norm::LogSoftmax => {
            let epi = vec![
                (Instr::Acc, dt),
                (Instr::AccPart(AccPart::Shift), dt),
                (Instr::AccPart(AccPart::LogSum), dt),
            ];
            (ReduceKind::LogSumExp, epi, nb + 1, vec![nb + 2])
        }
        _ => {
            let epi = vec![
                (Instr::Acc, dt),
                (Instr::AccPart(AccPart::Mean), dt),
                (Instr::Const(1e-5f64.to_bits()), dt),
                (Instr::Binary(BinaryOp::Add, nb, nb + 2), dt),
                (Instr::Unary(UnaryOp::Rsqrt, nb + 3), dt),
            ];
            (ReduceKind::Welford, epi, nb + 1, vec![nb, nb + 4])
        }
    };
    let first = nb + epilogue.len();
    let mut r = KernelBuilder::default();
    // row-pass ids continue after the epilogue's
    let mut push = |ins: Instr| r.push(ins, dt) + first;
    let xr = push(Instr::Load(2));
    let row_out = match norm {
        Norm::Softmax | Norm::LogSoftmax => {
            let s = push(Instr::Binary(BinaryOp::Sub, xr, nb + 1));
            let l = push(Instr::Binary(BinaryOp::Sub, s, nb + 2));
            match norm {
                Norm::Softmax => push(Instr::Unary(UnaryOp::Exp, l)),
                _ => l,
            }
        }
        Norm::LayerNorm => {
            let d = push(Instr::Binary(BinaryOp::Sub, xr, nb + 1));
            let n = push(Instr::Binary(BinaryOp::Mul, d, nb + 4));
            let w = push(Instr::Load(3));
            let bi = push(Instr::Load(4));
            let m = push(Instr::Binary(BinaryOp::Mul, n, w));
            push(Instr::Binary(BinaryOp::Add, m, bi))
        }
        Norm::Normalize => {
            let d = push(Instr::Binary(BinaryOp::Sub, xr, nb + 1));
            push(Instr::Binary(BinaryOp::Mul, d, nb + 4))
        }
        Norm::LayerNormSwapped => {
            let d = push(Instr::Binary(BinaryOp::Sub, xr, nb + 1));
            let n = push(Instr::Binary(BinaryOp::Mul, nb + 4, d));
            let w = push(Instr::Load(3));
            let bi = push(Instr::Load(4));
            let m = push(Instr::Binary(BinaryOp::Mul, w, n));
            push(Instr::Binary(BinaryOp::Add, bi, m))
        }
    };
    let mut operands = vec![
        op(dt, Inner::Broadcast),
        op(dt, Inner::Contiguous),
        op(dt, x_inner),
    ];
    if norm.affine() {
        operands.push(op(dt, Inner::Contiguous));
        operands.push(op(dt, Inner::Contiguous));
    }
    let instrs = r.instrs;
    Kernel {
        name: format!("{norm:?}").to_lowercase(),
        rank: 2,
        operands,
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind,
            value: x,
            dtype: dt,
        }),
        epilogue,
        out,
        extra_out: extra,
        rows: Some(RowPass {
            instrs,
            out: row_out,
        }),
    }
}

/// The operands of `kernel` over `rows x n` (outputs zeroed, then x — row
/// contiguous, or transposed when `strided`; a quarter edge values with
/// `edges` — then w and b for layer_norm).
pub fn views(
    k: &Kernel,
    rows: usize,
    n: usize,
    (strided, edges): (bool, bool),
    rng: &mut Rng,
) -> Vec<(Vec<isize>, Vec<u8>)> {
    let dt = k.operands[1].dtype;
    let parts = 1 + k.extra_out.len();
    let x_st = if strided {
        vec![1, rows as isize]
    } else {
        vec![n as isize, 1]
    };
    let mut v = vec![
        (vec![parts as isize, 0], vec![0u8; rows * parts * dt.size()]),
        (vec![n as isize, 1], vec![0u8; rows * n * dt.size()]),
        (x_st, gen(rng, dt, rows * n, -6.0, 6.0, edges)),
    ];
    for _ in 3..k.operands.len() {
        v.push((vec![0, 1], gen(rng, dt, n, -2.0, 2.0, false)));
    }
    v
}
