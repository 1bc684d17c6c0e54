//! Backward fixture cases: inputs listed in the manifest's `grads` get
//! `requires_grad`, the op runs (through `input_view` when given), the
//! stored `gouts` are fed to backward for their outputs at once, and the
//! stored inputs' `.grad` is compared with `grad_inK` (w.r.t. the stored
//! base tensor, so gradients flow back through views).

use super::{compare, eval_view, Case, Fixtures};
use kiln::Tensor;
use serde_json::Value;

fn raw<'a>(fx: &'a Fixtures, c: &Case) -> &'a Value {
    fx.cases
        .iter()
        .find(|v| v["suite"] == c.suite.as_str() && v["case"] == c.case.as_str())
        .expect("case in manifest")
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The trailing number of `CASE/grad_in3`, `CASE/gout1`.
fn index_of(name: &str) -> usize {
    let digits: String = name
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.chars().rev().collect::<String>().parse().unwrap()
}

/// Whether the case has gradients to check.
pub fn has_grads(fx: &Fixtures, c: &Case) -> bool {
    !names(&raw(fx, c)["grads"]).is_empty()
}

/// The cases of `suite` with gradients to check.
pub fn grad_cases(fx: &Fixtures, suite: &str) -> Vec<Case> {
    super::load_suite(fx, suite)
        .into_iter()
        .filter(|c| !c.expect_error && has_grads(fx, c))
        .collect()
}

/// Runs one backward case; Ok(()) when every gradient matches.
pub fn run_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    run_case_on(fx, c, kiln::Device::Cpu)
}

/// [`run_case`] with the op on `device`: the CPU leaves are copied there
/// (differentiably), so their `.grad` arrives back through the copies.
pub fn run_case_on(fx: &Fixtures, c: &Case, device: kiln::Device) -> Result<(), String> {
    let r = raw(fx, c);
    let grads = names(&r["grads"]);
    let gouts = names(&r["gouts"]);
    let rtol = r["grad_rtol"].as_f64().unwrap_or(c.rtol);
    let atol = r["grad_atol"].as_f64().unwrap_or(c.atol);
    let wanted: Vec<usize> = grads.iter().map(|g| index_of(g)).collect();
    let stored = case_inputs(fx, c, &wanted, false)?;
    let placed = stored
        .iter()
        .map(|t| t.to_device(device).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let inputs = (0..placed.len())
        .map(|k| match c.input_view.get(&format!("in{k}")) {
            Some(expr) => eval_view(&placed, expr),
            None => Ok(placed[k].clone()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outs = super::ops::run(c, &inputs).map_err(|e| format!("kiln forward error: {e}"))?;
    let mut roots = vec![];
    let mut gts = vec![];
    for g in &gouts {
        let k = index_of(g);
        let o = outs.get(k).ok_or(format!("no output {k}"))?;
        if o.requires_grad() {
            roots.push(o.clone());
            gts.push(
                fx.tensor(c, g)?
                    .to_device(device)
                    .map_err(|e| e.to_string())?,
            );
        }
    }
    if !roots.is_empty() {
        let rr: Vec<&Tensor> = roots.iter().collect();
        let gg: Vec<&Tensor> = gts.iter().collect();
        kiln::autograd::backward(&rr, &gg, false)
            .map_err(|e| format!("kiln backward error: {e}"))?;
    }
    check_grads(fx, c, &grads, &wanted, &stored, (rtol, atol))
}

/// Compares the `.grad` of the stored inputs `wanted` with the stored
/// `grads` (a missing gradient counts as zeros).
fn check_grads(
    fx: &Fixtures,
    c: &Case,
    grads: &[String],
    wanted: &[usize],
    stored: &[Tensor],
    (rtol, atol): (f64, f64),
) -> Result<(), String> {
    for (g, &k) in grads.iter().zip(wanted) {
        let want = fx.tensor(c, g)?;
        let got = stored[k]
            .grad()
            .unwrap_or_else(|| Tensor::zeros(want.dims(), want.dtype()));
        compare(&got, &want, rtol, atol).map_err(|e| format!("grad_in{k}: {e}"))?;
    }
    Ok(())
}

/// A case's inputs as stored, those listed in `grads` requiring grad; with
/// `perturb`, every float input is `x * 0.75 + 0.1` instead (same shape,
/// dtype and layout; an affine map with a positive scale keeps the order of
/// the values, so ties and argmax positions stay where they were, and keeps
/// positive inputs positive and probabilities in (0, 1)).
fn case_inputs(
    fx: &Fixtures,
    c: &Case,
    wanted: &[usize],
    perturb: bool,
) -> Result<Vec<Tensor>, String> {
    c.inputs
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let t = fx.tensor(c, n)?;
            let t = if perturb && t.dtype().is_float() {
                &(&t * 0.75) + 0.1
            } else {
                t
            };
            Ok(if wanted.contains(&k) {
                t.requires_grad_(true)
            } else {
                t
            })
        })
        .collect()
}

/// Runs one backward case through `kiln::compile`: the compiled function
/// takes the stored inputs (views taken inside it) and the output gradients,
/// and returns one scalar, the sum over outputs of `(out_k * gout_k).sum()`,
/// whose gradient w.r.t. the inputs is the vector-Jacobian product the eager
/// harness computes. The first call (trace and compile) sees other values of
/// the same shapes (inputs `x * 0.75 + 0.1`, gouts `g * 0.5 - 0.25`), so a
/// value baked into the graph as a constant shows; the second call, with the
/// stored values, must hit the cached entry, and its gradients are compared.
pub fn run_case_compiled(fx: &Fixtures, c: &Case) -> Result<(), String> {
    let r = raw(fx, c);
    let grads = names(&r["grads"]);
    let gouts = names(&r["gouts"]);
    let rtol = r["grad_rtol"].as_f64().unwrap_or(c.rtol);
    let atol = r["grad_atol"].as_f64().unwrap_or(c.atol);
    let wanted: Vec<usize> = grads.iter().map(|g| index_of(g)).collect();
    let gout_of: Vec<usize> = gouts.iter().map(|g| index_of(g)).collect();
    let n_in = c.inputs.len();
    let f = kiln::compile::compile_fn(&c.op, |xs: &[Tensor]| {
        let (stored, gs) = xs.split_at(n_in);
        let inputs = (0..stored.len())
            .map(|k| match c.input_view.get(&format!("in{k}")) {
                Some(expr) => eval_view(stored, expr).map_err(|e| kiln::Error::op("view", e)),
                None => Ok(stored[k].clone()),
            })
            .collect::<kiln::Result<Vec<_>>>()?;
        let outs = super::ops::run(c, &inputs)?;
        let mut total: Option<Tensor> = None;
        for (&k, g) in gout_of.iter().zip(gs) {
            let o = outs
                .get(k)
                .ok_or_else(|| kiln::Error::op("fixture", format!("no output {k}")))?;
            // as the eager harness: gradients flow from the outputs that require grad
            if !o.requires_grad() {
                continue;
            }
            let term = o.mul(g)?.sum(None, false)?;
            total = Some(match total {
                None => term,
                Some(t) => t.add(&term)?,
            });
        }
        total
            .map(|t| vec![t])
            .ok_or_else(|| kiln::Error::op("fixture", "no output requires grad"))
    });
    let gts = gouts
        .iter()
        .map(|g| fx.tensor(c, g))
        .collect::<Result<Vec<_>, String>>()?;
    // first call: other values, same shapes; traces and compiles
    let mut args = case_inputs(fx, c, &wanted, true)?;
    args.extend(gts.iter().map(|g| &(g * 0.5) - 0.25));
    let out = f
        .call(&args)
        .map_err(|e| format!("kiln compile error: {e}"))?;
    // an op whose output shape depends on the values breaks the graph, as
    // torch.compile does, and runs eagerly: its gradients are the eager ones
    let broke = f
        .explain()
        .entries
        .iter()
        .find_map(|e| e.graph_break.clone());
    if broke.is_some_and(|b| super::expected_break(c, &b.to_string())) {
        return run_case(fx, c);
    }
    let check_entry = |when: &str| -> Result<(), String> {
        let rep = f.explain();
        if let Some(b) = rep.entries.iter().find_map(|e| e.graph_break.clone()) {
            return Err(format!("did not compile ({when}): {b}"));
        }
        if rep.entries.len() != 1 {
            return Err(format!(
                "{} entries after the {when} call, expected 1:\n{rep}",
                rep.entries.len()
            ));
        }
        Ok(())
    };
    check_entry("first")?;
    let node = out[0].grad_fn().map(|n| n.name().to_string());
    if node.as_deref() != Some("CompiledBackward") {
        return Err(format!(
            "result's grad_fn is {node:?}, not CompiledBackward"
        ));
    }
    out[0]
        .backward()
        .map_err(|e| format!("kiln backward error (first call): {e}"))?;
    // second call: the stored values, through the cached entry
    let stored = case_inputs(fx, c, &wanted, false)?;
    let mut args = stored.clone();
    args.extend(gts);
    let out = f
        .call(&args)
        .map_err(|e| format!("kiln compile error (2nd call): {e}"))?;
    check_entry("second")?;
    out[0]
        .backward()
        .map_err(|e| format!("kiln backward error: {e}"))?;
    check_grads(fx, c, &grads, &wanted, &stored, (rtol, atol))
}
