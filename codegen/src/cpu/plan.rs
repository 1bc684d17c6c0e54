//! Whether a kernel's innermost loop can run on 128-bit vectors.
//!
//! It can when the compute dtype D is f32 (f32x4) or f64 (f64x2), every value
//! the row computes is of dtype D or bool (a lane mask), every loaded operand
//! is of dtype D and contiguous or broadcast along the innermost dim, and the
//! outputs are contiguous D (pointwise) or the reduction is a Sum/Prod/Max/Min
//! (or a one-pass LogSumExp/Welford) accumulating in D. Otherwise the row runs scalar code.

use crate::interp::instr_args;
use crate::kernel::{Inner, Instr, Kernel};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// 1 = scalar rows; 4 = f32x4; 2 = f64x2.
    pub lanes: u32,
    /// Vector bodies per loop iteration.
    pub unroll: u32,
    /// The vector element dtype.
    pub vdt: DType,
}

impl Plan {
    pub(crate) const SCALAR: Plan = Plan {
        lanes: 1,
        unroll: 1,
        vdt: DType::F32,
    };

    pub(crate) fn of(k: &Kernel) -> Plan {
        match vector_dtype(k) {
            Some(d) => Plan {
                lanes: (16 / d.size()) as u32,
                unroll: 2,
                vdt: d,
            },
            None => Plan::SCALAR,
        }
    }
}

/// Which body values the `roots` depend on (indexed by body value id).
pub(crate) fn live_body(k: &Kernel, roots: &[usize]) -> Vec<bool> {
    let mut live = vec![false; k.body.len()];
    let mut stack: Vec<usize> = roots
        .iter()
        .copied()
        .filter(|&r| r < k.body.len())
        .collect();
    while let Some(id) = stack.pop() {
        if live[id] {
            continue;
        }
        live[id] = true;
        let (args, n) = instr_args(&k.body[id].0);
        stack.extend_from_slice(&args[..n]);
    }
    live
}

fn vector_dtype(k: &Kernel) -> Option<DType> {
    let (roots, d) = match &k.reduce {
        None => {
            let d = k.operands[0].dtype;
            let mut roots = vec![];
            for (op, _, v) in k.stores() {
                let out = k.operands[op];
                if out.inner != Inner::Contiguous
                    || out.dtype != d
                    || v >= k.body.len()
                    || k.dtype_of(v) != d
                {
                    return None;
                }
                roots.push(v);
            }
            (roots, d)
        }
        Some(r) => {
            if !matches!(
                r.kind,
                ReduceKind::Sum
                    | ReduceKind::Prod
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::LogSumExp
                    | ReduceKind::Welford
            ) {
                return None;
            }
            if k.dtype_of(r.value) != r.dtype {
                return None;
            }
            (vec![r.value], r.dtype)
        }
    };
    if !matches!(d, DType::F32 | DType::F64) {
        return None;
    }
    let live = live_body(k, &roots);
    let mut body = k.body.iter().enumerate().filter(|(id, _)| live[*id]);
    body.all(|(_, &(ins, dt))| vectorises(k, ins, dt, d))
        .then_some(d)
}

/// Whether value `(ins, dt)` of a row whose vector dtype is `d` runs on vectors.
fn vectorises(k: &Kernel, ins: Instr, dt: DType, d: DType) -> bool {
    let ok_dt = |t: DType| t == d || t == DType::Bool;
    if !ok_dt(dt) {
        return false;
    }
    match ins {
        Instr::Load(op) => {
            let o = k.operands[op];
            o.dtype == d && dt == d && o.inner != Inner::Strided
        }
        Instr::Scalar(n) => k.scalars[n] == d && dt == d,
        Instr::Const(_) => true,
        Instr::Unary(op, a) => {
            let ad = k.dtype_of(a);
            if dt == DType::Bool {
                op == UnaryOp::Not && ok_dt(ad)
            } else {
                ad == d
            }
        }
        Instr::Binary(op, a, b) => {
            let (ad, bd) = (k.dtype_of(a), k.dtype_of(b));
            let want = if op.is_comparison() { DType::Bool } else { ad };
            let bool_ok = ad != DType::Bool
                || matches!(
                    op,
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Eq | BinaryOp::Ne
                );
            ad == bd && dt == want && bool_ok
        }
        Instr::Where(c, a, b) => {
            k.dtype_of(c) == DType::Bool && k.dtype_of(a) == dt && k.dtype_of(b) == dt
        }
        Instr::Cast(a) => ok_dt(k.dtype_of(a)),
        Instr::Acc | Instr::AccPart(_) => false,
    }
}

/// The plan of a reduction's row pass ([`crate::kernel::RowPass`]): vectors
/// when its output (operand 1) is contiguous f32/f64 and its values
/// vectorise as a pointwise row's do; epilogue values enter it splatted.
pub(crate) fn row_pass_plan(k: &Kernel) -> Plan {
    let Some(rows) = &k.rows else {
        return Plan::SCALAR;
    };
    let out = k.operands[1];
    let d = out.dtype;
    let epi_ok = k.epilogue.iter().all(|(_, dt)| *dt == d);
    let ok = matches!(d, DType::F32 | DType::F64)
        && out.inner == Inner::Contiguous
        && k.dtype_of(rows.out) == d
        && epi_ok
        && rows
            .instrs
            .iter()
            .all(|&(ins, dt)| vectorises(k, ins, dt, d));
    match ok {
        true => Plan {
            lanes: (16 / d.size()) as u32,
            unroll: 2,
            vdt: d,
        },
        false => Plan::SCALAR,
    }
}
