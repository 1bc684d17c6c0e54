//! Pointwise rows that call the wide-vector helpers (`wide/`) on tiles.
//!
//! A row whose body applies a transcendental op (exp, erf, gelu, sigmoid, ...:
//! [`wide::SUPPORTED`]) runs, per tile of [`wide::TILE`] elements: for each
//! such op in order, an f32x4 loop evaluates its operand into a stack tile
//! (earlier ops' results read back from theirs) and the helper rewrites the
//! tile in place with AVX2/AVX-512 code; a last f32x4 loop evaluates the
//! stored values with every op's result read from its tile. The cheap
//! pointwise parts before and between the ops are recomputed per phase from
//! loads that hit L1 (the tile's rows were just read). The rest of the row
//! (less than a tile) takes the usual f32x4 loop and scalar tail, whose bits
//! the helpers reproduce.
//!
//! ```text
//! y = gelu(x*a + b) * 0.5 + x, per 256 elements:
//!   loop: t0[i] = x[i]*a[i] + b[i]          (f32x4)
//!   call kiln_wide_unary(gelu, t0, 256)     (f32x8 / f32x16)
//!   loop: y[i] = t0[i]*0.5 + x[i]           (f32x4)
//! ```

use super::emit::{flags, Emitter};
use super::jit::HostFn;
use super::loops::{for_loop, Row};
use super::plan::{live_body, Plan};
use super::wide;
use crate::kernel::{Inner, Instr};
use cranelift_codegen::ir::{types, InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value};
use kiln_ir::DType;

/// Body values (in order) that a wide helper computes for a row storing `roots`.
pub(crate) fn wide_values(k: &crate::Kernel, roots: &[usize]) -> Vec<usize> {
    let live = live_body(k, roots);
    // a row computes these once (`Row::preload`), not per element
    let hoisted = super::loops::hoisted(k);
    k.body
        .iter()
        .enumerate()
        .filter(|&(id, (ins, dt))| {
            live[id]
                && !hoisted[id]
                && *dt == DType::F32
                && matches!(ins, Instr::Unary(op, a)
                    if wide::op_code(*op).is_some() && k.dtype_of(*a) == DType::F32)
        })
        .map(|(id, _)| id)
        .collect()
}

/// Emits the whole tiles of the row `lo..hi` (when the kernel has wide
/// values and the emitter may use the helpers); returns where the rest starts.
pub(crate) fn tiled_row(
    em: &mut Emitter,
    row: &Row,
    plan: &Plan,
    lo: Value,
    hi: Value,
    stores: &[(usize, usize, usize)],
) -> Value {
    let k = row.k;
    let roots: Vec<usize> = stores.iter().map(|s| s.2).collect();
    let heavy = wide_values(k, &roots);
    let wide = em.wide.pointwise || em.wide.chains;
    if !wide || heavy.is_empty() || plan.lanes != 4 || plan.vdt != DType::F32 {
        return lo;
    }
    let tile = wide::TILE as i64;
    let tile_bytes = tile * 4;
    let n = em.b.ins().isub(hi, lo);
    let nt = em.b.ins().band_imm_s(n, !(tile - 1));
    let tiles_end = em.b.ins().iadd(lo, nt);
    if em.wide.chains {
        if let Some(c) = super::chain::chain_of(k, stores, &heavy) {
            super::chain::chain_call(em, row, &c, [lo, tiles_end], true);
            return tiles_end;
        }
    }
    if !em.wide.pointwise {
        return lo;
    }
    let slot = em.b.create_sized_stack_slot(StackSlotData::new(
        StackSlotKind::ExplicitSlot,
        (heavy.len() as i64 * tile_bytes) as u32,
        4,
    ));
    em.lanes = plan.lanes;
    let vbytes = 16i32;
    // the tile of wide value `j` at element `i` (+ `off` bytes), as f32x4
    let read_back = |em: &mut Emitter, base: Value, upto: usize, off: i32| {
        let mut vals = vec![None; k.values()];
        for (j, &h) in heavy[..upto].iter().enumerate() {
            let v = em.b.ins().load(
                types::F32X4,
                flags(),
                base,
                j as i32 * tile_bytes as i32 + off,
            );
            vals[h] = Some(v);
        }
        vals
    };
    for_loop(
        em,
        lo,
        tiles_end,
        tile,
        |em| row.preload(em),
        |em, t, pre| {
            let sbase = em.b.ins().stack_addr(types::I64, slot, 0);
            let t_end = em.b.ins().iadd_imm_s(t, tile);
            let step = 2 * plan.lanes as i64;
            for (j, &h) in heavy.iter().enumerate() {
                let Instr::Unary(op, arg) = k.body[h].0 else {
                    unreachable!("wide values are unary")
                };
                for_loop(
                    em,
                    t,
                    t_end,
                    step,
                    |_| (),
                    |em, i, _| {
                        let at = tile_slot(em, sbase, i, t);
                        for u in 0..2 {
                            let known = read_back(em, at, j, u * vbytes);
                            let v = row.eval_known(em, &[arg], i, u * vbytes, pre, known)[0];
                            let off = j as i32 * tile_bytes as i32 + u * vbytes;
                            em.b.ins().store(flags(), v, at, off);
                        }
                    },
                );
                let f = em.hosts.get(em.b.func, HostFn::WideUnary);
                let code = wide::op_code(op).expect("a wide op") as i64;
                let code = em.b.ins().iconst(types::I64, code);
                let p = em.b.ins().iadd_imm_s(sbase, j as i64 * tile_bytes);
                let len = em.b.ins().iconst(types::I64, tile);
                em.b.ins().call(f, &[code, p, len]);
            }
            for_loop(
                em,
                t,
                t_end,
                step,
                |_| (),
                |em, i, _| {
                    let at = tile_slot(em, sbase, i, t);
                    let addrs: Vec<Value> = stores.iter().map(|s| row.addr(em, s.0, i)).collect();
                    for u in 0..2 {
                        let known = read_back(em, at, heavy.len(), u * vbytes);
                        let vs = row.eval_known(em, &roots, i, u * vbytes, pre, known);
                        for (v, a) in vs.into_iter().zip(&addrs) {
                            em.b.ins().store(flags(), v, *a, u * vbytes);
                        }
                    }
                },
            );
        },
    );
    tiles_end
}

/// The stack address of element `i` of the tile starting at element `t`
/// (the first wide value's tile; later ones sit at fixed offsets from it).
fn tile_slot(em: &mut Emitter, sbase: Value, i: Value, t: Value) -> Value {
    let rel = em.b.ins().isub(i, t);
    let rel = em.b.ins().ishl_imm_u(rel, 2);
    em.b.ins().iadd(sbase, rel)
}

/// The operand whose row a reduction reads straight from memory: `value` is
/// a load of a contiguous f32 operand, so the wide helper can fold that row
/// in place instead of a copy of it.
pub(crate) fn direct_operand(k: &crate::Kernel, value: usize) -> Option<usize> {
    let (Instr::Load(op), DType::F32) = *k.body.get(value)? else {
        return None;
    };
    let o = k.operands[op];
    (o.inner == Inner::Contiguous && o.dtype == DType::F32).then_some(op)
}

/// Elements per helper call on a row read in place: the helper's second
/// sweep finds them in L1, and Welford chunks merge in f64.
const DIRECT_CHUNK: i64 = 2048;

/// A log-sum-exp or Welford row of f32 values through the wide reduce
/// helper (when the emitter may use it), folded into a `[2 x f32]` state on
/// the stack and finished as [`crate::online`] finishes the one-pass state.
/// A row that only loads a contiguous input ([`direct_operand`]) is folded
/// in place, by chunks; otherwise, per tile, an f32x4 loop (scalar for the
/// last, partial tile) evaluates the reduced value into a stack tile that
/// the helper folds. `None`: the caller emits the one-pass row.
pub(crate) fn tiled_online_row(
    em: &mut Emitter,
    row: &Row,
    plan: &Plan,
    value: usize,
    is_lse: bool,
    (vd, cd): (DType, DType),
    hi: Value,
) -> Option<crate::online::Finished<Value>> {
    let direct = direct_operand(row.k, value);
    // Welford rows by default only in place: through a tile copy they
    // measured no faster than the one-pass f32x4 code.
    let on = em.wide.expression_rows || (em.wide.rows && (is_lse || direct.is_some()));
    if !on || plan.lanes != 4 || vd != DType::F32 || cd != DType::F32 {
        return None;
    }
    let tile = wide::TILE as i64;
    let tile_bytes = (tile * 4) as i32;
    // the tile (none for a direct row), then the state
    let state_at = if direct.is_some() { 0 } else { tile_bytes };
    let slot = em.b.create_sized_stack_slot(StackSlotData::new(
        StackSlotKind::ExplicitSlot,
        (state_at + 16) as u32,
        4,
    ));
    em.lanes = 1;
    let (s0, s1) = if is_lse {
        let st = crate::online::lse_init(em, cd);
        (st.m, st.s)
    } else {
        let st = crate::online::welford_init(em, cd);
        (st.mean, st.m2)
    };
    let base = em.b.ins().stack_addr(types::I64, slot, 0);
    em.b.ins().store(flags(), s0, base, state_at);
    em.b.ins().store(flags(), s1, base, state_at + 4);
    let kind = if is_lse { wide::LSE } else { wide::WELFORD } as i64;
    // folds n values at x, which follow `count` already folded
    let fold = |em: &mut Emitter, x: Option<Value>, n: Value, count: Value| {
        let f = em.hosts.get(em.b.func, HostFn::WideReduce);
        let base = em.b.ins().stack_addr(types::I64, slot, 0);
        let kind = em.b.ins().iconst(types::I64, kind);
        let state = em.b.ins().iadd_imm_s(base, state_at as i64);
        let no_next = em.b.ins().iconst(types::I64, 0);
        em.b.ins()
            .call(f, &[kind, x.unwrap_or(base), n, state, count, no_next]);
    };
    let zero = em.b.ins().iconst(types::I64, 0);
    if let Some(op) = direct {
        let ends = em.b.ins().band_imm_s(hi, !(DIRECT_CHUNK - 1));
        for_loop(
            em,
            zero,
            ends,
            DIRECT_CHUNK,
            |_| (),
            |em, t, _| {
                let x = row.addr(em, op, t);
                let n = em.b.ins().iconst(types::I64, DIRECT_CHUNK);
                fold(em, Some(x), n, t);
            },
        );
        let x = row.addr(em, op, ends);
        let rest = em.b.ins().isub(hi, ends);
        fold(em, Some(x), rest, ends);
        return Some(finish(em, slot, state_at, is_lse, hi, cd));
    }
    let tiles_end = em.b.ins().band_imm_s(hi, !(tile - 1));
    let step = 2 * plan.lanes as i64;
    em.lanes = plan.lanes;
    for_loop(
        em,
        zero,
        tiles_end,
        tile,
        |em| row.preload(em),
        |em, t, pre| {
            let t_end = em.b.ins().iadd_imm_s(t, tile);
            for_loop(
                em,
                t,
                t_end,
                step,
                |_| (),
                |em, i, _| {
                    let base = em.b.ins().stack_addr(types::I64, slot, 0);
                    let rel = em.b.ins().isub(i, t);
                    let rel = em.b.ins().ishl_imm_u(rel, 2);
                    let at = em.b.ins().iadd(base, rel);
                    for u in 0..2 {
                        let v = row.eval(em, value, i, u * 16, pre);
                        em.b.ins().store(flags(), v, at, u * 16);
                    }
                },
            );
            let n = em.b.ins().iconst(types::I64, tile);
            fold(em, None, n, t);
        },
    );
    // the partial tile, scalar
    em.lanes = 1;
    for_loop(
        em,
        tiles_end,
        hi,
        1,
        |em| row.preload(em),
        |em, i, pre| {
            let base = em.b.ins().stack_addr(types::I64, slot, 0);
            let rel = em.b.ins().isub(i, tiles_end);
            let rel = em.b.ins().ishl_imm_u(rel, 2);
            let at = em.b.ins().iadd(base, rel);
            let v = row.eval(em, value, i, 0, pre);
            em.b.ins().store(flags(), v, at, 0);
        },
    );
    let rest = em.b.ins().isub(hi, tiles_end);
    fold(em, None, rest, tiles_end);
    Some(finish(em, slot, state_at, is_lse, hi, cd))
}

/// The finished reduction of the state at `state_at` in `slot`.
fn finish(
    em: &mut Emitter,
    slot: StackSlot,
    state_at: i32,
    is_lse: bool,
    hi: Value,
    cd: DType,
) -> crate::online::Finished<Value> {
    em.lanes = 1;
    let base = em.b.ins().stack_addr(types::I64, slot, 0);
    let a = em.b.ins().load(types::F32, flags(), base, state_at);
    let b = em.b.ins().load(types::F32, flags(), base, state_at + 4);
    if is_lse {
        crate::online::finish_lse(em, crate::online::Lse { m: a, s: b }, cd)
    } else {
        let m = crate::online::Moments { mean: a, m2: b };
        crate::online::finish_welford(em, hi, m, cd)
    }
}
