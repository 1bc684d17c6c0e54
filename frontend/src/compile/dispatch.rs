//! Temporary: the subset of graph ops the executor runs eagerly (replaced by
//! the full dispatch table).

use crate::functional as F;
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::{bail, Result};

/// Runs one graph op eagerly on tensors.
pub fn run_op(op: &Op, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    match op {
        Op::View(s) => one(x[0].reshape(s)),
        Op::Permute(p) => one(x[0].permute(p)),
        Op::Expand(s) => one(x[0].expand(s)),
        Op::Slice {
            dim,
            start,
            stop,
            step,
        } => one(x[0].slice(*dim, *start, *stop, *step)),
        Op::Select { dim, index } => one(x[0].select(*dim, *index)),
        Op::Matmul => one(F::matmul(&x[0], &x[1])),
        Op::Linear => one(F::linear(&x[0], &x[1], x.get(2))),
        Op::Conv { params, spatial: 2 } => one(F::conv2d(&x[0], &x[1], x.get(2), params)),
        Op::Conv { params, .. } => one(F::conv1d(&x[0], &x[1], x.get(2), params)),
        other => bail!("compile", "no eager dispatch for `{}` yet", other.name()),
    }
}
