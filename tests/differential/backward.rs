//! The backward mode of the differential test: compiled gradients
//! (`compile_fn` + `.backward()`, a joint forward+backward trace split into
//! compiled halves) against eager gradients (the same function run eagerly +
//! `.backward()`).
//!
//! A generated graph (`gen.rs`) becomes a function of its non-captured
//! inputs and one weight `w_k` per float output, returning one scalar loss
//! `sum_k sum(out_k * w_k)` (accumulated in f64); the weights are arguments
//! that do not require grad. Every float input requires grad: the free ones
//! are arguments, the captured ones are tensors the function captures (as a
//! module captures its parameters), so both gradient paths of the joint
//! trace run. Gradients flow only through the float path: integer and bool
//! values (casts, comparisons, argmax) stop them, as in eager.
//!
//! Each graph is called twice through the same compiled function: first with
//! the generated values (this call traces and compiles), then with new
//! values of the same shapes (free inputs redrawn, domain-restricted ones
//! rescaled, captured ones updated in place as an optimizer step does),
//! which must run the cached entry (one entry, no graph break): a value
//! baked into the graph as a constant shows up as a mismatch there. Each
//! call's loss and every gradient are compared with eager's.

use crate::check;
use crate::gen::{self, Case, Rng};
use kiln_frontend::autograd;
use kiln_frontend::compile::compile_fn;
use kiln_frontend::Tensor;
use kiln_ir::graph::eval::{eval_nodes, Bounded, HostTensor, SAFETY};
use kiln_ir::graph::{Graph, NodeOp};
use kiln_ir::{DType, Result};
use std::collections::BTreeMap;

#[derive(Default)]
pub struct Stats {
    pub graphs: usize,
    pub calls: usize,
    pub grads_compared: usize,
    pub elements: usize,
    /// Graphs whose loss does not depend on any float input.
    pub no_grad_path: usize,
    /// Calls skipped because a value was too close to call (a branch, or an
    /// output's rounding bound above the tolerance).
    pub unsure: usize,
    /// Graph breaks by reason: how many, and the first seeds that hit each.
    pub breaks: BTreeMap<String, (usize, Vec<String>)>,
}

/// The graph's values on `inputs` (each a tensor; captured ones included),
/// node by node with the eager ops (autograd records what needs it).
fn eval(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Option<Tensor>>> {
    let mut vals: Vec<Option<Tensor>> = Vec::with_capacity(g.len());
    let mut tuples: Vec<Option<Vec<Tensor>>> = Vec::with_capacity(g.len());
    let mut next = 0;
    for (_, node) in g.iter() {
        let mut tuple = None;
        let v = match &node.op {
            NodeOp::Input { .. } => {
                next += 1;
                Some(inputs[next - 1].clone())
            }
            NodeOp::Const(c) => {
                let n: usize = c.meta.dims.iter().product();
                let data = (0..n).map(|k| c.value(k)).collect();
                Some(check::to_tensor(&HostTensor {
                    meta: c.meta.clone(),
                    data,
                }))
            }
            NodeOp::Project(k) => tuples[node.operands[0].index()]
                .as_ref()
                .map(|t: &Vec<Tensor>| t[*k].clone()),
            NodeOp::Op(op) => {
                let args: Vec<Tensor> = node
                    .operands
                    .iter()
                    .map(|o| vals[o.index()].clone().expect("operand has a value"))
                    .collect();
                let mut outs = kiln_frontend::compile::dispatch::run_op(op, &args)?;
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

/// The float outputs of `g` (positions in `g.outputs()`): the loss's terms.
fn float_outputs(g: &Graph) -> Vec<usize> {
    (0..g.outputs().len())
        .filter(|&k| g.meta(g.outputs()[k]).is_ok_and(|m| m.dtype.is_float()))
        .collect()
}

/// The test function: `args` are the non-captured inputs in order, then one
/// weight per float output; `captured` the captured inputs in order.
fn loss(g: &Graph, is_captured: &[bool], captured: &[Tensor], args: &[Tensor]) -> Result<Tensor> {
    let (mut a, mut c) = (args.iter(), captured.iter());
    let inputs: Vec<Tensor> = is_captured
        .iter()
        .map(|&cap| {
            if cap { c.next() } else { a.next() }
                .expect("an input")
                .clone()
        })
        .collect();
    let vals = eval(g, &inputs)?;
    let mut total: Option<Tensor> = None;
    for k in float_outputs(g) {
        let out = vals[g.outputs()[k].index()].as_ref().expect("a value");
        let w = a.next().expect("a weight");
        let term = out.mul(w)?.sum(None, false)?.to_dtype(DType::F64)?;
        total = Some(match total {
            None => term,
            Some(t) => t.add(&term)?,
        });
    }
    Ok(total.unwrap_or_else(|| Tensor::zeros(&[], DType::F64)))
}

/// One set of values for the graph's inputs and their tensors.
#[derive(Clone)]
struct Leg {
    /// Per graph input (captured ones included), requiring grad if float.
    inputs: Vec<Tensor>,
}

fn leaves(values: &[HostTensor]) -> Leg {
    Leg {
        inputs: values
            .iter()
            .map(|h| {
                let t = check::to_tensor(h);
                if h.meta.dtype.is_float() {
                    t.requires_grad_(true)
                } else {
                    t
                }
            })
            .collect(),
    }
}

/// New values for `case`'s inputs: free inputs redrawn from the generator's
/// distribution, float inputs with a domain (variances, class weights)
/// rescaled by a factor in [0.5, 1.5] (they stay positive), the rest (class
/// indices) kept.
fn redraw(case: &Case, rng: &mut Rng) -> Vec<HostTensor> {
    case.inputs
        .iter()
        .zip(&case.free)
        .map(|(h, &free)| {
            let dt = h.meta.dtype;
            let data = h
                .data
                .iter()
                .map(|&v| {
                    if free {
                        gen::draw(rng, dt)
                    } else if dt.is_float() {
                        let v = v * (0.5 + rng.uniform());
                        if dt == DType::F32 {
                            v as f32 as f64
                        } else {
                            v
                        }
                    } else {
                        v
                    }
                })
                .collect();
            HostTensor {
                meta: h.meta.clone(),
                data,
            }
        })
        .collect()
}

/// Whether every float reference value stays finite and moderate (as the
/// forward check requires of its inputs).
fn tame(vals: &[Option<Bounded>]) -> bool {
    vals.iter().flatten().all(|b| {
        !b.dtype().is_float() || b.value.data.iter().all(|v| v.is_finite() && v.abs() <= 1e5)
    })
}

/// Whether some element of some value is too close to a branch to call (a
/// comparison, floor, float-to-int cast or argmax whose outcome rounding
/// could flip): compiled and eager may then legitimately take different
/// branches, and a gradient differs by a whole term.
fn unsure(vals: &[Option<Bounded>]) -> bool {
    vals.iter().flatten().any(|b| b.unsure.iter().any(|&u| u))
}

/// Whether the loss is ill-conditioned: the reference's rounding error
/// bounds of the outputs, carried through the weighted sum, exceed the
/// loss's tolerance (layer_norm of `x * 0.01 + 1000` feeding the loss), so
/// two correct f32 evaluation orders may give losses (and gradients) further
/// apart than the tolerance. The forward check widens its tolerance by the
/// same bounds.
fn ill_conditioned(g: &Graph, vals: &[Option<Bounded>], weights: &[HostTensor]) -> bool {
    let (mut value, mut bound) = (0.0f64, 0.0f64);
    let mut precision = DType::F64;
    for (k, w) in float_outputs(g).into_iter().zip(weights) {
        let Some(b) = vals[g.outputs()[k].index()].as_ref() else {
            continue;
        };
        if b.dtype() != DType::F64 {
            precision = DType::F32;
        }
        for ((v, e), wi) in b.value.data.iter().zip(&b.err).zip(&w.data) {
            value += v * wi;
            bound += e * wi.abs();
        }
    }
    let (rtol, atol) = check::tolerance(precision);
    value.is_finite() && SAFETY * bound > atol + rtol * value.abs()
}

/// Compares a compiled gradient (or the loss) with eager's, with the forward
/// check's per-dtype `rtol` and `atol` (check.rs) for `precision`: the
/// coarsest float type of the graph's values rather than the gradient's own
/// dtype, since the loss (an f64 sum of f32 terms) or the gradient of an f64
/// input reached through an f32 cast carries f32 rounding (a gradient-specific
/// choice: the f64 bounds would then be 1e5 times tighter than the values'
/// precision). There is no reference interpreter for gradients, so the
/// comparison is compiled against eager; the forward check already holds both
/// legs' forward values to the reference's error bounds.
fn compare_grad(
    got: &Tensor,
    want: &Tensor,
    precision: DType,
) -> std::result::Result<usize, String> {
    if got.dims() != want.dims() || got.dtype() != want.dtype() {
        return Err(format!(
            "type {}{:?} but eager's is {}{:?}",
            got.dtype(),
            got.dims(),
            want.dtype(),
            want.dims()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (rtol, atol) = check::tolerance(precision);
    for i in 0..g.len() {
        let ok = if !w[i].is_finite() {
            g[i] == w[i] || (g[i].is_nan() && w[i].is_nan())
        } else {
            (g[i] - w[i]).abs() <= atol + rtol * w[i].abs()
        };
        if !ok {
            let short = |v: &[f64]| v.iter().take(12).copied().collect::<Vec<_>>();
            return Err(format!(
                "element {i}: compiled {} eager {}; compiled {:?} eager {:?}",
                g[i],
                w[i],
                short(&g),
                short(&w)
            ));
        }
    }
    Ok(g.len())
}

/// Checks one seed's backward; `Err` is the failure report.
pub fn check_seed(seed: u64, stats: &mut Stats) -> std::result::Result<(), String> {
    let (case, reference, _) = crate::accepted(seed);
    if let Some(b) = check_case(seed, &case, reference, stats)? {
        let op = first_breaking_node(seed, &case).unwrap_or_else(|| "? e.g. ?".into());
        let (name, example) = op.split_once(" e.g. ").expect("formatted above");
        let e = stats
            .breaks
            .entry(format!("{b} [first node whose cone breaks: {name}]"))
            .or_default();
        e.0 += 1;
        if e.1.len() < 3 {
            e.1.push(format!("seed {seed}: {example}"));
        }
    }
    Ok(())
}

/// The op (and operand types) of the first node whose cone, as a graph of
/// its own, also breaks the graph: where a graph break comes from.
fn first_breaking_node(seed: u64, case: &Case) -> Option<String> {
    let g = &case.graph;
    for (id, node) in g.iter() {
        if !matches!(node.op, NodeOp::Op(_)) || node.meta().is_none() {
            continue;
        }
        let (sub, used) = check::cone(g, id);
        let pick = |v: &[bool]| used.iter().map(|&i| v[i]).collect::<Vec<_>>();
        let sub_case = Case {
            inputs: used.iter().map(|&i| case.inputs[i].clone()).collect(),
            captured: pick(&case.captured),
            free: pick(&case.free),
            graph: sub,
        };
        let Ok(reference) = eval_nodes(&sub_case.graph, &sub_case.inputs) else {
            continue;
        };
        if let Ok(Some(_)) = check_case(seed, &sub_case, reference, &mut Stats::default()) {
            let operands: Vec<String> = node
                .operands
                .iter()
                .map(|o| g.meta(*o).map(|m| m.to_string()).unwrap_or_default())
                .collect();
            return Some(format!(
                "{} e.g. {}({})",
                node.op_name(),
                node.op_name(),
                operands.join(", ")
            ));
        }
    }
    None
}

/// Checks one case; `Ok(Some(reason))` when compiling it breaks the graph.
fn check_case(
    seed: u64,
    case: &Case,
    reference: Vec<Option<Bounded>>,
    stats: &mut Stats,
) -> std::result::Result<Option<String>, String> {
    let g = &case.graph;
    let head = |what: &str| format!("seed {seed} (backward): {what}\n{}", g.to_text());
    let mut rng = Rng::new(seed ^ 0xb4c6_0000);
    let outs = float_outputs(g);
    let weights: Vec<HostTensor> = outs
        .iter()
        .map(|&k| {
            let meta = g.meta(g.outputs()[k]).expect("single value").clone();
            let n: usize = meta.dims.iter().product();
            let data = (0..n).map(|_| gen::draw(&mut rng, meta.dtype)).collect();
            HostTensor { meta, data }
        })
        .collect();
    let wts: Vec<Tensor> = weights.iter().map(check::to_tensor).collect();
    // the second set of values (tame, like the first)
    let second = (0..8)
        .map(|_| redraw(&case, &mut rng))
        .find_map(|vs| match eval_nodes(g, &vs) {
            Ok(r) if tame(&r) => Some((vs, r)),
            _ => None,
        });

    let is_cap = &case.captured;
    let split = |leg: &Leg| -> (Vec<Tensor>, Vec<Tensor>) {
        let mut args = vec![];
        let mut caps = vec![];
        for (t, &c) in leg.inputs.iter().zip(is_cap) {
            if c { &mut caps } else { &mut args }.push(t.clone());
        }
        args.extend(wts.iter().cloned());
        (args, caps)
    };

    // eager, both sets of values
    let eager = |values: &[HostTensor]| -> std::result::Result<(Tensor, Leg), String> {
        let leg = leaves(values);
        let (args, caps) = split(&leg);
        let l = check::catch(|| loss(g, is_cap, &caps, &args))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| head(&format!("eager forward failed: {e}")))?;
        if l.requires_grad() {
            check::catch(|| l.backward())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map_err(|e| head(&format!("eager backward failed: {e}")))?;
        }
        Ok((l, leg))
    };
    let (l0, e0) = eager(&case.inputs)?;
    if !l0.requires_grad() {
        stats.no_grad_path += 1;
        return Ok(None);
    }
    stats.graphs += 1;

    // compiled: captured tensors live across calls, as parameters do
    let c0 = leaves(&case.inputs);
    let caps: Vec<Tensor> = c0
        .inputs
        .iter()
        .zip(is_cap)
        .filter(|(_, &c)| c)
        .map(|(t, _)| t.clone())
        .collect();
    let caps_ref = &caps;
    let compiled = compile_fn(&format!("seed{seed}_backward"), move |xs: &[Tensor]| {
        Ok(vec![loss(g, is_cap, caps_ref, xs)?])
    });
    // the coarsest float precision among the graph's values (see compare_grad)
    let precision = if g
        .nodes()
        .iter()
        .flat_map(|n| &n.metas)
        .any(|m| m.dtype.is_float() && m.dtype != DType::F64)
    {
        DType::F32
    } else {
        DType::F64
    };
    let mut sets = vec![(case.inputs.clone(), reference)];
    sets.extend(second);
    for (call, (values, reference)) in sets.into_iter().enumerate() {
        let what = if call == 0 {
            "first call (traced)"
        } else {
            "second call (cached entry, new values)"
        };
        let (le, e) = if call == 0 {
            (l0.clone(), e0.clone())
        } else {
            eager(&values)?
        };
        let c = if call == 0 {
            c0.clone()
        } else {
            // arguments fresh, captured inputs updated in place (an optimizer step)
            let fresh = leaves(&values);
            let _ng = autograd::no_grad();
            let mut cp = caps.iter();
            let mut inputs = vec![];
            for (t, &cap) in fresh.inputs.iter().zip(is_cap) {
                if cap {
                    let p = cp.next().expect("a captured input");
                    p.copy_(t)
                        .map_err(|e| head(&format!("updating a captured input: {e}")))?;
                    p.set_grad(None);
                    inputs.push(p.clone());
                } else {
                    inputs.push(t.clone());
                }
            }
            Leg { inputs }
        };
        let (args, _) = split(&c);
        let lc = check::catch(|| compiled.call(&args))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| head(&format!("{what}: compiled call failed: {e}")))?;
        let report = compiled.explain();
        if report.entries.len() != 1 {
            return Err(head(&format!(
                "{what}: {} compiled entries, want 1\n{report}",
                report.entries.len()
            )));
        }
        if let Some(b) = &report.entries[0].graph_break {
            return Ok(Some(b.clone()));
        }
        let lc = &lc[0];
        if lc.grad_fn().map(|n| n.name().to_string()).as_deref() != Some("CompiledBackward") {
            return Err(head(&format!(
                "{what}: the loss has no CompiledBackward node"
            )));
        }
        check::catch(|| lc.backward())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| head(&format!("{what}: compiled backward failed: {e}")))?;
        stats.calls += 1;
        if unsure(&reference) || ill_conditioned(g, &reference, &weights) {
            stats.unsure += 1;
            continue;
        }
        compare_grad(lc, &le, precision).map_err(|m| head(&format!("{what}: loss: {m}")))?;
        for (i, (tc, te)) in c.inputs.iter().zip(&e.inputs).enumerate() {
            let name = format!(
                "gradient of input %{} ({})",
                g.inputs()[i].index(),
                values[i].meta
            );
            match (tc.grad(), te.grad()) {
                (None, None) => {}
                (Some(gc), Some(ge)) => {
                    stats.grads_compared += 1;
                    stats.elements += compare_grad(&gc, &ge, precision)
                        .map_err(|m| head(&format!("{what}: {name}: {m}")))?;
                }
                (gc, ge) => {
                    return Err(head(&format!(
                        "{what}: {name}: compiled has {} but eager has {}",
                        if gc.is_some() { "one" } else { "none" },
                        if ge.is_some() { "one" } else { "none" }
                    )))
                }
            }
        }
    }
    Ok(None)
}
