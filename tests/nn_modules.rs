//! nn modules against the PyTorch `modules` fixtures (MLP and small CNN):
//! state_dict names and loading, eval and train outputs, the loss, and
//! BatchNorm's running stats after a train-mode forward.

#[allow(dead_code)]
mod fixture_support;

use fixture_support::{compare, load_suite, Fixtures};
use kiln::ir::op::conv::Padding;
use kiln::nn::{Activation, BatchNorm, Conv, ConvOptions, Flatten, Linear, Module, ModuleExt, Pool2d, Sequential};
use kiln::{functional as F, ClassLossOpts, DType, Tensor};

fn mlp() -> Sequential {
    Sequential::new().add(Linear::new(64, 32, true).unwrap()).add(Activation::relu()).add(Linear::new(32, 10, true).unwrap())
}

fn cnn() -> Sequential {
    let p1 = ConvOptions { padding: Padding::Explicit(vec![1]), ..ConvOptions::default() };
    let p2 = ConvOptions { stride: 2, padding: Padding::Explicit(vec![1]), ..ConvOptions::default() };
    Sequential::new()
        .add(Conv::conv2d(1, 8, 3, p1).unwrap())
        .add(BatchNorm::new_2d(8))
        .add(Activation::relu())
        .add(Conv::conv2d(8, 16, 3, p2).unwrap())
        .add(BatchNorm::new_2d(16))
        .add(Activation::relu())
        .add(Pool2d::AdaptiveAvg([1, 1]))
        .add(Flatten::default())
        .add(Linear::new(16, 10, true).unwrap())
}

/// The stored tensors named `{case}/{group}/{key}` as a state dict.
fn group(fx: &Fixtures, c: &fixture_support::Case, prefix: &str) -> Vec<(String, Tensor)> {
    let all = fx.cases.iter().find(|x| x["suite"] == "modules" && x["case"] == c.case.as_str()).unwrap();
    let g = &all["groups"][prefix];
    g.as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            (n.rsplit_once(&format!("{prefix}/")).unwrap().1.to_string(), fx.tensor(c, n).unwrap())
        })
        .collect()
}

#[test]
fn modules_forward_match_pytorch() {
    let fx = Fixtures::load();
    for c in load_suite(&fx, "modules") {
        let model = if c.case == "mlp" { mlp() } else { cnn() };
        let structure = fx.cases.iter().find(|x| x["suite"] == "modules" && x["case"] == c.case.as_str()).unwrap()["structure"].as_str().unwrap().to_string();
        let state = group(&fx, &c, "state");
        let names: Vec<&str> = state.iter().map(|(k, _)| k.as_str()).collect();
        let ours: Vec<String> = model.state_dict().into_iter().map(|(k, _)| k).collect();
        assert_eq!(ours, names, "{}: state_dict keys in PyTorch's order", c.case);
        model.load_state_dict(&state, true).unwrap();
        let one = |n: &str| fx.tensor(&c, &format!("{}/{n}", c.case)).unwrap();
        let (x, target) = (one("input"), one("target"));

        model.eval();
        let y = model.forward(&x).unwrap();
        compare(&y, &one("out_eval_initial"), 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} eval: {e}", c.case));

        model.train();
        let y = model.forward(&x).unwrap();
        compare(&y, &one("out_train"), 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} train: {e}", c.case));
        let loss = F::cross_entropy(&y, &target, None, ClassLossOpts::default()).unwrap();
        compare(&loss, &one("loss"), 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} loss: {e}", c.case));
        let after: std::collections::HashMap<String, Tensor> = group(&fx, &c, "buffers_after_forward").into_iter().collect();
        for (k, t) in model.named_buffers() {
            compare(&t, &after[&k], 1e-4, 1e-5).unwrap_or_else(|e| panic!("{} {k}: {e}", c.case));
        }
        if c.case == "cnn" {
            // PyTorch prints floats its own way (eps=1e-05); compare the layer lines that are stable
            assert!(model.to_string_tree().starts_with("Sequential(\n  (0): Conv2d(1, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))"));
            assert!(structure.contains("(8): Linear(in_features=16, out_features=10, bias=True)"));
            assert!(model.to_string_tree().contains("(8): Linear(in_features=16, out_features=10, bias=True)"));
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
    assert!(e.contains("size mismatch for 0.weight: the state dict has [5,5], the module has [32,64]"), "{e}");
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
    let names: Vec<String> = list.named_parameters().into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["0.weight", "0.bias", "1.weight"]);
    let l = Linear::new(100, 50, true).unwrap();
    let bound = 1.0 / 10.0;
    assert!(l.weight.to_f64_vec().iter().all(|w| w.abs() <= bound));
    assert!(l.weight.requires_grad());
    let spread = l.weight.to_f64_vec().iter().fold(0.0f64, |m, w| m.max(w.abs()));
    assert!(spread > 0.9 * bound, "kaiming_uniform(a=sqrt 5) fills +-1/sqrt(fan_in)");
}

#[test]
fn batchnorm_train_with_batch_of_one_is_an_error() {
    let bn = BatchNorm::new_1d(3);
    let e = bn.forward(&Tensor::zeros(&[1, 3], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("more than 1 value per channel"), "{e}");
}

/// The whole `modules` protocol of tests/fixtures/README.md ("Model cases"):
/// eval output, train output, loss, every gradient, BN stats, the state after
/// one and two SGD(0.1, momentum 0.9) steps, the eval output after the step.
fn train_case(fx: &Fixtures, c: &fixture_support::Case) -> Result<(), String> {
    use kiln::optim::{Optimizer, SgdConfig, SGD};
    let model = if c.case == "mlp" { mlp() } else { cnn() };
    model.load_state_dict(&group(fx, c, "state"), true).map_err(|e| e.to_string())?;
    let one = |n: &str| fx.tensor(c, &format!("{}/{n}", c.case)).unwrap();
    let (x, target) = (one("input"), one("target"));
    let check = |what: &str, got: &Tensor, want: &Tensor| compare(got, want, 1e-4, 1e-5).map_err(|e| format!("{}: {what}: {e}", c.case));
    let check_state = |what: &str| -> Result<(), String> {
        let want: std::collections::HashMap<String, Tensor> = group(fx, c, what).into_iter().collect();
        for (k, t) in model.state_dict() {
            check(&format!("{what}/{k}"), &t, &want[&k])?;
        }
        Ok(())
    };
    let ce = |y: &Tensor| F::cross_entropy(y, &target, None, ClassLossOpts::default()).map_err(|e| e.to_string());

    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        check("out_eval_initial", &model.forward(&x).map_err(|e| e.to_string())?, &one("out_eval_initial"))?;
    }
    model.train();
    let cfg = SgdConfig { lr: 0.1, momentum: 0.9, ..SgdConfig::default() };
    let mut opt = SGD::with_params(model.parameters(), cfg).map_err(|e| e.to_string())?;
    let y = model.forward(&x).map_err(|e| e.to_string())?;
    check("out_train", &y, &one("out_train"))?;
    let loss = ce(&y)?;
    check("loss", &loss, &one("loss"))?;
    opt.zero_grad();
    loss.backward().map_err(|e| e.to_string())?;
    let grads: std::collections::HashMap<String, Tensor> = group(fx, c, "grad").into_iter().collect();
    for (k, p) in model.named_parameters() {
        let g = p.grad().ok_or(format!("{}: no grad for {k}", c.case))?;
        check(&format!("grad/{k}"), &g, &grads[&k])?;
    }
    opt.step().map_err(|e| e.to_string())?;
    check_state("after_step")?;
    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        check("out_eval_after_step", &model.forward(&x).map_err(|e| e.to_string())?, &one("out_eval_after_step"))?;
    }
    model.train();
    let loss2 = ce(&model.forward(&x).map_err(|e| e.to_string())?)?;
    check("loss_step2", &loss2, &one("loss_step2"))?;
    opt.zero_grad();
    loss2.backward().map_err(|e| e.to_string())?;
    opt.step().map_err(|e| e.to_string())?;
    check_state("after_step2")
}

#[test]
fn modules_training_match_pytorch() {
    use std::io::Write;
    let fx = Fixtures::load();
    let cases = load_suite(&fx, "modules");
    let failures: Vec<String> = cases.iter().filter_map(|c| train_case(&fx, c).err()).collect();
    let _ = writeln!(std::io::stderr(), "modules: {}/{}", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
