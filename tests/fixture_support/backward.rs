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

/// Runs one backward case; Ok(()) when every gradient matches.
pub fn run_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    let r = raw(fx, c);
    let grads = names(&r["grads"]);
    let gouts = names(&r["gouts"]);
    let rtol = r["grad_rtol"].as_f64().unwrap_or(c.rtol);
    let atol = r["grad_atol"].as_f64().unwrap_or(c.atol);
    let wanted: Vec<usize> = grads.iter().map(|g| index_of(g)).collect();
    let stored = c
        .inputs
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let t = fx.tensor(c, n)?;
            Ok(if wanted.contains(&k) {
                t.requires_grad_(true)
            } else {
                t
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let inputs = (0..stored.len())
        .map(|k| match c.input_view.get(&format!("in{k}")) {
            Some(expr) => eval_view(&stored, expr),
            None => Ok(stored[k].clone()),
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
            gts.push(fx.tensor(c, g)?);
        }
    }
    if !roots.is_empty() {
        let rr: Vec<&Tensor> = roots.iter().collect();
        let gg: Vec<&Tensor> = gts.iter().collect();
        kiln::autograd::backward(&rr, &gg, false)
            .map_err(|e| format!("kiln backward error: {e}"))?;
    }
    for (g, &k) in grads.iter().zip(&wanted) {
        let want = fx.tensor(c, g)?;
        let got = stored[k]
            .grad()
            .unwrap_or_else(|| Tensor::zeros(want.dims(), want.dtype()));
        compare(&got, &want, rtol, atol).map_err(|e| format!("grad_in{k}: {e}"))?;
    }
    Ok(())
}
