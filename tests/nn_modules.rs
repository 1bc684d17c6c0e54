//! nn modules against the PyTorch `modules` fixtures (MLP and small CNN):
//! state_dict names and loading, eval and train outputs, the loss, and
//! BatchNorm's running stats after a train-mode forward.

#[allow(dead_code)]
mod fixture_support;

use fixture_support::modules::{cnn, group, mlp};
use fixture_support::{compare, load_suite, Fixtures};
use kiln::nn::{BatchNorm, Linear, Module, ModuleExt};
use kiln::{functional as F, ClassLossOpts, DType, Tensor};

#[test]
fn modules_forward_match_pytorch() {
    let fx = Fixtures::load();
    for c in load_suite(&fx, "modules") {
        let model = if c.case == "mlp" { mlp() } else { cnn() };
        let structure = fx
            .cases
            .iter()
            .find(|x| x["suite"] == "modules" && x["case"] == c.case.as_str())
            .unwrap()["structure"]
            .as_str()
            .unwrap()
            .to_string();
        let state = group(&fx, &c, "state");
        let names: Vec<&str> = state.iter().map(|(k, _)| k.as_str()).collect();
        let ours: Vec<String> = model.state_dict().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            ours, names,
            "{}: state_dict keys in PyTorch's order",
            c.case
        );
        model.load_state_dict(&state, true).unwrap();
        let one = |n: &str| fx.tensor(&c, &format!("{}/{n}", c.case)).unwrap();
        let (x, target) = (one("input"), one("target"));

        model.eval();
        let y = model.forward(&x).unwrap();
        compare(&y, &one("out_eval_initial"), 1e-4, 1e-5)
            .unwrap_or_else(|e| panic!("{} eval: {e}", c.case));

        model.train();
        let y = model.forward(&x).unwrap();
        compare(&y, &one("out_train"), 1e-4, 1e-5)
            .unwrap_or_else(|e| panic!("{} train: {e}", c.case));
        let loss = F::cross_entropy(&y, &target, None, ClassLossOpts::default()).unwrap();
        compare(&loss, &one("loss"), 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} loss: {e}", c.case));
        let after: std::collections::HashMap<String, Tensor> =
            group(&fx, &c, "buffers_after_forward")
                .into_iter()
                .collect();
        for (k, t) in model.named_buffers() {
            compare(&t, &after[&k], 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} {k}: {e}", c.case));
        }
        if c.case == "cnn" {
            // PyTorch prints floats its own way (eps=1e-05); compare the layer lines that are stable
            assert!(model.to_string_tree().starts_with("Sequential(\n  (0): Conv2d(1, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))"));
            assert!(structure.contains("(8): Linear(in_features=16, out_features=10, bias=True)"));
            assert!(model
                .to_string_tree()
                .contains("(8): Linear(in_features=16, out_features=10, bias=True)"));
        }
    }
}

#[test]
fn strict_loading_reports_every_bad_key() {
    let m = mlp();
    let mut sd = m.state_dict();
    sd.retain(|(k, _)| k != "2.bias");
    sd.push(("3.weight".into(), Tensor::zeros(&[1], DType::F32)));
    sd[0].1 = Tensor::zeros(&[5, 5], DType::F32);
    let e = m.load_state_dict(&sd, true).unwrap_err().to_string();
    assert!(e.contains("missing keys: 2.bias"), "{e}");
    assert!(e.contains("unexpected keys: 3.weight"), "{e}");
    assert!(
        e.contains("size mismatch for 0.weight: the state dict has [5,5], the module has [32,64]"),
        "{e}"
    );
    // non-strict still refuses shape mismatches but returns missing/unexpected keys
    let mut sd = m.state_dict();
    sd.retain(|(k, _)| k != "2.bias");
    let r = m.load_state_dict(&sd, false).unwrap();
    assert_eq!(r.missing, vec!["2.bias".to_string()]);
}

#[test]
fn children_in_containers_register_and_default_init_is_bounded() {
    let mut list = kiln::nn::ModuleList::new();
    list.push(Linear::new(4, 3, true).unwrap());
    list.push(Linear::new(3, 2, false).unwrap());
    let names: Vec<String> = list
        .named_parameters()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, ["0.weight", "0.bias", "1.weight"]);
    let l = Linear::new(100, 50, true).unwrap();
    let bound = 1.0 / 10.0;
    assert!(l.weight.to_f64_vec().iter().all(|w| w.abs() <= bound));
    assert!(l.weight.requires_grad());
    let spread = l
        .weight
        .to_f64_vec()
        .iter()
        .fold(0.0f64, |m, w| m.max(w.abs()));
    assert!(
        spread > 0.9 * bound,
        "kaiming_uniform(a=sqrt 5) fills +-1/sqrt(fan_in)"
    );
}

#[test]
fn batchnorm_train_with_batch_of_one_is_an_error() {
    let bn = BatchNorm::new_1d(3);
    let e = bn
        .forward(&Tensor::zeros(&[1, 3], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 1 value per channel"), "{e}");
}
