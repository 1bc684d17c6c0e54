//! Rows of the one-pass reductions of [`crate::online`] (log-sum-exp and
//! Welford): with a vector plan, `unroll` vector states (each lane its own
//! running state) over the vector part of the row, merged lane-wise and then
//! lane by lane; then the scalar tail pushes into the merged state. The
//! state updates are [`crate::online`]'s, emitted through [`ScalarOps`].
//!
//! Welford needs `1 / n` for each value's position: the vector part's
//! iteration `i / step` gives every lane and unrolled state its
//! `(i / step + 1)`-th value (one scalar division per iteration, splatted),
//! and in the tail the element at index `i` is the `(i + 1)`-th of the row.
//!
//! Where the wide helpers are on, f32 rows go through tiles instead
//! (`tiles::tiled_online_row`): one exp per element, two passes over each
//! tile in L1.

use super::emit::Emitter;
use super::loops::{for_loop, Row};
use super::plan::Plan;
use crate::online::{self, Finished, Lse, Moments};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::Variable;
use kiln_ir::scalar::ScalarOps;
use kiln_ir::{DType, ReduceKind};

/// Two variables holding a two-value state in the current mode.
#[derive(Clone, Copy)]
struct Vars(Variable, Variable);

impl Vars {
    fn new(em: &mut Emitter, dt: DType, init: (Value, Value)) -> Vars {
        let t = em.ty(dt);
        let (a, b) = (em.b.declare_var(t), em.b.declare_var(t));
        em.b.def_var(a, init.0);
        em.b.def_var(b, init.1);
        Vars(a, b)
    }
    fn get(self, em: &mut Emitter) -> (Value, Value) {
        (em.b.use_var(self.0), em.b.use_var(self.1))
    }
    fn set(self, em: &mut Emitter, v: (Value, Value)) {
        em.b.def_var(self.0, v.0);
        em.b.def_var(self.1, v.1);
    }
}

fn lse(v: (Value, Value)) -> Lse<Value> {
    Lse { m: v.0, s: v.1 }
}

fn moments(v: (Value, Value)) -> Moments<Value> {
    Moments { mean: v.0, m2: v.1 }
}

/// The finished online reduction of `value` over `lo..hi` (lo is 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn online_row(
    em: &mut Emitter,
    row: &Row,
    plan: &Plan,
    value: usize,
    kind: ReduceKind,
    vd: DType,
    cd: DType,
    lo: Value,
    hi: Value,
) -> Finished<Value> {
    let is_lse = kind == ReduceKind::LogSumExp;
    if let Some(fin) = super::tiles::tiled_online_row(em, row, plan, value, is_lse, (vd, cd), hi) {
        return fin;
    }
    let init = |em: &mut Emitter| {
        if is_lse {
            let st = online::lse_init(em, cd);
            (st.m, st.s)
        } else {
            let st = online::welford_init(em, cd);
            (st.mean, st.m2)
        }
    };
    em.lanes = 1;
    let init_s = init(em);
    let acc = Vars::new(em, cd, init_s);
    let mut tail_lo = lo;
    if plan.lanes > 1 {
        let lanes = plan.lanes as i64;
        let step = lanes * plan.unroll as i64;
        let nm = em.b.ins().band_imm_s(hi, !(step - 1));
        let vbytes = (lanes * plan.vdt.size() as i64) as i32;
        em.lanes = plan.lanes;
        let init_v = init(em);
        let vacc: Vec<Vars> = (0..plan.unroll)
            .map(|_| Vars::new(em, cd, init_v))
            .collect();
        for_loop(
            em,
            lo,
            nm,
            step,
            |em| row.preload(em),
            |em, i, pre| {
                let inv = (!is_lse).then(|| {
                    em.lanes = 1;
                    let it = em.b.ins().ushr_imm_u(i, step.trailing_zeros() as i64);
                    let n = em.b.ins().iadd_imm_s(it, 1);
                    let inv = online::inv_count(em, n, cd);
                    em.lanes = plan.lanes;
                    em.splat_if_vector(inv, cd)
                });
                for (u, &va) in vacc.iter().enumerate() {
                    let x = row.eval(em, value, i, u as i32 * vbytes, pre);
                    let st = va.get(em);
                    let next = match inv {
                        None => {
                            let s = online::lse_push(em, lse(st), x, cd);
                            (s.m, s.s)
                        }
                        Some(inv) => {
                            let s = online::welford_push(em, moments(st), x, inv, cd);
                            (s.mean, s.m2)
                        }
                    };
                    va.set(em, next);
                }
            },
        );
        // Every lane of every vector state holds `nm / step` values.
        em.lanes = 1;
        let it = em.b.ins().ushr_imm_u(nm, step.trailing_zeros() as i64);
        let c = em.cast(it, DType::I64, cd);
        em.lanes = plan.lanes;
        let mut cv = em.splat_if_vector(c, cd);
        let mut st = vacc[0].get(em);
        for &va in &vacc[1..] {
            let o = va.get(em);
            st = merge(em, is_lse, (cv, st), (cv, o), cd);
            cv = em.b.ins().fadd(cv, cv);
        }
        em.lanes = 1;
        let lane_n = em.b.ins().extractlane(cv, 0);
        let mut n = lane_n;
        let mut s = (
            em.b.ins().extractlane(st.0, 0),
            em.b.ins().extractlane(st.1, 0),
        );
        for l in 1..plan.lanes as u8 {
            let o = (
                em.b.ins().extractlane(st.0, l),
                em.b.ins().extractlane(st.1, l),
            );
            s = merge(em, is_lse, (n, s), (lane_n, o), cd);
            n = em.b.ins().fadd(n, lane_n);
        }
        acc.set(em, s);
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
            let x = row.eval(em, value, i, 0, pre);
            let x = em.cast(x, vd, cd);
            let st = acc.get(em);
            let next = if is_lse {
                let s = online::lse_push(em, lse(st), x, cd);
                (s.m, s.s)
            } else {
                let n = em.b.ins().iadd_imm_s(i, 1);
                let inv = online::inv_count(em, n, cd);
                let s = online::welford_push(em, moments(st), x, inv, cd);
                (s.mean, s.m2)
            };
            acc.set(em, next);
        },
    );
    let st = acc.get(em);
    if is_lse {
        online::finish_lse(em, lse(st), cd)
    } else {
        online::finish_welford(em, hi, moments(st), cd)
    }
}

/// Merges two states holding `na` and `nb` values (float counts; ignored by log-sum-exp).
fn merge(
    em: &mut Emitter,
    is_lse: bool,
    (na, a): (Value, (Value, Value)),
    (nb, b): (Value, (Value, Value)),
    cd: DType,
) -> (Value, Value) {
    if is_lse {
        let s = online::lse_merge(em, lse(a), lse(b), cd);
        (s.m, s.s)
    } else {
        let s = online::welford_merge(em, (na, moments(a)), (nb, moments(b)), cd);
        (s.mean, s.m2)
    }
}
