//! BatchNorm in eval mode folds into the conv (or linear) that feeds it:
//!
//! ```text
//! batch_norm(conv(x, w, b), mean, var, gamma, beta) {training=false, has_running_stats=true}
//!   => conv(x, w * view(s, [C,1,..]), (b - mean) * s + beta)    with s = gamma * rsqrt(var + eps)
//! ```
//!
//! (no conv bias: `b = 0`, so `-mean * s`; no affine: `gamma = 1`, `beta = 0`.)
//! The new weight and bias are ops on the parameter inputs, so they are
//! parameter-only: later stages compute them once per parameter version, and
//! the cost model counts them as nearly free. The rule never fires in train
//! mode or without running stats (the batch statistics depend on `x`), nor
//! when the conv's value has another use (a graph output or another op), which
//! would then need both convolutions.

use super::{add_op, data, meta, nodes_named, rw_named, Rw};
use crate::rewrite::analysis::KilnEGraph;
use egg::{Id, Subst};
use kiln_ir::graph::ScalarValue;
use kiln_ir::op::Op;
use kiln_ir::{BinaryOp, UnaryOp};
use std::collections::BTreeSet;

#[rustfmt::skip]
pub fn rules() -> Vec<Rw> { vec![
    rw_named("bn-fold-conv",   "batch_norm", fold_into_conv),   // bn_eval(conv(x,w,b)) = conv(x, w*s, (b-mean)*s+beta)
    rw_named("bn-fold-linear", "batch_norm", fold_into_linear), // bn_eval(linear(x,w,b)) over [N,C], the same
]}

/// The parts of an eval-mode BatchNorm with running stats.
struct Bn {
    x: Id,
    mean: Id,
    var: Id,
    gamma: Option<Id>,
    beta: Option<Id>,
    eps: f64,
}

fn eval_batch_norms(eg: &KilnEGraph, root: Id) -> Vec<Bn> {
    nodes_named(eg, root, "batch_norm")
        .filter_map(|(op, ch)| match op {
            Op::BatchNorm {
                training: false,
                has_running_stats: true,
                eps,
                has_weight,
                has_bias,
                ..
            } => {
                let mut rest = ch[3..].iter().copied();
                Some(Bn {
                    x: ch[0],
                    mean: ch[1],
                    var: ch[2],
                    gamma: if *has_weight { rest.next() } else { None },
                    beta: if *has_bias { rest.next() } else { None },
                    eps: eps.0,
                })
            }
            _ => None,
        })
        .collect()
}

/// Whether class `c` is used only by e-nodes of class `user` (and is no graph output).
fn only_used_by(eg: &KilnEGraph, c: Id, user: Id) -> bool {
    let c = eg.find(c);
    let user = eg.find(user);
    let parents: BTreeSet<Id> = eg[c].parents().map(|p| eg.find(p)).collect();
    let output = eg.analysis.outputs().iter().any(|&o| eg.find(o) == c);
    !output && parents.iter().all(|&p| p == user)
}

fn fold_into_conv(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold(eg, root, |op| matches!(op, Op::Conv { .. }))
}

fn fold_into_linear(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold(eg, root, |op| matches!(op, Op::Linear))
}

/// Folds every eval BatchNorm of class `root` whose input holds a producer
/// (`is_producer`: conv or linear, operands x, w, [b]) into that producer.
fn fold(eg: &mut KilnEGraph, root: Id, is_producer: fn(&Op) -> bool) -> Vec<Id> {
    let mut out = vec![];
    for bn in eval_batch_norms(eg, root) {
        if !only_used_by(eg, bn.x, root) {
            continue;
        }
        let producers: Vec<(Op, Vec<Id>)> = eg[bn.x]
            .nodes
            .iter()
            .filter_map(|n| n.as_op().map(|op| (op.clone(), n)))
            .filter(|(op, _)| is_producer(op))
            .map(|(op, n)| (op, egg::Language::children(n).to_vec()))
            .collect();
        for (op, ch) in producers {
            if let Some(id) = fold_one(eg, root, &bn, op, &ch) {
                out.push(id);
            }
        }
    }
    out
}

fn fold_one(eg: &mut KilnEGraph, root: Id, bn: &Bn, producer: Op, ch: &[Id]) -> Option<Id> {
    let (x, w, b) = (ch[0], ch[1], ch.get(2).copied());
    let wm = meta(eg, w)?.clone();
    let c = *wm.dims.first()?;
    // the BatchNorm's channel dim (1) must be the producer's output channel
    // (conv: always; linear: only over [N, C])
    let pm = meta(eg, bn.x)?;
    if pm.dims.len() < 2 || pm.dims[1] != c || (ch.len() == 3 && b.is_none()) {
        return None;
    }
    if matches!(producer, Op::Linear) && pm.dims.len() != 2 {
        return None;
    }
    let op = |eg: &mut KilnEGraph, op: Op, ins: &[Id]| add_op(eg, op, ins);
    let eps = Op::BinaryScalar {
        op: BinaryOp::Add,
        value: ScalarValue::Float(kiln_ir::Float(bn.eps)),
        reversed: false,
    };
    let ve = op(eg, eps, &[bn.var])?;
    let inv = op(eg, Op::Unary(UnaryOp::Rsqrt), &[ve])?;
    let scale = match bn.gamma {
        Some(g) => op(eg, Op::Binary(BinaryOp::Mul), &[g, inv])?,
        None => inv,
    };
    let mut shape = vec![c as i64];
    shape.resize(wm.dims.len(), 1);
    let sw = op(eg, Op::View(shape), &[scale])?;
    let w2 = op(eg, Op::Binary(BinaryOp::Mul), &[w, sw])?;
    let shift = match b {
        Some(b) => op(eg, Op::Binary(BinaryOp::Sub), &[b, bn.mean])?,
        None => op(eg, Op::Unary(UnaryOp::Neg), &[bn.mean])?,
    };
    let b2 = op(eg, Op::Binary(BinaryOp::Mul), &[shift, scale])?;
    let b2 = match bn.beta {
        Some(beta) => op(eg, Op::Binary(BinaryOp::Add), &[b2, beta])?,
        None => b2,
    };
    // the folded parameters keep the weight's type, the result the BatchNorm's
    if meta(eg, w2)? != &wm || meta(eg, b2)?.dims.as_slice() != [c] {
        return None;
    }
    let id = op(eg, producer, &[x, w2, b2])?;
    (meta(eg, id) == meta(eg, root) && data(eg, id).metas.len() == 1).then_some(id)
}

#[cfg(test)]
#[path = "batchnorm_fold_tests.rs"]
mod tests;
