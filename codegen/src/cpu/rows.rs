//! The row pass of a reduction kernel ([`crate::kernel::RowPass`]): after
//! the epilogue, the row is walked again and one value per element is
//! stored to operand 1. The epilogue's values are known per row (splatted
//! once before the vector loop); loads re-read the row, which the reduction
//! has just brought into cache. With a vector plan: an f32x4/f64x2 loop
//! unrolled twice, then a scalar tail, as a pointwise row.
//!
//! When the stored value is a transcendental with a wide helper (softmax's
//! exp) and the emitter may use the helpers, the loops store its argument
//! and the helper then rewrites the output row in place (AVX2/AVX-512, the
//! f32x4 code's bits), while the row is in L1.
//!
//! A normalisation's pass, `((x - mean) * rstd) [* w] [+ b]` over input
//! rows, is one call of the affine helper instead (`wide/affine.rs`).
//!
//! ```text
//! softmax row:    for i: out1[i] = (x[i] - shift) - logsum   (f32x4)
//!                 kiln_wide_unary(exp, out1, n)               (f32x8 / f32x16)
//! layer_norm row: kiln_wide_affine(&{x, w, b, out1, n, mean, rstd})
//! ```

use super::emit::{flags, Emitter};
use super::jit::HostFn;
use super::loops::{for_loop, Row};
use super::plan::{row_pass_plan, Plan};
use super::softmax_row::StoredExp;
use super::wide;
use crate::kernel::{Inner, Instr, Kernel, ValueId};
use cranelift_codegen::ir::{types, InstBuilder, StackSlotData, StackSlotKind, Value};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::{BinaryOp, DType, UnaryOp};

/// Emits the row pass of `k` for the row at `ptrs`; `epi[id]` holds the
/// epilogue values (scalar) the pass uses. With `stored`, operand 1's row
/// already holds that exp's argument's exp (see `softmax_row.rs`).
pub(crate) fn row_pass(
    k: &Kernel,
    em: &mut Emitter,
    fr: &super::loops::Frame,
    ptrs: &[Value],
    epi: &[Option<Value>],
    stored: Option<StoredExp>,
) {
    let rows = k.rows.as_ref().expect("a row pass");
    let plan = row_pass_plan(k);
    let wide_op = match stored {
        None => wide_root(k, em, &plan),
        Some(_) => None,
    };
    let root = match wide_op {
        Some((_, arg)) => arg,
        None => rows.out,
    };
    let row = Row {
        k,
        fr,
        ptrs,
        loaded: loaded(k),
    };
    let hi = fr.sizes[k.rank - 1];
    if stored.is_none() {
        if let Some(a) = affine_pass(k, em, &plan, epi) {
            let launch = fr.launch_elements(em);
            let next = fr.next_row(em, k.rank, ptrs[a.x], a.x);
            return affine_call(em, ptrs, &a, [hi, launch, next]);
        }
    }
    let lo = em.b.ins().iconst(types::I64, 0);
    let mut tail_lo = lo;
    if plan.lanes > 1 {
        let lanes = plan.lanes as i64;
        let step = lanes * plan.unroll as i64;
        let main_end = em.b.ins().band_imm_s(hi, !(step - 1));
        let vbytes = (lanes * plan.vdt.size() as i64) as i32;
        em.lanes = plan.lanes;
        for_loop(
            em,
            lo,
            main_end,
            step,
            |em| {
                let scale = stored.map(|st| em.splat_if_vector(st.scale, DType::F32));
                (row.preload(em), splat(k, em, epi), scale)
            },
            |em, i, (pre, known, scale)| {
                let at = row.addr(em, 1, i);
                for u in 0..plan.unroll as i32 {
                    let mut known = known.clone();
                    if let (Some(st), Some(scale)) = (stored, *scale) {
                        known[st.exp] = Some(stored_value(em, at, u * vbytes, scale));
                    }
                    let v = row.eval_known(em, &[root], i, u * vbytes, pre, known)[0];
                    em.b.ins().store(flags(), v, at, u * vbytes);
                }
            },
        );
        tail_lo = main_end;
    }
    em.lanes = 1;
    for_loop(
        em,
        tail_lo,
        hi,
        1,
        |em| row.preload(em),
        |em, i, pre| {
            let at = row.addr(em, 1, i);
            let mut known = epi.to_vec();
            if let Some(st) = stored {
                known[st.exp] = Some(stored_value(em, at, 0, st.scale));
            }
            let v = row.eval_known(em, &[root], i, 0, pre, known)[0];
            let to = k.operands[1].dtype;
            let v = em.cast(v, k.dtype_of(root), to);
            em.b.ins().store(flags(), v, at, 0);
        },
    );
    if let Some((op, _)) = wide_op {
        let f = em.hosts.get(em.b.func, HostFn::WideUnary);
        let code = wide::op_code(op).expect("a wide op") as i64;
        let code = em.b.ins().iconst(types::I64, code);
        em.b.ins().call(f, &[code, ptrs[1], hi]);
    }
}

/// A row pass `((x - mean) * rstd) [* w] [+ b]`: a normalisation's, with
/// `x`, `w` and `b` rows of contiguous f32 inputs and `mean`, `rstd`
/// epilogue values (see `wide/affine.rs`).
struct Affine {
    x: usize,
    w: Option<usize>,
    b: Option<usize>,
    mean: Value,
    rstd: Value,
}

/// The row pass of `k` as an [`Affine`] one, when the emitter may use the
/// row helpers and the pass has that form (either operand order of the
/// multiplies and the add).
fn affine_pass(k: &Kernel, em: &Emitter, plan: &Plan, epi: &[Option<Value>]) -> Option<Affine> {
    let rows = k.rows.as_ref()?;
    if !em.wide.rows || plan.lanes != 4 || plan.vdt != DType::F32 {
        return None;
    }
    let load = |id: ValueId| match k.instr(id) {
        (Instr::Load(op), DType::F32) => {
            let o = k.operands[op];
            let row = o.dtype == DType::F32 && o.inner == Inner::Contiguous;
            (row && op >= k.outputs()).then_some(op)
        }
        _ => None,
    };
    let known = |id: ValueId| {
        let epilogue = k.body.len()..k.body.len() + k.epilogue.len();
        (epilogue.contains(&id) && k.dtype_of(id) == DType::F32).then(|| epi[id])?
    };
    // `l op r` as (the other operand, the loaded row), either way round
    let with_row = |id: ValueId, want: BinaryOp| match k.instr(id) {
        (Instr::Binary(op, l, r), DType::F32) if op == want => {
            load(r).map(|o| (l, o)).or_else(|| load(l).map(|o| (r, o)))
        }
        _ => None,
    };
    let mut v = rows.out;
    let b = with_row(v, BinaryOp::Add).map(|(rest, o)| {
        v = rest;
        o
    });
    let w = with_row(v, BinaryOp::Mul).map(|(rest, o)| {
        v = rest;
        o
    });
    let (Instr::Binary(BinaryOp::Mul, l, r), DType::F32) = k.instr(v) else {
        return None;
    };
    let (centred, rstd) = match (known(r), known(l)) {
        (Some(s), _) => (l, s),
        (None, Some(s)) => (r, s),
        _ => return None,
    };
    let (Instr::Binary(BinaryOp::Sub, x, mean), DType::F32) = k.instr(centred) else {
        return None;
    };
    Some(Affine {
        x: load(x)?,
        w,
        b,
        mean: known(mean)?,
        rstd,
    })
}

/// Calls the affine row helper on the whole row `0..hi` (a
/// [`wide::AffineRow`] on the stack) of a launch of `launch` elements,
/// whose next input row is at `next`.
fn affine_call(em: &mut Emitter, ptrs: &[Value], a: &Affine, [hi, launch, next]: [Value; 3]) {
    let slot = em.b.create_sized_stack_slot(StackSlotData::new(
        StackSlotKind::ExplicitSlot,
        std::mem::size_of::<wide::AffineRow>() as u32,
        3,
    ));
    em.lanes = 1;
    let base = em.b.ins().stack_addr(types::I64, slot, 0);
    let null = em.b.ins().iconst(types::I64, 0);
    let row = |op: Option<usize>| op.map_or(null, |op| ptrs[op]);
    use std::mem::offset_of;
    use wide::AffineRow as R;
    let fields = [
        (row(Some(a.x)), offset_of!(R, x)),
        (row(a.w), offset_of!(R, w)),
        (row(a.b), offset_of!(R, b)),
        (ptrs[1], offset_of!(R, out)),
        (next, offset_of!(R, next)),
        (hi, offset_of!(R, n)),
        (launch, offset_of!(R, launch)),
        (a.mean, offset_of!(R, mean)),
        (a.rstd, offset_of!(R, rstd)),
    ];
    for (v, at) in fields {
        em.b.ins().store(flags(), v, base, at as i32);
    }
    let f = em.hosts.get(em.b.func, HostFn::WideAffine);
    em.b.ins().call(f, &[base]);
}

/// `exp(v - shift)` read back from the output row, times `1 / s`.
fn stored_value(em: &mut Emitter, at: Value, off: i32, scale: Value) -> Value {
    let t = em.ty(DType::F32);
    let e = em.b.ins().load(t, flags(), at, off);
    em.b.ins().fmul(e, scale)
}

/// The wide op and its argument when the row pass stores `op(arg)` with a
/// wide helper for `op`, in f32 on vectors, and the emitter may call it.
fn wide_root(k: &Kernel, em: &Emitter, plan: &Plan) -> Option<(UnaryOp, ValueId)> {
    let rows = k.rows.as_ref()?;
    let on = em.wide.rows && plan.lanes == 4 && plan.vdt == DType::F32;
    match k.instr(rows.out) {
        (Instr::Unary(op, a), DType::F32) if on && k.dtype_of(a) == DType::F32 => {
            wide::op_code(op).map(|_| (op, a))
        }
        _ => None,
    }
}

/// `epi` splatted to vectors (the current lane count).
fn splat(k: &Kernel, em: &mut Emitter, epi: &[Option<Value>]) -> Vec<Option<Value>> {
    epi.iter()
        .enumerate()
        .map(|(id, v)| v.map(|v| em.splat_if_vector(v, k.dtype_of(id))))
        .collect()
}

/// The operands the row pass loads.
fn loaded(k: &Kernel) -> Vec<usize> {
    let rows = k.rows.as_ref().expect("a row pass");
    let mut ops: Vec<usize> = rows
        .instrs
        .iter()
        .filter_map(|(ins, _)| match ins {
            Instr::Load(op) => Some(*op),
            _ => None,
        })
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}
