//! A compiled graph's values while it runs ([`Val`]), and the pointwise
//! ops and one-pass reduction results the executor builds them from.

use crate::ops::fuse::{Fuser, Lazy};
use crate::{Scalar, Tensor};
use kiln_ir::graph::ScalarValue;
use kiln_ir::op::Op;
use kiln_ir::{bail, Result};
use kiln_passes::decompose::Builder;

/// A node's value while the graph runs: a tensor or pending expression, or
/// a tuple's parts.
pub(super) enum Val {
    One(Lazy),
    Many(Vec<Tensor>),
    /// The parts of a one-pass reduction that its reader runs as a row
    /// pass (`FusionPlan::row_pass_of`): nothing has run yet.
    Parts(Vec<Lazy>),
}

impl Val {
    pub(super) fn lazy(&self) -> Result<&Lazy> {
        match self {
            Val::One(l) => Ok(l),
            Val::Many(_) | Val::Parts(_) => bail!("compile", "a tuple value used as a tensor"),
        }
    }
}

/// A pointwise op applied to pending expressions (it stays pending).
pub(super) fn pointwise(op: &Op, a: &[&Lazy]) -> Result<Lazy> {
    let f = &mut Fuser;
    match op {
        Op::Unary(u) => f.unary(*u, a[0]),
        Op::Binary(b) => f.binary(*b, a[0], a[1]),
        Op::BinaryScalar {
            op,
            value,
            reversed,
        } => f.binary_scalar(*op, a[0], scalar(*value), *reversed),
        Op::Where => f.select(a[0], a[1], a[2]),
        Op::Cast(dt) => f.cast(a[0], *dt),
        other => bail!("compile", "`{}` is not pointwise", other.name()),
    }
}

/// A one-pass reduction's value: its parts as tensors once it has run, or
/// pending until the reader that runs it as its row pass.
pub(super) fn parts(ps: Vec<Lazy>) -> Result<Val> {
    if ps.iter().all(|p| p.as_leaf().is_some()) {
        return ps
            .iter()
            .map(|p| p.materialize())
            .collect::<Result<_>>()
            .map(Val::Many);
    }
    Ok(Val::Parts(ps))
}

fn scalar(v: ScalarValue) -> Scalar {
    match v {
        ScalarValue::Bool(b) => Scalar::Bool(b),
        ScalarValue::Int(i) => Scalar::Int(i),
        ScalarValue::Float(f) => Scalar::Float(f.0),
    }
}
