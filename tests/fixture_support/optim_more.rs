//! The optimizers of the `optim_more` suite (Adamax, NAdam, RAdam,
//! Adadelta, ASGD, Rprop) built from a case's constructor arguments; the
//! suite's SGD/Adam/AdamW cases (maximize, amsgrad) use `optim`'s mapping.

use kiln::optim::{
    Adadelta, AdadeltaConfig, Adamax, AdamaxConfig, AsgdConfig, NAdam, NadamConfig, Optimizer,
    RAdam, RadamConfig, Rprop, RpropConfig, ASGD,
};
use kiln::Tensor;
use serde_json::Value;

fn f(a: &Value, k: &str) -> f64 {
    a[k].as_f64()
        .unwrap_or_else(|| panic!("attr {k}: {}", a[k]))
}

fn b(a: &Value, k: &str) -> bool {
    a[k].as_bool().unwrap_or(false)
}

/// A JSON pair of numbers (`betas`, `etas`, `step_sizes`).
fn pair(a: &Value, k: &str) -> (f64, f64) {
    let v = a[k]
        .as_array()
        .unwrap_or_else(|| panic!("attr {k}: {}", a[k]));
    (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
}

fn boxed<O: Optimizer + 'static>(r: kiln::Result<O>) -> kiln::Result<Box<dyn Optimizer>> {
    r.map(|o| Box::new(o) as Box<dyn Optimizer>)
}

/// The optimizer `name` over `params`, or `None` when it is not one of these.
pub fn make(
    name: &str,
    a: &Value,
    params: Vec<Tensor>,
) -> Option<kiln::Result<Box<dyn Optimizer>>> {
    Some(match name {
        "Adamax" => boxed(Adamax::with_params(
            params,
            AdamaxConfig {
                lr: f(a, "lr"),
                betas: pair(a, "betas"),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                maximize: b(a, "maximize"),
            },
        )),
        "NAdam" => boxed(NAdam::with_params(
            params,
            NadamConfig {
                lr: f(a, "lr"),
                betas: pair(a, "betas"),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                momentum_decay: f(a, "momentum_decay"),
                decoupled_weight_decay: b(a, "decoupled_weight_decay"),
                maximize: b(a, "maximize"),
            },
        )),
        "RAdam" => boxed(RAdam::with_params(
            params,
            RadamConfig {
                lr: f(a, "lr"),
                betas: pair(a, "betas"),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                decoupled_weight_decay: b(a, "decoupled_weight_decay"),
                maximize: b(a, "maximize"),
            },
        )),
        "Adadelta" => boxed(Adadelta::with_params(
            params,
            AdadeltaConfig {
                lr: f(a, "lr"),
                rho: f(a, "rho"),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                maximize: b(a, "maximize"),
            },
        )),
        "ASGD" => boxed(ASGD::with_params(
            params,
            AsgdConfig {
                lr: f(a, "lr"),
                lambd: f(a, "lambd"),
                alpha: f(a, "alpha"),
                t0: f(a, "t0"),
                weight_decay: f(a, "weight_decay"),
                maximize: b(a, "maximize"),
            },
        )),
        "Rprop" => boxed(Rprop::with_params(
            params,
            RpropConfig {
                lr: f(a, "lr"),
                etas: pair(a, "etas"),
                step_sizes: pair(a, "step_sizes"),
                maximize: b(a, "maximize"),
            },
        )),
        _ => return None,
    })
}
