//! A reduced row: accumulate the body along the innermost dim in registers,
//! then run the epilogue once and store one output element.
//!
//! A float Sum that [`crate::interp::sum_width`] gives a width `w` (8 for
//! f32) adds in PyTorch's order, bit for bit as [`crate::interp::pytorch_sum`]:
//! rows shorter than `w` with four scalar accumulators (taking elements in
//! turn), longer rows with four accumulators of `w` elements each — `w / lanes`
//! vector registers with a vector plan (so 8 f32x4 registers, 32 elements per
//! iteration), `w` scalars otherwise — then the scalar tail and the lanes.
//!
//! Other Sum/Prod/Max/Min with a vector plan keep two vector accumulators (one per
//! unrolled body), combine them and then the lanes at the end of the vector
//! loop, and finish the row's tail in a scalar accumulator. ArgMax/ArgMin run
//! scalar code keeping (best value, index): a candidate wins when it is
//! strictly better or NaN while the best is not NaN, so the first maximum (or
//! first NaN) wins, as in PyTorch. Accumulators start at the identity of
//! [`crate::interp::reduce_identity`], so an empty row gives 0, 1 or ∓inf.
//! Combining uses the `ScalarOps` primitives (Add, Mul, NaN-propagating
//! Max/Min), the same ones the interpreter uses. LogSumExp and Welford keep
//! a running state instead (`online.rs`). A kernel with a row pass then
//! walks the row again (`rows.rs`).

use super::emit::{flags, scalar_ty, Emitter};
use super::loops::{for_loop, loaded_operands, store_out, Frame, Row};
use super::plan::Plan;
use super::softmax_row::StoredExp;
use crate::interp::{eval_value, reduce_identity, sum_width};
use crate::kernel::{Instr, Kernel};
use crate::online::{self, Finished};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, InstBuilder, Value};
use cranelift_frontend::Variable;
use kiln_ir::scalar::{Prim2, ScalarOps};
use kiln_ir::{DType, ReduceKind};

pub(crate) fn combine_prim(kind: ReduceKind) -> Prim2 {
    match kind {
        ReduceKind::Sum => Prim2::Add,
        ReduceKind::Prod => Prim2::Mul,
        ReduceKind::Max => Prim2::Max,
        _ => Prim2::Min,
    }
}

/// Emits the reduction of one row at `ptrs` (reduce index 0), its epilogue and the store.
pub(crate) fn reduce_row(k: &Kernel, em: &mut Emitter, fr: &Frame, plan: &Plan, ptrs: &[Value]) {
    let red = k.reduce.as_ref().expect("reduction");
    let vd = k.dtype_of(red.value);
    let arg = matches!(red.kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let cd = if arg { vd } else { red.dtype };
    let row = Row {
        k,
        fr,
        ptrs,
        loaded: loaded_operands(k, red.value),
    };
    let lo = em.b.ins().iconst(types::I64, 0);
    let hi = fr.sizes[k.rank - 1];
    if let Some(exp) = super::softmax_row::stored_exp(k, em, plan) {
        let done = super::softmax_row::row_is_the_exp(k, exp);
        let (fin, scale) = super::softmax_row::exp_row(em, &row, plan, red.value, hi, done);
        let stored = StoredExp { exp, scale, done };
        return epilogue(k, em, fr, ptrs, fin, red.dtype, Some(stored));
    }
    if online::is_online(red.kind) {
        let fin = super::online::online_row(em, &row, plan, red.value, red.kind, vd, cd, lo, hi);
        return epilogue(k, em, fr, ptrs, fin, red.dtype, None);
    }

    em.lanes = 1;
    let acc = em.b.declare_var(scalar_ty(cd));
    let init = em.constant(reduce_identity(red.kind, cd), cd);
    em.b.def_var(acc, init);
    let idx = em.b.declare_var(types::I64);
    if arg {
        em.b.def_var(idx, lo);
    }

    if let Some(w) = sum_width(k) {
        // Rows shorter than w take PyTorch's scalar path (w = 1).
        let short = em.b.ins().icmp_imm_s(IntCC::SignedLessThan, hi, w as i64);
        let (sb, lb, join) = (
            em.b.create_block(),
            em.b.create_block(),
            em.b.create_block(),
        );
        em.b.ins().brif(short, sb, &[], lb, &[]);
        em.b.seal_block(sb);
        em.b.seal_block(lb);
        for (blk, w, lanes) in [(sb, 1, 1), (lb, w as u32, plan.lanes)] {
            em.b.switch_to_block(blk);
            let s = pytorch_sum_row(em, &row, red.value, vd, cd, lo, hi, w, lanes);
            em.b.def_var(acc, s);
            em.b.ins().jump(join, &[]);
        }
        em.b.seal_block(join);
        em.b.switch_to_block(join);
    } else {
        reduce_loops(
            em, &row, plan, red.value, red.kind, vd, cd, acc, idx, lo, hi,
        );
    }

    let (accv, dt) = if arg {
        (em.b.use_var(idx), DType::I64)
    } else {
        (em.b.use_var(acc), red.dtype)
    };
    let fin = Finished {
        acc: accv,
        first: accv,
        second: accv,
    };
    epilogue(k, em, fr, ptrs, fin, dt, None);
}

/// The epilogue (Acc and its parts from `fin`, of dtype `dt`; loads read at
/// reduce index 0), then the stores of `out` and `extra_out`, then the row
/// pass (`stored`: a softmax row's exp is in operand 1 already, or the
/// whole row when `done`).
pub(crate) fn epilogue(
    k: &Kernel,
    em: &mut Emitter,
    fr: &Frame,
    ptrs: &[Value],
    fin: Finished<Value>,
    dt: DType,
    stored: Option<StoredExp>,
) {
    em.lanes = 1;
    let mut pre = vec![None; k.operands.len()];
    let mut leaf = |em: &mut Emitter, ins: Instr| -> (Value, DType) {
        match ins {
            Instr::Acc => (fin.acc, dt),
            Instr::AccPart(p) => (fin.get(Some(p)), dt),
            Instr::Load(op) => {
                let dt = k.operands[op].dtype;
                let v = *pre[op]
                    .get_or_insert_with(|| em.b.ins().load(scalar_ty(dt), flags(), ptrs[op], 0));
                (v, dt)
            }
            Instr::Scalar(n) => (fr.scal[n], k.scalars[n]),
            _ => unreachable!(),
        }
    };
    let mut vals = vec![None; k.values()];
    let size = k.operands[0].dtype.size() as i32;
    for (t, &o) in std::iter::once(&k.out).chain(&k.extra_out).enumerate() {
        let v = eval_value(em, k, o, &mut vals, &mut leaf);
        store_out(k, em, v, k.dtype_of(o), ptrs[0], t as i32 * size);
    }
    if k.rows.is_some() && !stored.is_some_and(|s| s.done) {
        for id in k.row_pass_reads() {
            eval_value(em, k, id, &mut vals, &mut leaf);
        }
        // only epilogue values enter the pass (body values are per element)
        for v in &mut vals[..k.body.len()] {
            *v = None;
        }
        super::rows::row_pass(k, em, fr, ptrs, &vals, stored);
    }
}

/// The reduction loops of every reduction but a PyTorch-order Sum: vector
/// accumulators (one per unrolled body) with a vector plan, then the scalar tail.
#[allow(clippy::too_many_arguments)]
fn reduce_loops(
    em: &mut Emitter,
    row: &Row,
    plan: &Plan,
    value: usize,
    kind: ReduceKind,
    vd: DType,
    cd: DType,
    acc: Variable,
    idx: Variable,
    lo: Value,
    hi: Value,
) {
    let arg = matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let prim = combine_prim(kind);
    let mut tail_lo = lo;
    if plan.lanes > 1 {
        let lanes = plan.lanes as i64;
        let step = lanes * plan.unroll as i64;
        let nm = em.b.ins().band_imm_s(hi, !(step - 1));
        let vbytes = (lanes * plan.vdt.size() as i64) as i32;
        em.lanes = plan.lanes;
        let vt = em.ty(cd);
        let vinit = em.constant(reduce_identity(kind, cd), cd);
        let vacc: Vec<_> = (0..plan.unroll)
            .map(|_| {
                let v = em.b.declare_var(vt);
                em.b.def_var(v, vinit);
                v
            })
            .collect();
        for_loop(
            em,
            lo,
            nm,
            step,
            |em| row.preload(em),
            |em, i, pre| {
                for (u, &va) in vacc.iter().enumerate() {
                    let v = row.eval(em, value, i, u as i32 * vbytes, pre);
                    let a = em.b.use_var(va);
                    let a = em.binary(prim, a, v, cd);
                    em.b.def_var(va, a);
                }
            },
        );
        let mut v = em.b.use_var(vacc[0]);
        for &va in &vacc[1..] {
            let w = em.b.use_var(va);
            v = em.binary(prim, v, w, cd);
        }
        em.lanes = 1;
        let mut s = em.b.ins().extractlane(v, 0);
        for l in 1..plan.lanes as u8 {
            let e = em.b.ins().extractlane(v, l);
            s = em.binary(prim, s, e, cd);
        }
        em.b.def_var(acc, s);
        tail_lo = nm;
    }

    em.lanes = 1;
    for_loop(
        em,
        tail_lo,
        hi,
        1,
        |em| row.preload(em),
        |em, i, pre| {
            let v = row.eval(em, value, i, 0, pre);
            let v = em.cast(v, vd, cd);
            let best = em.b.use_var(acc);
            if !arg {
                let a = em.binary(prim, best, v, cd);
                em.b.def_var(acc, a);
                return;
            }
            let better = if cd.is_float() {
                let cc = if kind == ReduceKind::ArgMax {
                    FloatCC::GreaterThan
                } else {
                    FloatCC::LessThan
                };
                let gt = em.b.ins().fcmp(cc, v, best);
                let vnan = em.b.ins().fcmp(FloatCC::Unordered, v, v);
                let bok = em.b.ins().fcmp(FloatCC::Ordered, best, best);
                let c = em.b.ins().bor(gt, vnan);
                em.b.ins().band(c, bok)
            } else {
                let u = matches!(cd, DType::U8 | DType::Bool);
                let cc = match (kind == ReduceKind::ArgMax, u) {
                    (true, false) => IntCC::SignedGreaterThan,
                    (true, true) => IntCC::UnsignedGreaterThan,
                    (false, false) => IntCC::SignedLessThan,
                    (false, true) => IntCC::UnsignedLessThan,
                };
                em.b.ins().icmp(cc, v, best)
            };
            let nb = em.b.ins().select(better, v, best);
            em.b.def_var(acc, nb);
            let old = em.b.use_var(idx);
            let ni = em.b.ins().select(better, i, old);
            em.b.def_var(idx, ni);
        },
    );
}

/// A float Sum of the row `lo..hi` in PyTorch's order with vectors of `w`
/// elements (see [`crate::interp::pytorch_sum`]; `w` is a power of two, 1 for
/// the short-row path), each held in `w / lanes` registers of `lanes` lanes.
/// Returns the scalar sum.
#[allow(clippy::too_many_arguments)]
fn pytorch_sum_row(
    em: &mut Emitter,
    row: &Row,
    value: usize,
    vd: DType,
    cd: DType,
    lo: Value,
    hi: Value,
    w: u32,
    lanes: u32,
) -> Value {
    let lanes = lanes.min(w);
    let regs = (w / lanes) as usize;
    let wi = w as i64;
    // Element `i + off` as a value of `lanes` lanes (loads all of dtype cd
    // when lanes > 1, so a byte offset serves every operand).
    let unit = |em: &mut Emitter, i: Value, off: i64, pre: &[Option<Value>]| -> Value {
        if lanes > 1 {
            return row.eval(em, value, i, (off * cd.size() as i64) as i32, pre);
        }
        let j = if off == 0 {
            i
        } else {
            em.b.ins().iadd_imm_s(i, off)
        };
        let v = row.eval(em, value, j, 0, pre);
        if vd == cd {
            v
        } else {
            em.cast(v, vd, cd)
        }
    };
    em.lanes = lanes;
    let zero = em.constant(0.0, cd);
    let vt = em.ty(cd);
    let accs: Vec<Vec<Variable>> = (0..4)
        .map(|_| {
            (0..regs)
                .map(|_| {
                    let v = em.b.declare_var(vt);
                    em.b.def_var(v, zero);
                    v
                })
                .collect()
        })
        .collect();
    let add_into = |em: &mut Emitter, var: Variable, x: Value| {
        let a = em.b.use_var(var);
        let s = em.binary(Prim2::Add, a, x, cd);
        em.b.def_var(var, s);
    };
    // Whole groups of four vectors, one per accumulator.
    let main_end = em.b.ins().band_imm_s(hi, !(4 * wi - 1));
    for_loop(
        em,
        lo,
        main_end,
        4 * wi,
        |em| row.preload(em),
        |em, i, pre| {
            for (a, regs_a) in accs.iter().enumerate() {
                for (q, &var) in regs_a.iter().enumerate() {
                    let x = unit(em, i, a as i64 * wi + (q as u32 * lanes) as i64, pre);
                    add_into(em, var, x);
                }
            }
        },
    );
    // The remaining whole vectors go into the first accumulator.
    let vec_end = if w == 1 {
        hi
    } else {
        em.b.ins().band_imm_s(hi, !(wi - 1))
    };
    for_loop(
        em,
        main_end,
        vec_end,
        wi,
        |em| row.preload(em),
        |em, i, pre| {
            for (q, &var) in accs[0].iter().enumerate() {
                let x = unit(em, i, (q as u32 * lanes) as i64, pre);
                add_into(em, var, x);
            }
        },
    );
    for regs_a in &accs[1..] {
        for (q, &var) in regs_a.iter().enumerate() {
            let x = em.b.use_var(var);
            add_into(em, accs[0][q], x);
        }
    }
    // 0, then the elements after the last whole vector, then the lanes.
    em.lanes = 1;
    let res = em.b.declare_var(scalar_ty(cd));
    let z = em.constant(0.0, cd);
    em.b.def_var(res, z);
    if w > 1 {
        for_loop(
            em,
            vec_end,
            hi,
            1,
            |em| row.preload(em),
            |em, i, pre| {
                let x = unit(em, i, 0, pre);
                add_into(em, res, x);
            },
        );
    }
    for &var in &accs[0] {
        let v = em.b.use_var(var);
        for l in 0..lanes {
            let x = if lanes > 1 {
                em.b.ins().extractlane(v, l as u8)
            } else {
                v
            };
            add_into(em, res, x);
        }
    }
    em.b.use_var(res)
}
