//! The three legs of the differential test and how their values are compared.
//!
//! Tolerance, per element of a value of the reference `r` with error bound
//! `e` (see `kiln_ir::graph::eval`): an element marked unsure (it depends on
//! a comparison, floor, float-to-int cast or argmax too close to call) is not
//! compared; an integer or bool element must be equal; a float element must
//! satisfy `|got - r| <= atol + rtol * |r| + SAFETY * e`, with
//! f32: rtol 1e-4, atol 1e-5; f64: rtol 1e-9, atol 1e-12. The bound `e` is 0
//! for exact ops (views, neg, abs, relu, max), a few ulps for one rounded op,
//! and grows with reductions (n ulps of the summed magnitudes), cancellation
//! and the derivatives of later ops, so ill-conditioned graphs get the slack
//! they need and well-conditioned ones keep the tight baseline.

use kiln_frontend::compile::dispatch::run_op;
use kiln_frontend::compile::exec::{Executable, HoistCache};
use kiln_frontend::Tensor;
use kiln_ir::graph::eval::{Bounded, HostTensor, SAFETY};
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::DType;

pub fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::F64 => (1e-9, 1e-12),
        _ => (1e-4, 1e-5),
    }
}

/// Compares a kiln value with the reference; `Err` says where and how it differs.
pub fn compare(got: &Tensor, want: &Bounded) -> Result<usize, String> {
    let m = want.meta();
    if got.dims() != m.dims.as_slice() || got.dtype() != m.dtype {
        return Err(format!(
            "type {}{:?} but the reference is {m}",
            got.dtype(),
            got.dims()
        ));
    }
    let g = got.to_f64_vec();
    let r = &want.value.data;
    let (rtol, atol) = tolerance(m.dtype);
    let mut compared = 0;
    for i in 0..g.len() {
        if want.unsure[i] {
            continue;
        }
        compared += 1;
        let ok = if !m.dtype.is_float() || !r[i].is_finite() {
            g[i] == r[i] || (g[i].is_nan() && r[i].is_nan())
        } else {
            (g[i] - r[i]).abs() <= atol + rtol * r[i].abs() + SAFETY * want.err[i]
        };
        if !ok {
            return Err(format!(
                "element {i} of {m}: got {} want {} (error bound {:e}); got {:?} want {:?}",
                g[i],
                r[i],
                want.err[i],
                short(&g),
                short(r)
            ));
        }
    }
    Ok(compared)
}

/// Compares two reference values (the composite's own formula and its
/// decomposition, both in the reference interpreter) within their bounds together.
pub fn compare_reference(got: &Bounded, want: &Bounded) -> Result<(), String> {
    let m = want.meta();
    if got.meta() != m {
        return Err(format!("type {} but the reference is {m}", got.meta()));
    }
    let (g, r) = (&got.value.data, &want.value.data);
    let (rtol, atol) = tolerance(m.dtype);
    for i in 0..g.len() {
        if want.unsure[i] || got.unsure[i] {
            continue;
        }
        let e = atol + rtol * r[i].abs() + SAFETY * (want.err[i] + got.err[i]);
        let ok = if !m.dtype.is_float() || !r[i].is_finite() {
            g[i] == r[i] || (g[i].is_nan() && r[i].is_nan())
        } else {
            (g[i] - r[i]).abs() <= e
        };
        if !ok {
            return Err(format!(
                "element {i} of {m}: decomposed {} want {} (error bounds {:e}, {:e}); got {:?} want {:?}",
                g[i], r[i], got.err[i], want.err[i], short(g), short(r)
            ));
        }
    }
    Ok(())
}

fn short(v: &[f64]) -> Vec<f64> {
    v.iter().take(12).copied().collect()
}

pub fn to_tensor(h: &HostTensor) -> Tensor {
    Tensor::from_vec(h.data.clone(), &h.meta.dims)
        .and_then(|t| t.to_dtype(h.meta.dtype))
        .expect("host tensor converts")
}

/// Runs `g` compiled; returns its outputs.
pub fn compiled(
    g: &Graph,
    inputs: &[HostTensor],
    captured: &[bool],
) -> Result<Vec<Tensor>, String> {
    let g = kiln_passes::lower::decompose_composites(g).map_err(|e| e.to_string())?;
    let ts: Vec<Tensor> = inputs.iter().map(to_tensor).collect();
    let run = || {
        let exec = Executable::new(g, captured);
        exec.run(&ts, &[], &mut HoistCache::default())
    };
    match catch(run) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("compiled run failed: {e}")),
        Err(p) => Err(format!("compiled run panicked: {p}")),
    }
}

/// Runs `f`, turning a panic into its message (the seed loop goes on).
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

/// Runs `g` node by node with the eager ops; every single-valued node's value.
pub fn eager(g: &Graph, inputs: &[HostTensor]) -> Result<Vec<Option<Tensor>>, (NodeId, String)> {
    let mut vals: Vec<Option<Tensor>> = Vec::with_capacity(g.len());
    let mut tuples: Vec<Option<Vec<Tensor>>> = Vec::with_capacity(g.len());
    let mut next = 0;
    for (id, node) in g.iter() {
        let mut tuple = None;
        let v = match &node.op {
            NodeOp::Input { .. } => {
                next += 1;
                Some(to_tensor(&inputs[next - 1]))
            }
            NodeOp::Const(c) => {
                let n: usize = c.meta.dims.iter().product();
                let data = (0..n).map(|k| c.value(k)).collect();
                Some(to_tensor(&HostTensor {
                    meta: c.meta.clone(),
                    data,
                }))
            }
            NodeOp::Project(k) => tuples[node.operands[0].index()]
                .as_ref()
                .map(|t| t[*k].clone()),
            NodeOp::Op(op) => {
                let args: Vec<Tensor> = node
                    .operands
                    .iter()
                    .map(|o| vals[o.index()].clone().expect("operand has a value"))
                    .collect();
                let mut outs = match catch(|| run_op(op, &args)) {
                    Ok(r) => r.map_err(|e| (id, e.to_string()))?,
                    Err(p) => return Err((id, format!("panicked: {p}"))),
                };
                if node.metas.len() == 1 {
                    outs.pop()
                } else {
                    tuple = Some(outs);
                    None
                }
            }
        };
        vals.push(v);
        tuples.push(tuple);
    }
    Ok(vals)
}

/// The ancestors of `k` as a graph of their own with `k` as its output, and
/// which of the original inputs it takes.
pub fn cone(g: &Graph, k: NodeId) -> (Graph, Vec<usize>) {
    let mut keep = vec![false; g.len()];
    keep[k.index()] = true;
    for i in (0..=k.index()).rev() {
        if keep[i] {
            for o in &g.nodes()[i].operands {
                keep[o.index()] = true;
            }
        }
    }
    let mut out = Graph::new(format!("{}_cone", g.name()));
    let mut map = vec![None; g.len()];
    let mut used_inputs = Vec::new();
    for (id, node) in g.iter() {
        if !keep[id.index()] {
            continue;
        }
        if let NodeOp::Input { .. } = node.op {
            let pos = g.inputs().iter().position(|&x| x == id).expect("an input");
            used_inputs.push(pos);
        }
        let ops: Vec<NodeId> = node
            .operands
            .iter()
            .map(|o| map[o.index()].expect("kept"))
            .collect();
        map[id.index()] = Some(out.add(node.op.clone(), &ops, &node.metas).expect("copies"));
    }
    out.output(map[k.index()].expect("kept"))
        .expect("single value");
    (out, used_inputs)
}

/// After the compiled outputs differ: compiles the cone of each node in
/// order and returns the first node whose compiled value differs, with the
/// cone's text and the message.
pub fn first_compiled_mismatch(
    g: &Graph,
    inputs: &[HostTensor],
    captured: &[bool],
    reference: &[Option<Bounded>],
) -> Option<(NodeId, String, String)> {
    for (id, node) in g.iter() {
        if !matches!(node.op, NodeOp::Op(_)) || node.meta().is_none() {
            continue;
        }
        let (sub, used) = cone(g, id);
        let ins: Vec<HostTensor> = used.iter().map(|&i| inputs[i].clone()).collect();
        let cap: Vec<bool> = used.iter().map(|&i| captured[i]).collect();
        let want = reference[id.index()].as_ref().expect("single value");
        let msg = match compiled(&sub, &ins, &cap) {
            Ok(outs) => match compare(&outs[0], want) {
                Ok(_) => continue,
                Err(m) => m,
            },
            Err(m) => m,
        };
        return Some((id, sub.to_text(), msg));
    }
    None
}
