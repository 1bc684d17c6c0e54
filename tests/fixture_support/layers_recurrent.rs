//! The recurrent cases of the `layers` suite (nn.LSTM, GRU, RNN and their
//! cells), from tests/fixtures/layers_recurrent (a copy of those cases made
//! by scripts/extract-layers-recurrent.py), run through kiln's modules.
//!
//! Protocol ("Layer cases" in tests/fixtures/README.md): build the layer
//! from `attrs`, load `state/*`, call it with the inputs in their roles,
//! compare every output, then backpropagate `loss = sum_k sum(outK * goutK)`
//! and compare the gradient of every parameter and every input.

// used by tests/layers_recurrent.rs only; other fixture tests include this module too
#![allow(dead_code)]

use super::{check_outputs, compare, load_suite, Case, Fixtures};
use kiln::nn::{GRUCell, LSTMCell, Module, ModuleExt, RNNCell, RnnOptions, GRU, LSTM, RNN};
use kiln::Tensor;
use serde_json::Value;
use std::collections::HashMap;

/// The extracted manifest and tensors.
pub fn load() -> Fixtures {
    let dir = super::dir().join("layers_recurrent");
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/extract-layers-recurrent.py)",
            path.display()
        )
    });
    let m: Value = serde_json::from_str(&text).expect("manifest parses");
    let cases = m["cases"].as_array().expect("cases").clone();
    let mut files = HashMap::new();
    for c in &cases {
        let f = c["file"].as_str().unwrap().to_string();
        if !files.contains_key(&f) {
            let bytes = std::fs::read(dir.join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
            files.insert(f, bytes);
        }
    }
    Fixtures { cases, files }
}

/// Every recurrent case (the extracted manifest holds nothing else).
pub fn cases(fx: &Fixtures) -> Vec<Case> {
    load_suite(fx, "layers")
}

fn raw<'a>(fx: &'a Fixtures, c: &Case) -> &'a Value {
    fx.cases
        .iter()
        .find(|x| x["suite"] == "layers" && x["case"] == c.case.as_str())
        .expect("case in manifest")
}

/// The layer the case describes, from its constructor `attrs`.
pub fn build(c: &Case) -> Result<Box<dyn Module>, String> {
    let a = &c.attrs;
    let size = |k: &str| {
        a[k].as_u64()
            .map(|v| v as usize)
            .ok_or(format!("attrs.{k} missing"))
    };
    let flag = |k: &str| a[k].as_bool().unwrap_or(false);
    let (input, hidden) = (size("input_size")?, size("hidden_size")?);
    let bias = a["bias"].as_bool().unwrap_or(true);
    let nonlinearity = a["nonlinearity"].as_str().unwrap_or("tanh").to_string();
    let opts = || -> Result<RnnOptions, String> {
        Ok(RnnOptions {
            num_layers: size("num_layers")?,
            bias,
            batch_first: flag("batch_first"),
            dropout: a["dropout"].as_f64().unwrap_or(0.0),
            bidirectional: flag("bidirectional"),
            proj_size: a["proj_size"].as_u64().unwrap_or(0) as usize,
            nonlinearity: nonlinearity.clone(),
        })
    };
    let m: Box<dyn Module> = match c.op.as_str() {
        "torch.nn.LSTM" => Box::new(LSTM::new(input, hidden, opts()?).map_err(|e| e.to_string())?),
        "torch.nn.GRU" => Box::new(GRU::new(input, hidden, opts()?).map_err(|e| e.to_string())?),
        "torch.nn.RNN" => Box::new(RNN::new(input, hidden, opts()?).map_err(|e| e.to_string())?),
        "torch.nn.LSTMCell" => {
            Box::new(LSTMCell::new(input, hidden, bias).map_err(|e| e.to_string())?)
        }
        "torch.nn.GRUCell" => {
            Box::new(GRUCell::new(input, hidden, bias).map_err(|e| e.to_string())?)
        }
        "torch.nn.RNNCell" => {
            Box::new(RNNCell::new(input, hidden, bias, &nonlinearity).map_err(|e| e.to_string())?)
        }
        other => return Err(format!("not a recurrent layer: {other}")),
    };
    Ok(m)
}

/// What one run of a case produced: the outputs and every gradient the
/// manifest lists, in its `grads` order.
pub struct Run {
    pub outputs: Vec<Tensor>,
    pub grads: Vec<Tensor>,
}

/// Runs the case eagerly, or through `kiln::compile` (forward compiled, and
/// the backward through the compiled graph's `CompiledBackward` node; the
/// second call must reuse the entry the first one traced), and checks it
/// against PyTorch.
pub fn run_case(fx: &Fixtures, c: &Case, compiled: bool) -> Result<Run, String> {
    let r = raw(fx, c);
    let m = build(c)?;
    if m.describe() != r["structure"].as_str().unwrap_or("") {
        return Err(format!(
            "describe() {:?}, PyTorch prints {}",
            m.describe(),
            r["structure"]
        ));
    }
    let prefix = format!("{}/state/", c.case);
    let state = r["state"]
        .as_array()
        .ok_or("no state list")?
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            Ok((n[prefix.len()..].to_string(), fx.tensor(c, n)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    m.load_state_dict(&state, true).map_err(|e| e.to_string())?;
    if r["mode"] == "eval" {
        m.eval();
    } else {
        m.train();
    }
    let fast = compiled.then(|| kiln::compile::compile(m.as_ref()));
    let mut first: Option<Run> = None;
    // compiled: the tracing call, then the cached entry
    for call in 0..if compiled { 2 } else { 1 } {
        m.zero_grad();
        let inputs: Vec<Tensor> = fx
            .inputs(c)?
            .into_iter()
            .map(|t| t.requires_grad_(true))
            .collect();
        let outs = match &fast {
            Some(f) => f.call(&inputs),
            None => m.forward_many(&inputs.iter().map(Some).collect::<Vec<_>>()),
        }
        .map_err(|e| format!("forward: {e}"))?;
        if let Some(f) = &fast {
            let report = f.explain();
            if let Some(b) = report.entries.iter().find_map(|e| e.graph_break.clone()) {
                return Err(format!("graph break: {b}"));
            }
            if report.entries.len() != 1 {
                return Err(format!("call {call}: expected one entry:\n{report}"));
            }
            // a training entry: the backward half is compiled too (with one
            // result the node is on it; several are views of one flat
            // result carrying the node)
            if report.entries[0].backward.is_none() {
                return Err(format!("no compiled backward:\n{report}"));
            }
            let nodes: Vec<Option<String>> = outs
                .iter()
                .map(|o| o.grad_fn().map(|n| n.name().to_string()))
                .collect();
            if outs.len() == 1 && nodes[0].as_deref() != Some("CompiledBackward") {
                return Err(format!(
                    "out0's grad_fn is {:?}, not CompiledBackward",
                    nodes[0]
                ));
            }
            if nodes.iter().any(|n| n.is_none()) {
                return Err(format!("an output has no grad_fn: {nodes:?}"));
            }
        }
        check_outputs(fx, c, &outs, &inputs)?;
        let gouts = r["gouts"]
            .as_array()
            .ok_or("no gouts")?
            .iter()
            .map(|n| fx.tensor(c, n.as_str().unwrap()))
            .collect::<Result<Vec<_>, _>>()?;
        kiln::autograd::backward(
            &outs.iter().collect::<Vec<_>>(),
            &gouts.iter().collect::<Vec<_>>(),
            false,
        )
        .map_err(|e| format!("backward: {e}"))?;
        let grads = check_grads(fx, c, r, m.as_ref(), &inputs)?;
        let run = Run {
            outputs: outs.iter().map(|o| o.detach()).collect(),
            grads,
        };
        match &first {
            None => first = Some(run),
            Some(f) => same_run(f, &run, 0.0).map_err(|e| format!("cached call: {e}"))?,
        }
    }
    Ok(first.expect("one call ran"))
}

/// Compares `grad/NAME` with the parameter's `.grad` and `grad_inK` with the
/// input's, under the case's gradient tolerances.
fn check_grads(
    fx: &Fixtures,
    c: &Case,
    r: &Value,
    m: &dyn Module,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, String> {
    let (rtol, atol) = (
        r["grad_rtol"].as_f64().unwrap_or(c.rtol),
        r["grad_atol"].as_f64().unwrap_or(c.atol),
    );
    let params: HashMap<String, Tensor> = m.named_parameters().into_iter().collect();
    let mut out = vec![];
    for name in r["grads"].as_array().ok_or("no grads list")? {
        let name = name.as_str().unwrap();
        let key = &name[c.case.len() + 1..];
        let tensor = if let Some(p) = key.strip_prefix("grad/") {
            params.get(p).ok_or(format!("no parameter {p}"))?
        } else if let Some(k) = key.strip_prefix("grad_in") {
            let k: usize = k.parse().map_err(|_| format!("bad grad name {name}"))?;
            inputs.get(k).ok_or(format!("no input {k}"))?
        } else {
            return Err(format!("unexpected grad entry {name}"));
        };
        let got = tensor.grad().ok_or(format!("{key}: no gradient"))?;
        compare(&got, &fx.tensor(c, name)?, rtol, atol).map_err(|e| format!("{key}: {e}"))?;
        out.push(got);
    }
    Ok(out)
}

/// Two runs of the same case agree within `rtol` (and `rtol / 10`
/// absolute): exactly for a compiled entry against itself, closely for
/// compiled against eager.
pub fn same_run(a: &Run, b: &Run, rtol: f64) -> Result<(), String> {
    for (k, (x, y)) in a.outputs.iter().zip(&b.outputs).enumerate() {
        compare(y, x, rtol, rtol / 10.0).map_err(|e| format!("out{k}: {e}"))?;
    }
    for (k, (x, y)) in a.grads.iter().zip(&b.grads).enumerate() {
        compare(y, x, rtol, rtol / 10.0).map_err(|e| format!("grad {k}: {e}"))?;
    }
    Ok(())
}
