//! The `modules` fixtures (MLP and small CNN built like PyTorch's) and the
//! whole training protocol of tests/fixtures/README.md ("Model cases").

use super::{compare, Case, Fixtures};
use kiln::ir::op::conv::Padding;
use kiln::nn::{
    Activation, BatchNorm, Conv, ConvOptions, Flatten, Linear, Module, ModuleExt, Pool2d,
    Sequential,
};
use kiln::{functional as F, ClassLossOpts, Tensor};

pub fn mlp() -> Sequential {
    Sequential::new()
        .add(Linear::new(64, 32, true).unwrap())
        .add(Activation::relu())
        .add(Linear::new(32, 10, true).unwrap())
}

pub fn cnn() -> Sequential {
    let p1 = ConvOptions {
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
    let p2 = ConvOptions {
        stride: 2,
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
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
pub fn group(fx: &Fixtures, c: &Case, prefix: &str) -> Vec<(String, Tensor)> {
    let all = fx
        .cases
        .iter()
        .find(|x| x["suite"] == "modules" && x["case"] == c.case.as_str())
        .unwrap();
    let g = &all["groups"][prefix];
    g.as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            (
                n.rsplit_once(&format!("{prefix}/")).unwrap().1.to_string(),
                fx.tensor(c, n).unwrap(),
            )
        })
        .collect()
}

/// The whole `modules` protocol of tests/fixtures/README.md ("Model cases"):
/// eval output, train output, loss, every gradient, BN stats, the state after
/// one and two SGD(0.1, momentum 0.9) steps, the eval output after the step.
pub fn train_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    train_protocol(fx, c, false)
}

/// The same protocol with the model wrapped in `kiln::compile` (every
/// forward, train and eval, goes through it; loss, backward and the SGD steps
/// stay eager, as in user code). The train-mode output must carry the
/// `CompiledBackward` node, and the whole run must end with two entries
/// (train with grad, eval without), neither a graph break: the second train
/// step, with the parameters the first step changed in place, reuses the
/// entry the first one compiled.
pub fn compiled_train_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    train_protocol(fx, c, true)
}

fn train_protocol(fx: &Fixtures, c: &Case, compiled: bool) -> Result<(), String> {
    use kiln::optim::{Optimizer, SgdConfig, SGD};
    let model = if c.case == "mlp" { mlp() } else { cnn() };
    model
        .load_state_dict(&group(fx, c, "state"), true)
        .map_err(|e| e.to_string())?;
    let fast = compiled.then(|| kiln::compile::compile(&model));
    let forward = |x: &Tensor| -> Result<Tensor, String> {
        let y = match &fast {
            Some(m) => m.forward(x),
            None => model.forward(x),
        }
        .map_err(|e| format!("{}: {e}", c.case))?;
        if let Some(m) = &fast {
            if let Some(b) = m
                .explain()
                .entries
                .iter()
                .find_map(|e| e.graph_break.clone())
            {
                return Err(format!("{}: graph break: {b}", c.case));
            }
            // the train-mode forwards are the ones autograd records
            if kiln::autograd::is_grad_enabled() {
                let node = y.grad_fn().map(|n| n.name().to_string());
                if node.as_deref() != Some("CompiledBackward") {
                    return Err(format!(
                        "{}: train output's grad_fn is {node:?}, not CompiledBackward:\n{}",
                        c.case,
                        m.explain()
                    ));
                }
            }
        }
        Ok(y)
    };
    let one = |n: &str| fx.tensor(c, &format!("{}/{n}", c.case)).unwrap();
    let (x, target) = (one("input"), one("target"));
    let check = |what: &str, got: &Tensor, want: &Tensor| {
        compare(got, want, 1e-4, 1e-5).map_err(|e| format!("{}: {what}: {e}", c.case))
    };
    let check_state = |what: &str| -> Result<(), String> {
        let want: std::collections::HashMap<String, Tensor> =
            group(fx, c, what).into_iter().collect();
        for (k, t) in model.state_dict() {
            check(&format!("{what}/{k}"), &t, &want[&k])?;
        }
        Ok(())
    };
    let ce = |y: &Tensor| {
        F::cross_entropy(y, &target, None, ClassLossOpts::default()).map_err(|e| e.to_string())
    };

    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        check("out_eval_initial", &forward(&x)?, &one("out_eval_initial"))?;
    }
    model.train();
    let cfg = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut opt = SGD::with_params(model.parameters(), cfg).map_err(|e| e.to_string())?;
    let y = forward(&x)?;
    check("out_train", &y, &one("out_train"))?;
    let loss = ce(&y)?;
    check("loss", &loss, &one("loss"))?;
    opt.zero_grad();
    loss.backward().map_err(|e| e.to_string())?;
    let grads: std::collections::HashMap<String, Tensor> =
        group(fx, c, "grad").into_iter().collect();
    for (k, p) in model.named_parameters() {
        let g = p.grad().ok_or(format!("{}: no grad for {k}", c.case))?;
        check(&format!("grad/{k}"), &g, &grads[&k])?;
    }
    opt.step().map_err(|e| e.to_string())?;
    check_state("after_step")?;
    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        check(
            "out_eval_after_step",
            &forward(&x)?,
            &one("out_eval_after_step"),
        )?;
    }
    model.train();
    let loss2 = ce(&forward(&x)?)?;
    check("loss_step2", &loss2, &one("loss_step2"))?;
    opt.zero_grad();
    loss2.backward().map_err(|e| e.to_string())?;
    opt.step().map_err(|e| e.to_string())?;
    check_state("after_step2")?;
    if let Some(m) = &fast {
        let r = m.explain();
        if r.entries.len() != 2 {
            return Err(format!(
                "{}: expected one train and one eval entry:\n{r}",
                c.case
            ));
        }
    }
    Ok(())
}

/// The eval output of the fixture's initial state, through `kiln::compile`
/// (run twice: tracing call and cached entry).
pub fn compiled_eval_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    let model = if c.case == "mlp" { mlp() } else { cnn() };
    model
        .load_state_dict(&group(fx, c, "state"), true)
        .map_err(|e| e.to_string())?;
    model.eval();
    let x = fx.tensor(c, &format!("{}/input", c.case))?;
    let want = fx.tensor(c, &format!("{}/out_eval_initial", c.case))?;
    let _g = kiln::autograd::no_grad();
    let m = kiln::compile::compile(&model);
    for call in ["first", "second"] {
        let y = m.forward(&x).map_err(|e| format!("{}: {e}", c.case))?;
        compare(&y, &want, 1e-4, 1e-5).map_err(|e| format!("{} ({call} call): {e}", c.case))?;
    }
    let r = m.explain();
    if r.entries.len() != 1 || r.entries[0].graph_break.is_some() {
        return Err(format!("{}: did not compile to one entry:\n{r}", c.case));
    }
    Ok(())
}
