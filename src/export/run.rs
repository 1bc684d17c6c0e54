//! Running an exported graph: guards on the inputs, then each node as the
//! eager op it was traced from (so a loaded model computes bit for bit what
//! the model's own eager code computed, and under `compile()` the replay is
//! traced again like any other code).

use super::{Dim, ExportedModel, Source};
use crate::compile::dispatch::run_op;
use crate::functional as F;
use crate::nn::{Entry, Module};
use crate::Tensor;
use kiln_ir::graph::{Graph, NodeOp};
use kiln_ir::op::Op;
use kiln_ir::{bail, Result};

/// Evaluates `g` with its inputs bound by `sources`.
pub(super) fn eval(
    g: &Graph,
    sources: &[Source],
    args: &[Tensor],
    weights: &[(String, Tensor)],
) -> Result<Vec<Tensor>> {
    let mut input_pos = vec![usize::MAX; g.len()];
    for (k, id) in g.inputs().iter().enumerate() {
        input_pos[id.index()] = k;
    }
    let mut left = g.use_counts();
    for o in g.outputs() {
        left[o.index()] += 1;
    }
    let mut vals: Vec<Vec<Tensor>> = Vec::with_capacity(g.len());
    for (id, node) in g.iter() {
        let v = match &node.op {
            NodeOp::Input { name } => {
                let k = input_pos[id.index()];
                match sources.get(k) {
                    Some(Source::Arg(i)) => vec![args[*i].clone()],
                    Some(Source::Weight(key)) => match weights.iter().find(|(n, _)| n == key) {
                        Some((_, t)) => vec![t.clone()],
                        None => bail!("export", "graph input `{name}`: no weight `{key}`"),
                    },
                    None => bail!("export", "graph input `{name}` has no source"),
                }
            }
            NodeOp::Const(c) => {
                let n = c.meta.dims.iter().product::<usize>();
                let v: Vec<f64> = (0..n).map(|k| c.value(k)).collect();
                vec![Tensor::from_vec(v, &c.meta.dims)?.to_dtype(c.meta.dtype)?]
            }
            NodeOp::Project(k) => vec![vals[node.operands[0].index()][*k].clone()],
            NodeOp::Op(op) => {
                let ins: Vec<Tensor> = node
                    .operands
                    .iter()
                    .map(|o| vals[o.index()][0].clone())
                    .collect();
                eager_op(op, &ins)?
            }
        };
        vals.push(v);
        // free what no later node reads
        for o in &node.operands {
            left[o.index()] -= 1;
            if left[o.index()] == 0 {
                vals[o.index()].clear();
            }
        }
    }
    Ok(g.outputs()
        .iter()
        .map(|o| vals[o.index()][0].clone())
        .collect())
}

/// `op` as the model's eager code ran it. Only convolution differs from
/// [`run_op`], which serves compiled graphs: there a conv times its
/// algorithms (as `cudnn.benchmark` does) and may pick one that rounds
/// differently from the fixed choice eager code makes.
fn eager_op(op: &Op, ins: &[Tensor]) -> Result<Vec<Tensor>> {
    match (op, ins) {
        (Op::Conv { params, spatial: 1 }, [x, w, rest @ ..]) => {
            Ok(vec![F::conv1d(x, w, rest.first(), params)?])
        }
        (Op::Conv { params, spatial: 2 }, [x, w, rest @ ..]) => {
            Ok(vec![F::conv2d(x, w, rest.first(), params)?])
        }
        _ => run_op(op, ins),
    }
}

impl ExportedModel {
    /// Checks `xs` against the input specs; returns the dynamic dims' sizes.
    pub(super) fn check_inputs(&self, xs: &[Tensor]) -> Result<Vec<usize>> {
        if xs.len() != self.inputs.len() {
            bail!(
                "export",
                "`{}` takes {} inputs ({}), got {}",
                self.name,
                self.inputs.len(),
                self.signature(),
                xs.len()
            );
        }
        let mut sizes: Vec<Option<(usize, String)>> = vec![None; self.dim_names.len()];
        for (x, spec) in xs.iter().zip(&self.inputs) {
            let shown = crate::ir::shape::fmt_dims(x.dims());
            if x.dtype() != spec.dtype {
                bail!(
                    "export",
                    "input `{}`: expected dtype {}, got {} (shape {shown}; the model takes {spec})",
                    spec.name,
                    spec.dtype,
                    x.dtype()
                );
            }
            if x.rank() != spec.dims.len() {
                bail!(
                    "export",
                    "input `{}`: expected rank {} ({spec}), got rank {} (shape {shown})",
                    spec.name,
                    spec.dims.len(),
                    x.rank()
                );
            }
            for (i, (d, want)) in x.dims().iter().zip(&spec.dims).enumerate() {
                match want {
                    Dim::Fixed(n) if n != d => bail!(
                        "export",
                        "input `{}`: dim {i} must be {n} ({spec}), got {d} (shape {shown})",
                        spec.name
                    ),
                    Dim::Fixed(_) => {}
                    Dim::Dynamic(name) => {
                        let k = self.dim_names.iter().position(|n| n == name).unwrap();
                        match &sizes[k] {
                            Some((s, other)) if s != d => bail!(
                                "export",
                                "input `{}`: dim {i} (`{name}`) is {d}, but input `{other}` has `{name}` = {s}",
                                spec.name
                            ),
                            Some(_) => {}
                            None => sizes[k] = Some((*d, spec.name.clone())),
                        }
                    }
                }
            }
        }
        Ok(sizes.into_iter().map(|s| s.unwrap().0).collect())
    }
}

/// A loaded model is a module: `compile(&loaded)` compiles it (one input, one
/// output; [`ExportedModel::forward`] takes any number). Its weights are
/// buffers, named by their keys, and it is always in eval mode.
impl Module for ExportedModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = ExportedModel::forward(self, std::slice::from_ref(x))?;
        if out.len() != 1 {
            bail!(
                "export",
                "`{}` returns {} outputs; call ExportedModel::forward for all of them",
                self.name,
                out.len()
            );
        }
        Ok(out.swap_remove(0))
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (k, t) in &self.weights {
            f(Entry::Buffer(k, t));
        }
    }

    fn is_training(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("ExportedModel{}", self.signature())
    }
}
