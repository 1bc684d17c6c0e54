//! `real/lstm` of the PyTorch fixtures (nn.LSTM(16, 32, num_layers=2,
//! batch_first=True) + Linear(32, 5) on the last step, made by
//! tests/fixtures/real/gen_real.py) through `kiln::models::lstm`: the eval
//! output, the train output, the loss, every gradient and the state after
//! one SGD(lr 0.05, momentum 0.9) step, eager and with the model under
//! `kiln::compile` (compiled forward and backward). Prints
//! `real lstm eager: P/T` and `real lstm compiled: P/T`, T being the
//! tensors compared.

#[allow(dead_code)]
mod fixture_support;

use fixture_support::compare;
use kiln::models::lstm::{LstmClassifier, LstmClassifierConfig};
use kiln::nn::ModuleExt;
use kiln::optim::{Optimizer, SgdConfig, SGD};
use kiln::{functional as F, ClassLossOpts, Tensor};
use std::collections::BTreeMap;

/// Tolerances of real_manifest.json: outputs and loss, gradients.
const OUT_TOL: (f64, f64) = (1e-4, 1e-5);
const GRAD_TOL: (f64, f64) = (1e-3, 1e-5);

fn run(compiled: bool) {
    let path = fixture_support::dir().join("real/lstm.safetensors");
    let stored: BTreeMap<String, Tensor> =
        kiln::serialize::load_map(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let group = |prefix: &str| -> Vec<(String, Tensor)> {
        stored
            .iter()
            .filter_map(|(k, t)| Some((k.strip_prefix(prefix)?.to_string(), t.clone())))
            .collect()
    };
    let model = LstmClassifier::new(&LstmClassifierConfig::default()).unwrap();
    model.load_state_dict(&group("state/"), true).unwrap();
    let fast = compiled.then(|| kiln::compile::compile(&model));
    let forward = |x: &Tensor| -> Tensor {
        match &fast {
            Some(m) => m.forward(x),
            None => model.forward(x),
        }
        .unwrap()
    };
    let x = stored["input/x"].clone();
    let target = Tensor::from_vec(vec![4i64, 0, 2], &[3]).unwrap();
    let (mut passed, mut total, mut failures) = (0, 0, vec![]);
    let mut check = |what: &str, got: &Tensor, want: &Tensor, (rtol, atol): (f64, f64)| {
        total += 1;
        match compare(got, want, rtol, atol) {
            Ok(()) => passed += 1,
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    };

    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        check("eval/out", &forward(&x), &stored["eval/out"], OUT_TOL);
    }
    model.train();
    let y = forward(&x);
    if let Some(m) = &fast {
        let node = y.grad_fn().map(|n| n.name().to_string());
        assert_eq!(
            node.as_deref(),
            Some("CompiledBackward"),
            "train output not from the compiled graph:\n{}",
            m.explain()
        );
    }
    check("train/out", &y, &stored["train/out"], OUT_TOL);
    let loss = F::cross_entropy(&y, &target, None, ClassLossOpts::default()).unwrap();
    check("train/loss", &loss, &stored["train/loss"], OUT_TOL);
    let cfg = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut opt = SGD::with_params(model.parameters(), cfg).unwrap();
    opt.zero_grad();
    loss.backward().unwrap();
    let grads = group("grad/");
    assert_eq!(
        grads.len(),
        model.named_parameters().len(),
        "a grad per parameter"
    );
    let params: BTreeMap<String, Tensor> = model.named_parameters().into_iter().collect();
    for (k, want) in &grads {
        match params[k].grad() {
            Some(g) => check(&format!("grad/{k}"), &g, want, GRAD_TOL),
            None => check(
                &format!("grad/{k} (none)"),
                &Tensor::scalar(f32::NAN),
                want,
                GRAD_TOL,
            ),
        }
    }
    opt.step().unwrap();
    let after: BTreeMap<String, Tensor> = model.state_dict().into_iter().collect();
    for (k, want) in group("step1/") {
        check(&format!("step1/{k}"), &after[&k], &want, OUT_TOL);
    }
    if let Some(m) = &fast {
        let r = m.explain();
        assert!(
            r.entries.len() == 2 && r.entries.iter().all(|e| e.graph_break.is_none()),
            "expected an eval and a train entry, no graph break:\n{r}"
        );
    }
    let mode = if compiled { "compiled" } else { "eager" };
    println!("real lstm {mode}: {passed}/{total}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(total, 3 + 2 * params.len());
}

#[test]
fn real_lstm_eager() {
    run(false);
}

#[test]
fn real_lstm_compiled() {
    run(true);
}
