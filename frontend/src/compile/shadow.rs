//! Shadow mode: run eager alongside compiled and, on a mismatch, rerun the
//! compiled graph kernel by kernel against an eager node-by-node run of the
//! traced graph, to name the first fused kernel whose output diverges.
//!
//! Kernels are matched to traced nodes through `origin` (where each planned
//! node came from: the node it was rewritten from, or the composite it
//! decomposes); kernels inside a decomposition have no traced counterpart and
//! are compared through the composite's root.

use super::dispatch::run_op;
use super::exec::Executable;
use crate::Tensor;
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::{bail, Result};

/// Largest `|a - b| / (1 + |b|)` over the elements, or `None` if the shapes differ.
pub fn max_error(a: &Tensor, b: &Tensor) -> Option<f64> {
    if a.dims() != b.dims() {
        return None;
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    Some(x.iter().zip(&y).fold(0.0, |m: f64, (p, q)| {
        let e = if p == q || (p.is_nan() && q.is_nan()) {
            0.0
        } else {
            (p - q).abs() / (1.0 + q.abs())
        };
        m.max(if e.is_nan() { f64::INFINITY } else { e })
    }))
}

/// Every node of `g` run with eager ops (the reference for shadow mode).
pub fn eval_eager(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Vec<Tensor>>> {
    let mut vals: Vec<Vec<Tensor>> = Vec::with_capacity(g.len());
    let mut next_input = 0;
    for (_, node) in g.iter() {
        let v = match &node.op {
            NodeOp::Input { .. } => {
                next_input += 1;
                vec![inputs[next_input - 1].clone()]
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
                run_op(op, &ins)?
            }
        };
        vals.push(v);
    }
    Ok(vals)
}

fn describe(g: &Graph, id: NodeId) -> String {
    let num = g.numbering();
    let n = g.node(id);
    let ty = n.meta().map(|m| m.to_string()).unwrap_or_default();
    let ops: Vec<String> = n
        .operands
        .iter()
        .map(|o| format!("%{}", num[o.index()]))
        .collect();
    format!(
        "%{} = {}({}) : {ty}",
        num[id.index()],
        n.op_name(),
        ops.join(", ")
    )
}

#[allow(clippy::too_many_arguments)]
/// Compares compiled and eager outputs; on a mismatch beyond `tol`, finds the
/// first diverging kernel and returns an error describing it.
pub fn check(
    name: &str,
    traced: &Graph,
    exec: &Executable,
    origin: &[Option<NodeId>],
    inputs: &[Tensor],
    compiled: &[Tensor],
    eager: &[Tensor],
    tol: f64,
) -> Result<()> {
    let mut worst = None;
    for (k, (c, e)) in compiled.iter().zip(eager).enumerate() {
        match max_error(c, e) {
            Some(err) if err <= tol => {}
            err => {
                worst = Some((k, err));
                break;
            }
        }
    }
    let Some((out, err)) = worst else {
        return Ok(());
    };
    let err = err.map_or("shapes differ".into(), |e| format!("max error {e:.3e}"));
    let reference = eval_eager(traced, inputs)?;
    let _ng = crate::autograd::no_grad();
    for (i, run) in exec.run_each_kernel(inputs)?.iter().enumerate() {
        let Some(o) = origin.get(run.node.index()).copied().flatten() else {
            continue;
        };
        let Some(want) = reference[o.index()].first() else {
            continue;
        };
        let e = max_error(&run.value, want);
        if e.is_some_and(|e| e <= tol) {
            continue;
        }
        let ir: String = run
            .kernels
            .iter()
            .map(|k| k.to_text())
            .collect::<Vec<_>>()
            .join("\n");
        bail!(
            "compile",
            "shadow check of `{name}`: output {out} differs from eager ({err}, tolerance {tol}); \
             first diverging kernel: #{i} computing {} (traced {}), {}\n{}",
            describe(&exec.graph, run.node),
            describe(traced, o),
            e.map_or("shapes differ".into(), |e| format!("max error {e:.3e}")),
            if ir.is_empty() {
                "(an extern kernel)".into()
            } else {
                ir
            }
        );
    }
    bail!(
        "compile",
        "shadow check of `{name}`: output {out} differs from eager ({err}, tolerance {tol}), \
         but no single kernel with a traced counterpart diverges"
    )
}
