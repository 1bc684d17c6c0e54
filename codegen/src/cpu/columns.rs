//! Reductions along a strided dim whose neighbouring output elements are
//! neighbours in memory — a Linear bias gradient, `dy.sum(0)` of a row-major
//! `[batch, features]` — reduced 64 bytes of outputs at a time.
//!
//! The row-at-a-time loop (`reduce.rs`) reads such a row with a stride and
//! adds it into one scalar accumulator: a chain of dependent adds, about 4
//! cycles an element. W6's two bias gradients (`[256, 1024]`, summed over
//! the batch) took 0.37 ms each. Here the dim outside the reduced one is
//! walked in blocks of 16 f32 (8 f64): each element of the reduced dim is a few
//! vector loads across the block, each vector its own accumulator. Every
//! output still adds its elements in order into one accumulator that starts
//! at the identity, so the bits are those of the row loop.
//!
//! It applies to Sum/Prod/Max/Min accumulating in the f32/f64 dtype every
//! loaded value has, with every loaded operand strided or broadcast along
//! the reduced dim (a contiguous one takes the row loop's vector or
//! PyTorch-order path) and no row pass; at run time, every loaded operand
//! must also be contiguous along the outer dim, else the row loop runs.
//! The epilogue and the stores run per output, scalar, as in the row loop.

use super::emit::Emitter;
use super::loops::{for_loop, loaded_operands, Frame, Row};
use super::plan::Plan;
use crate::interp::reduce_identity;
use crate::kernel::{Inner, Kernel};
use crate::online::Finished;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::{DType, ReduceKind};

/// Bytes of outputs reduced together: four f32x4 (or f64x2) accumulators,
/// enough independent chains to hide the add latency.
const BLOCK_BYTES: i64 = 64;

/// Outputs of dtype `dt` in one block (16 f32, 8 f64).
fn columns(dt: DType) -> i64 {
    BLOCK_BYTES / dt.size() as i64
}

/// The vector plan of `k`'s column blocks, or `None` when it does not apply.
pub(crate) fn plan(k: &Kernel) -> Option<Plan> {
    let r = k.reduce.as_ref()?;
    let kind_ok = matches!(
        r.kind,
        ReduceKind::Sum | ReduceKind::Prod | ReduceKind::Max | ReduceKind::Min
    );
    if !kind_ok || k.rank < 2 || k.rows.is_some() || !matches!(r.dtype, DType::F32 | DType::F64) {
        return None;
    }
    let loaded = loaded_operands(k, r.value);
    let strided = loaded
        .iter()
        .any(|&op| k.operands[op].inner == Inner::Strided);
    let no_contiguous = loaded
        .iter()
        .all(|&op| k.operands[op].inner != Inner::Contiguous);
    // Whether the body would vectorise if its strided loads were contiguous.
    let as_rows = Kernel {
        operands: k
            .operands
            .iter()
            .map(|&o| match o.inner {
                Inner::Strided => crate::kernel::Operand {
                    inner: Inner::Contiguous,
                    ..o
                },
                _ => o,
            })
            .collect(),
        ..k.clone()
    };
    let p = Plan::of(&as_rows);
    (strided && no_contiguous && p.lanes > 1 && p.vdt == r.dtype).then_some(p)
}

/// Emits the loop over the dim outside the reduced one (`d = rank - 2`,
/// `lo..hi`): column blocks when every loaded operand is contiguous along
/// it, then the remaining outputs (or all of them, when one is not) one
/// row at a time through `row_at(em, j)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn outer_loop(
    k: &Kernel,
    em: &mut Emitter,
    fr: &Frame,
    plan: Plan,
    lo: Value,
    hi: Value,
    ptrs: &[Value],
    row_at: &dyn Fn(&mut Emitter, Value),
) {
    let r = k.reduce.as_ref().expect("a reduction");
    let d = k.rank - 2;
    let cols = columns(r.dtype);
    let size = r.dtype.size() as i64;
    let loaded = loaded_operands(k, r.value);
    // every loaded operand steps one element along d
    let mut ok = em.b.ins().iconst(cranelift_codegen::ir::types::I8, 1);
    for &op in &loaded {
        let c = em.b.ins().icmp_imm_s(IntCC::Equal, fr.bstr[op][d], size);
        ok = em.b.ins().band(ok, c);
    }
    let count = em.b.ins().isub(hi, lo);
    let whole = em.b.ins().band_imm_s(count, !(cols - 1));
    let zero = em.b.ins().iconst(cranelift_codegen::ir::types::I64, 0);
    let blocks = em.b.ins().select(ok, whole, zero);
    let block_end = em.b.ins().iadd(lo, blocks);
    for_loop(
        em,
        lo,
        block_end,
        cols,
        |_| (),
        |em, j, _| {
            let at = super::loops::step_ptrs(em, fr, d, j, ptrs);
            block(k, em, fr, plan, &at);
        },
    );
    for_loop(em, block_end, hi, 1, |_| (), |em, j, _| row_at(em, j));
}

/// One block of `columns` outputs starting at `ptrs`.
fn block(k: &Kernel, em: &mut Emitter, fr: &Frame, plan: Plan, ptrs: &[Value]) {
    let r = k.reduce.as_ref().expect("a reduction");
    let (cd, d) = (r.dtype, k.rank - 2);
    let regs = (columns(cd) / plan.lanes as i64) as usize;
    let vbytes = 16;
    let loaded = loaded_operands(k, r.value);
    // the block's u-th vector: every loaded operand `u * 16` bytes on
    let rows: Vec<Vec<Value>> = (0..regs)
        .map(|u| {
            ptrs.iter()
                .map(|&p| em.b.ins().iadd_imm_s(p, (u as i64) * vbytes))
                .collect()
        })
        .collect();
    em.lanes = plan.lanes;
    let vt = em.ty(cd);
    let init = em.constant(reduce_identity(r.kind, cd), cd);
    let accs: Vec<_> = (0..regs)
        .map(|_| {
            let v = em.b.declare_var(vt);
            em.b.def_var(v, init);
            v
        })
        .collect();
    let prim = super::reduce::combine_prim(r.kind);
    let lo = em.b.ins().iconst(cranelift_codegen::ir::types::I64, 0);
    for_loop(
        em,
        lo,
        fr.sizes[k.rank - 1],
        1,
        |em| {
            // broadcast along the reduced dim: one vector per block, loaded once
            rows.iter()
                .map(|at| {
                    let mut pre = vec![None; k.operands.len()];
                    for &op in &loaded {
                        let o = k.operands[op];
                        if o.inner == Inner::Broadcast {
                            let t = em.ty(o.dtype);
                            pre[op] = Some(em.b.ins().load(t, super::emit::flags(), at[op], 0));
                        }
                    }
                    pre
                })
                .collect::<Vec<_>>()
        },
        |em, i, pre| {
            for (u, at) in rows.iter().enumerate() {
                let row = Row {
                    k,
                    fr,
                    ptrs: at,
                    loaded: loaded.clone(),
                };
                let v = row.eval(em, r.value, i, 0, &pre[u]);
                let a = em.b.use_var(accs[u]);
                let a = em.binary(prim, a, v, cd);
                em.b.def_var(accs[u], a);
            }
        },
    );
    // each lane is one output: its epilogue and stores, scalar
    let vals: Vec<Value> = accs.iter().map(|&a| em.b.use_var(a)).collect();
    for (u, v) in vals.into_iter().enumerate() {
        for l in 0..plan.lanes {
            em.lanes = 1;
            let s = em.b.ins().extractlane(v, l as u8);
            let col = (u as i64) * plan.lanes as i64 + l as i64;
            let at: Vec<Value> = ptrs
                .iter()
                .enumerate()
                .map(|(op, &p)| {
                    let off = em.b.ins().imul_imm_s(fr.bstr[op][d], col);
                    em.b.ins().iadd(p, off)
                })
                .collect();
            let fin = Finished {
                acc: s,
                first: s,
                second: s,
            };
            super::reduce::epilogue(k, em, fr, &at, fin, cd, None);
        }
    }
}
