//! Dynamic int8 quantization against PyTorch's own (`quantize_dynamic`,
//! fbgemm engine): `tests/fixtures/quant/` (see its gen_quant.py). Weights
//! and scales must match exactly; outputs within one output quantum
//! (`act_scale * w_scale` of the last layer). Prints `quant: P/T`, and the
//! same cases through `compile()` as `quant compiled: P/T`.

use kiln::nn::{Activation, Entry, Linear, Module, ModuleExt, RnnOptions, Sequential, LSTM};
use kiln::quantization::{quantize_dynamic, QScheme, QuantType, QuantizedLinear};
use kiln::runtime::externs::qgemm;
use kiln::{serialize, Tensor};
use std::collections::BTreeMap;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quant");

/// The float Sequential the manifest's `model` repr describes.
fn build(repr: &str) -> Result<Sequential, String> {
    let mut s = Sequential::new();
    for line in repr.lines().skip(1) {
        let Some(layer) = line.trim().split_once(": ").map(|(_, l)| l) else {
            continue;
        };
        if let Some(args) = layer
            .strip_prefix("Linear(")
            .and_then(|a| a.strip_suffix(')'))
        {
            let kv: BTreeMap<&str, &str> =
                args.split(", ").filter_map(|p| p.split_once('=')).collect();
            let (i, o) = (
                kv["in_features"].parse().unwrap(),
                kv["out_features"].parse().unwrap(),
            );
            s = s.add(Linear::new(i, o, kv["bias"] == "True").unwrap());
        } else if layer == "ReLU()" {
            s = s.add(Activation::relu());
        } else if layer == "GELU(approximate='none')" {
            s = s.add(Activation::gelu(false));
        } else {
            return Err(format!("layer `{layer}` is not one this test builds"));
        }
    }
    Ok(s)
}

fn quantized_children<'a>(m: &'a dyn Module) -> Vec<(String, &'a dyn Module)> {
    let mut v = vec![];
    m.visit(&mut |e| {
        if let Entry::Child(n, c) = e {
            v.push((n.to_string(), c))
        }
    });
    v
}

/// What one case gives: the eager report, and the compiled check's.
type CaseResult = Result<(String, Result<String, String>), String>;

/// The compiled model's output `c` checked against PyTorch's `want` with
/// the same tolerance as the eager one (`quantum(i)` per element), against
/// the eager output `eager` bit for bit, and for a graph break.
fn compiled_check(
    c: &kiln::compile::Compiled,
    x: &Tensor,
    want: &[f64],
    eager: &[f64],
    quantum: &dyn Fn(usize) -> f64,
) -> Result<String, String> {
    let got = c
        .forward(x)
        .map_err(|e| format!("compile: {e}"))?
        .to_f64_vec();
    let r = c.explain();
    if let Some(b) = r.entries.iter().find_map(|e| e.graph_break.clone()) {
        return Err(format!("compiled with a graph break: {b}"));
    }
    let max_q = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| (g - w).abs() / quantum(i))
        .fold(0.0, f64::max);
    if got.len() != want.len() || max_q > 1.0 {
        return Err(format!(
            "compiled outputs differ by up to {max_q:.3} quanta"
        ));
    }
    if got != eager {
        return Err("compiled outputs differ from eager".into());
    }
    Ok(format!("bit-identical to eager, max {max_q:.3} quanta"))
}

/// Checks one case; `Ok((report, compiled))` or `Err(why)`.
fn run_case(name: &str, case: &serde_json::Value, t: &BTreeMap<String, Tensor>) -> CaseResult {
    let model = build(case["model"].as_str().unwrap())?;
    let sd: Vec<(String, Tensor)> = t
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&format!("{name}/state/"))
                .map(|s| (s.to_string(), v.clone()))
        })
        .collect();
    model
        .load_state_dict(&sd, true)
        .map_err(|e| e.to_string())?;
    model.eval();
    let scheme = if case["scheme"] == "per_channel" {
        QScheme::PerChannel
    } else {
        QScheme::PerTensor
    };
    let q = quantize_dynamic(&model, &[QuantType::Linear], scheme).map_err(|e| e.to_string())?;
    let ours: BTreeMap<String, Tensor> = q.state_dict().into_iter().collect();
    for lin in case["quantized_linears"].as_array().unwrap() {
        let lin = lin.as_str().unwrap();
        let want_w = t[&format!("{name}/qweight/{lin}")].to_f64_vec();
        let got_w = ours[&format!("{lin}.weight")].to_f64_vec();
        if want_w != got_w {
            let bad = want_w.iter().zip(&got_w).filter(|(a, b)| a != b).count();
            return Err(format!(
                "{lin}: {bad} of {} int8 weights differ",
                want_w.len()
            ));
        }
        let want_s = t[&format!("{name}/wscale/{lin}")].to_f64_vec();
        let got_s = ours[&format!("{lin}.weight_scale")].to_f64_vec();
        if want_s != got_s {
            return Err(format!(
                "{lin}: weight scales differ: {want_s:?} vs {got_s:?}"
            ));
        }
        let want_z = t[&format!("{name}/wzp/{lin}")].to_f64_vec();
        if want_z != ours[&format!("{lin}.weight_zero_point")].to_f64_vec() {
            return Err(format!("{lin}: zero points differ"));
        }
    }
    let x = &t[&format!("{name}/input")];
    let want = t[&format!("{name}/q_out")].to_f64_vec();
    let out = q.forward(x).map_err(|e| e.to_string())?;
    let got = out.to_f64_vec();
    let n = *out.dims().last().unwrap();
    // one output quantum per column: the last quantized layer's act_scale * w_scale
    let children = quantized_children(&q);
    let mut h = x.clone();
    for (_, c) in &children[..children.len() - 1] {
        h = c.forward(&h).map_err(|e| e.to_string())?;
    }
    let (lo, hi) = qgemm::find_min_max(&h.to_vec::<f32>().unwrap());
    let a = qgemm::choose_activation_qparams(lo, hi, true);
    let last = children.last().unwrap().0.clone();
    let ws = ours[&format!("{last}.weight_scale")]
        .to_vec::<f32>()
        .unwrap();
    let (mut exact, mut max_q) = (0, 0.0f64);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let quantum = (a.scale * ws[if ws.len() == 1 { 0 } else { i % n }]) as f64;
        let d = (g - w).abs() / quantum;
        exact += (g == w) as usize;
        max_q = max_q.max(d);
    }
    if got.len() != want.len() || max_q > 1.0 {
        return Err(format!(
            "outputs differ by up to {max_q:.3} quanta ({exact}/{} exact)",
            want.len()
        ));
    }
    // compiled: the same numbers, one graph
    let _ng = kiln::autograd::no_grad();
    let compiled = kiln::compile::compile(&q);
    let quantum = |i: usize| (a.scale * ws[if ws.len() == 1 { 0 } else { i % n }]) as f64;
    let c = compiled_check(&compiled, x, &want, &got, &quantum);
    Ok((
        format!(
            "{exact}/{} outputs bit-exact, max {max_q:.3} quanta",
            want.len()
        ),
        c,
    ))
}

#[test]
fn quantize_dynamic_matches_pytorch() {
    let t = serialize::load_map(format!("{DIR}/quant.safetensors")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{DIR}/quant_manifest.json")).unwrap(),
    )
    .unwrap();
    let cases = manifest.as_object().unwrap();
    let (mut pass, mut cpass, mut fails, skipped) = (0, 0, vec![], Vec::<String>::new());
    for (name, case) in cases {
        let types: Vec<&str> = case["quantized_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let result = if types.contains(&"LSTM") {
            run_lstm_head(name, &t)
        } else {
            run_case(name, case, &t)
        };
        match result {
            Ok((r, compiled)) => {
                eprintln!("quant {name}: ok ({r})");
                pass += 1;
                match compiled {
                    Ok(r) => {
                        eprintln!("quant compiled {name}: ok ({r})");
                        cpass += 1;
                    }
                    Err(e) => {
                        eprintln!("quant compiled {name}: FAIL {e}");
                        fails.push(format!("{name} (compiled): {e}"));
                    }
                }
            }
            Err(e) => {
                eprintln!("quant {name}: FAIL {e}");
                fails.push(format!("{name}: {e}"));
            }
        }
    }
    let skip_note = if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({} skipped: {})", skipped.len(), skipped.join(", "))
    };
    for line in [
        format!("quant: {pass}/{}{skip_note}", cases.len()),
        format!("quant compiled: {cpass}/{}{skip_note}", cases.len()),
    ] {
        println!("{line}");
        eprintln!("{line}");
    }
    assert!(fails.is_empty(), "{fails:#?}");
    assert_eq!(pass + skipped.len(), cases.len());
    assert_eq!(cpass + skipped.len(), cases.len());
}

/// `lstm_head` (gen_quant.py's LSTMHead: `nn.LSTM(8, 16, batch_first=True)`
/// then `fc = nn.Linear(16, 4)` on the last step, both quantized): the LSTM
/// through `quantize_dynamic(.., [Lstm])`, the head as a QuantizedLinear
/// whose int8 weight and scale must equal PyTorch's; the output within one
/// quantum of the head (its input's activation scale * weight scale).
fn run_lstm_head(name: &str, t: &BTreeMap<String, Tensor>) -> CaseResult {
    let opts = RnnOptions {
        batch_first: true,
        ..RnnOptions::default()
    };
    let lstm = LSTM::new(8, 16, opts).map_err(|e| e.to_string())?;
    let fc = Linear::new(16, 4, true).map_err(|e| e.to_string())?;
    let state = |prefix: &str| -> Vec<(String, Tensor)> {
        let p = format!("{name}/state/{prefix}.");
        t.iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&p)?.to_string(), v.clone())))
            .collect()
    };
    lstm.load_state_dict(&state("lstm"), true)
        .map_err(|e| e.to_string())?;
    fc.load_state_dict(&state("fc"), true)
        .map_err(|e| e.to_string())?;
    let q = quantize_dynamic(
        &lstm,
        &[QuantType::Linear, QuantType::Lstm],
        QScheme::PerTensor,
    )
    .map_err(|e| e.to_string())?;
    if q.quantized_layers() != 1 || !q.describe().starts_with("DynamicQuantizedLSTM(8, 16") {
        return Err(format!("not one quantized LSTM: {}", q.describe()));
    }
    let head = QuantizedLinear::from_float(&fc.weight, fc.bias.as_ref(), QScheme::PerTensor)
        .map_err(|e| e.to_string())?;
    if head.weight.to_f64_vec() != t[&format!("{name}/qweight/fc")].to_f64_vec() {
        return Err("fc: int8 weights differ".into());
    }
    let ws = head.weight_scale.to_f64_vec()[0];
    if (ws as f32) != t[&format!("{name}/wscale/fc")].to_f64_vec()[0] as f32 {
        return Err("fc: weight scale differs".into());
    }
    let x = &t[&format!("{name}/input")];
    let _ng = kiln::autograd::no_grad();
    let out = q.forward(x).map_err(|e| e.to_string())?;
    let last = out
        .select(1, x.dims()[1] as i64 - 1)
        .map_err(|e| e.to_string())?;
    let y = head.forward(&last).map_err(|e| e.to_string())?;
    let (lo, hi) = qgemm::find_min_max(&last.to_vec::<f32>().unwrap());
    let quantum = (qgemm::choose_activation_qparams(lo, hi, true).scale as f64) * ws;
    let (got, want) = (y.to_f64_vec(), t[&format!("{name}/q_out")].to_f64_vec());
    let float = t[&format!("{name}/float_out")].to_f64_vec();
    let (mut exact, mut max_q) = (0, 0.0f64);
    for (g, w) in got.iter().zip(&want) {
        exact += (g == w) as usize;
        max_q = max_q.max((g - w).abs() / quantum);
    }
    let float_q = float
        .iter()
        .zip(&want)
        .map(|(f, w)| (f - w).abs() / quantum)
        .fold(0.0, f64::max);
    if got.len() != want.len() || max_q > 1.0 {
        return Err(format!(
            "outputs differ by up to {max_q:.3} quanta ({exact}/{} exact; the float model is {float_q:.1} quanta off)",
            want.len()
        ));
    }
    // compiled: the LSTM as one graph, its last step through the head
    let compiled = kiln::compile::compile(&q);
    let c = compiled
        .forward(x)
        .map_err(|e| format!("compile: {e}"))
        .and_then(|c1| {
            if c1.to_f64_vec() != out.to_f64_vec() {
                return Err("compiled LSTM outputs differ from eager".into());
            }
            let last = last.clone();
            let head_c = kiln::compile::compile(&head);
            compiled_check(&head_c, &last, &want, &got, &|_| quantum)?;
            let r = compiled.explain();
            match r.entries.iter().find_map(|e| e.graph_break.clone()) {
                Some(b) => Err(format!("compiled LSTM with a graph break: {b}")),
                None => Ok("LSTM and head bit-identical to eager, one graph each".into()),
            }
        });
    Ok((
        format!(
            "{exact}/{} outputs bit-exact, max {max_q:.3} quanta (float model: {float_q:.1})",
            want.len()
        ),
        c,
    ))
}
