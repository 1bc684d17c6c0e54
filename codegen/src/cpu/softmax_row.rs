//! A softmax row with one exp per element. The one-pass log-sum-exp takes an
//! exp per element, and the row pass's `exp((v - shift) - logsum)` a second
//! one. When the row pass's exp is of the reduced value itself, the row is
//! instead done as PyTorch's and oneDNN's softmax: the reduced value is
//! stored to the output row, the wide helper ([`wide::LSE_STORE`]) takes its
//! max and rewrites it to `exp(v - shift)` while summing, and the row pass
//! reads that back, times `1 / s`.
//!
//! ```text
//! for i: out1[i] = v(i)                               (chain helper, f32x4 tail)
//! kiln_wide_reduce(LSE_STORE, out1, n, [shift, s])    max; exp, store, sum
//! for i: out1[i] = row pass with exp(..) := out1[i] * (1 / s)
//! ```
//!
//! The first loop runs in the chain helper (`wide::NO_OP`, no streaming)
//! when `v` is steps alone, such as an attention score's `x * scale + mask`:
//! W2F compiled 1.54-1.95 -> 1.37-1.43 ms (Xeon model 207, 4 alternating
//! runs). When `v` is a contiguous input's row the first loop goes: the helper
//! reads that row and writes the exps to out1 (`kiln_wide_reduce(LSE_STORE,
//! out1, n, state, in)`). When the row pass is the exp itself (a plain
//! softmax) the last loop goes too: the helper scales the row by `1 / s`
//! while it is in cache ([`wide::SOFTMAX_ROW`], same bits).
//!
//! The pass then writes over a row it read: it applies only when nothing
//! else in the row pass loads an operand (an input sharing the output's
//! buffer would be read after it was overwritten). The shift, logsum and
//! log-sum-exp are the one-pass reduction's values (same NaN, +inf and
//! all--inf rules); the softmax differs from `exp((v - shift) - logsum)` by
//! rounding only. `KILN_SOFTMAX_STORE=0` keeps the two-exp row (for A/B timing).

use super::emit::{flags, Emitter};
use super::jit::HostFn;
use super::loops::{for_loop, Row};
use super::plan::{row_pass_plan, Plan};
use super::tiles::direct_operand;
use super::wide;
use crate::interp::instr_args;
use crate::kernel::{AccPart, Instr, Kernel, ValueId};
use crate::online::{self, Finished, Lse};
use cranelift_codegen::ir::{types, InstBuilder, StackSlotData, StackSlotKind, Value};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};

/// The row pass's exp of the reduced value, once [`exp_row`] has stored it:
/// `exp` is its id, `scale` the per-row `1 / s` (scalar); `done`: the row
/// pass was that exp alone and the helper has finished it.
#[derive(Clone, Copy)]
pub(crate) struct StoredExp {
    pub exp: ValueId,
    pub scale: Value,
    pub done: bool,
}

/// Whether the row pass of `k` stores the exp `exp` itself (a plain softmax).
pub(crate) fn row_is_the_exp(k: &Kernel, exp: ValueId) -> bool {
    k.rows.as_ref().is_some_and(|r| r.out == exp)
}

/// The id of the row pass's `exp((v - shift) - logsum)` when `k` can run as
/// a stored-exp softmax row: an f32 log-sum-exp with vector plans, the wide
/// helpers on, `v` the reduced value, and no other load in the row pass.
pub(crate) fn stored_exp(k: &Kernel, em: &Emitter, plan: &Plan) -> Option<ValueId> {
    let red = k.reduce.as_ref()?;
    let rows = k.rows.as_ref()?;
    let rp = row_pass_plan(k);
    let f32_lanes = |p: &Plan| p.lanes == 4 && p.vdt == DType::F32;
    let on = em.wide.rows
        && enabled()
        && red.kind == ReduceKind::LogSumExp
        && red.dtype == DType::F32
        && k.dtype_of(red.value) == DType::F32
        && f32_lanes(plan)
        && f32_lanes(&rp);
    if !on {
        return None;
    }
    let first = k.body.len() + k.epilogue.len();
    let exp = (first..first + rows.instrs.len()).find(|&id| is_softmax_exp(k, id, red.value))?;
    (!loads_besides(k, rows.out, exp)).then_some(exp)
}

/// `KILN_SOFTMAX_STORE` is not `0` (read once per process).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_SOFTMAX_STORE").map_or(true, |v| v != "0"))
}

/// Whether `id` is `exp((v - shift) - logsum)` with `v` the same tree as `value`.
fn is_softmax_exp(k: &Kernel, id: ValueId, value: ValueId) -> bool {
    let part = |v: ValueId, p: AccPart| k.instr(v).0 == Instr::AccPart(p);
    let Instr::Unary(UnaryOp::Exp, a) = k.instr(id).0 else {
        return false;
    };
    let Instr::Binary(BinaryOp::Sub, b, logsum) = k.instr(a).0 else {
        return false;
    };
    let Instr::Binary(BinaryOp::Sub, v, shift) = k.instr(b).0 else {
        return false;
    };
    part(logsum, AccPart::LogSum) && part(shift, AccPart::Shift) && same_tree(k, v, value)
}

/// Whether values `a` and `b` compute the same thing (same instructions on
/// the same operands, ids aside).
fn same_tree(k: &Kernel, a: ValueId, b: ValueId) -> bool {
    let ((ia, da), (ib, db)) = (k.instr(a), k.instr(b));
    let strip = |i: Instr| match i {
        Instr::Unary(op, _) => Instr::Unary(op, 0),
        Instr::Binary(op, _, _) => Instr::Binary(op, 0, 0),
        Instr::Where(..) => Instr::Where(0, 0, 0),
        Instr::Cast(_) => Instr::Cast(0),
        other => other,
    };
    let ((xa, n), (xb, _)) = (instr_args(&ia), instr_args(&ib));
    da == db && strip(ia) == strip(ib) && (0..n).all(|j| same_tree(k, xa[j], xb[j]))
}

/// Whether `root`'s tree loads an operand outside `skip`'s subtree.
fn loads_besides(k: &Kernel, root: ValueId, skip: ValueId) -> bool {
    if root == skip {
        return false;
    }
    let (ins, _) = k.instr(root);
    let (args, n) = instr_args(&ins);
    matches!(ins, Instr::Load(_)) || args[..n].iter().any(|&a| loads_besides(k, a, skip))
}

/// The reduction of the row at `row.ptrs` as a stored-exp softmax row: the
/// helper reads the reduced value's row in place when it is a contiguous
/// input ([`direct_operand`]), else from operand 1's row, where it is stored
/// first; it writes the exps to operand 1's row, times `1 / s` when `whole`.
/// Returns the finished log-sum-exp and `1 / s`.
pub(crate) fn exp_row(
    em: &mut Emitter,
    row: &Row,
    plan: &Plan,
    value: ValueId,
    hi: Value,
    whole: bool,
) -> (Finished<Value>, Value) {
    // the row the helper reads, and its next row when it is an input's
    let (src, next) = match direct_operand(row.k, value) {
        Some(op) => {
            let next = row.fr.next_row(em, row.k.rank, row.ptrs[op], op);
            (row.ptrs[op], next)
        }
        None => {
            store_value_row(em, row, plan, value, hi);
            (row.ptrs[1], em.b.ins().iconst(types::I64, 0))
        }
    };
    let slot =
        em.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8, 4));
    let init = online::lse_init(em, DType::F32);
    let state = em.b.ins().stack_addr(types::I64, slot, 0);
    em.b.ins().store(flags(), init.m, state, 0);
    em.b.ins().store(flags(), init.s, state, 4);
    let f = em.hosts.get(em.b.func, HostFn::WideReduce);
    let kind = if whole {
        wide::SOFTMAX_ROW
    } else {
        wide::LSE_STORE
    };
    let kind = em.b.ins().iconst(types::I64, kind as i64);
    em.b.ins()
        .call(f, &[kind, row.ptrs[1], hi, state, src, next]);
    let m = em.b.ins().load(types::F32, flags(), state, 0);
    let s = em.b.ins().load(types::F32, flags(), state, 4);
    let one = em.constant(1.0, DType::F32);
    let scale = em.b.ins().fdiv(one, s);
    (online::finish_lse(em, Lse { m, s }, DType::F32), scale)
}

/// `out1[i] = value(i)` over the row: whole tiles by the chain helper when
/// `value` is steps alone (same bits, the helper's width, operands fetched
/// ahead), the rest f32x4, then a scalar tail.
fn store_value_row(em: &mut Emitter, row: &Row, plan: &Plan, value: ValueId, hi: Value) {
    let mut lo = em.b.ins().iconst(types::I64, 0);
    if em.wide.chains {
        if let Some(c) = super::chain::steps_of(row.k, value, 1) {
            let tiles_end = em.b.ins().band_imm_s(hi, !(wide::TILE as i64 - 1));
            // the helper reads the row back at once: keep it in cache
            super::chain::chain_call(em, row, &c, [lo, tiles_end], false);
            lo = tiles_end;
        }
    }
    let lanes = plan.lanes as i64;
    let step = lanes * 2;
    let main_end = em.b.ins().band_imm_s(hi, !(step - 1));
    em.lanes = plan.lanes;
    for_loop(
        em,
        lo,
        main_end,
        step,
        |em| row.preload(em),
        |em, i, pre| {
            let at = row.addr(em, 1, i);
            for u in 0..2 {
                let v = row.eval(em, value, i, u * 16, pre);
                em.b.ins().store(flags(), v, at, u * 16);
            }
        },
    );
    em.lanes = 1;
    for_loop(
        em,
        main_end,
        hi,
        1,
        |em| row.preload(em),
        |em, i, pre| {
            let v = row.eval(em, value, i, 0, pre);
            let at = row.addr(em, 1, i);
            em.b.ins().store(flags(), v, at, 0);
        },
    );
}
