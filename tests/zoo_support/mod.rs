//! What the `zoo_*` tests share: torchvision's state_dict key names and
//! shapes (tests/fixtures/zoo/torchvision_keys.json, written by
//! scripts/torchvision-keys.py) and the fixtures of
//! scripts/torchvision-zoo-fixtures.py (a shrunk torchvision model's
//! state_dict, an input and its eval output).

use kiln::nn::{Module, ModuleExt};
use serde_json::Value;

/// `(key, shape)` of torchvision's `name` in state_dict order.
pub fn torchvision_keys(name: &str) -> Vec<(String, Vec<usize>)> {
    let text = include_str!("../fixtures/zoo/torchvision_keys.json");
    let v: Value = serde_json::from_str(text).unwrap();
    let entries = v[name]
        .as_array()
        .unwrap_or_else(|| panic!("{name} is not in torchvision_keys.json"));
    entries
        .iter()
        .map(|e| {
            let dims = e[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize);
            (e[0].as_str().unwrap().to_string(), dims.collect())
        })
        .collect()
}

/// `m`'s state_dict is torchvision's `name`: the same keys, in the same
/// order, with the same shapes.
pub fn assert_torchvision_keys(name: &str, m: &dyn Module) {
    let ours: Vec<(String, Vec<usize>)> = m
        .state_dict()
        .into_iter()
        .map(|(k, t)| (k, t.dims().to_vec()))
        .collect();
    let want = torchvision_keys(name);
    for (o, w) in ours.iter().zip(&want) {
        assert_eq!(o, w, "{name}");
    }
    assert_eq!(ours.len(), want.len(), "{name}: entry count");
    println!("{name}: {} state_dict entries as torchvision's", want.len());
}

/// Loads `state/*` strictly into `model` and checks its eval output on
/// `input/x` against `eval/out`, eagerly and under `kiln::compile`
/// (rtol 1e-4, atol 1e-5); prints `zoo NAME eager|compiled: ok`.
pub fn check_eval_output<M: Module>(name: &str, model: &M) {
    let t = crate::real_models::load_from("zoo", name);
    model
        .load_state_dict(&crate::real_models::group(&t, "state"), true)
        .unwrap();
    model.eval();
    let _g = kiln::autograd::no_grad();
    let x = &t["input/x"];
    let eager = model.forward(x).unwrap();
    let fast = kiln::compile::compile(model);
    let compiled = fast.forward(x).unwrap();
    let report = fast.explain();
    assert!(
        report.entries.iter().all(|e| e.graph_break.is_none()),
        "{name}: graph break:\n{report}"
    );
    for (mode, y) in [("eager", eager), ("compiled", compiled)] {
        if let Err(e) = crate::real_models::compare(&y, &t["eval/out"], 1e-4, 1e-5) {
            panic!("{name} {mode}: {e}");
        }
        println!("zoo {name} {mode}: eval output matches torchvision's");
    }
}
