//! The schedulers of the `sched_more` suite built from a case's attrs
//! (ConstantLR, MultiplicativeLR, LambdaLR, PolynomialLR, CyclicLR,
//! ChainedScheduler); the others use `optim`'s mapping.

use kiln::optim::lr_scheduler::{
    ChainedScheduler, ConstantLR, CyclicLR, CyclicMode, CyclicOptions, LRScheduler, LambdaLR,
    LrLambda, MultiplicativeLR, PolynomialLR,
};
use kiln::optim::SGD;
use serde_json::Value;
use std::sync::Arc;

fn f(a: &Value, k: &str) -> f64 {
    a[k].as_f64()
        .unwrap_or_else(|| panic!("attr {k}: {}", a[k]))
}

fn i(a: &Value, k: &str) -> i64 {
    a[k].as_i64()
        .unwrap_or_else(|| panic!("attr {k}: {}", a[k]))
}

/// The Python `lr_lambda` sources of the suite, as Rust functions.
fn lambda(src: &str) -> kiln::Result<LrLambda> {
    Ok(match src {
        "lambda epoch: 0.95" => Arc::new(|_| 0.95),
        "lambda epoch: 0.9 ** epoch" => Arc::new(|e| 0.9f64.powf(e as f64)),
        "lambda epoch: min(1.0, (epoch + 1) / 10)" => {
            Arc::new(|e| f64::min(1.0, (e + 1) as f64 / 10.0))
        }
        other => {
            return Err(kiln::Error::op(
                "sched fixture",
                format!("no Rust version of lr_lambda {other:?}"),
            ))
        }
    })
}

fn boxed<S: LRScheduler + 'static>(s: kiln::Result<S>) -> kiln::Result<Box<dyn LRScheduler>> {
    s.map(|s| Box::new(s) as Box<dyn LRScheduler>)
}

type Make = fn(&mut SGD, &str, &Value) -> kiln::Result<Box<dyn LRScheduler>>;

/// The scheduler `ty` on `opt`, or `None` when it is not one of these;
/// `make` builds ChainedScheduler's members.
pub fn make(
    opt: &mut SGD,
    ty: &str,
    a: &Value,
    make: Make,
) -> Option<kiln::Result<Box<dyn LRScheduler>>> {
    let fun = || lambda(a["lr_lambda"].as_str().unwrap_or(""));
    Some(match ty {
        "ConstantLR" => boxed(ConstantLR::new(opt, f(a, "factor"), i(a, "total_iters"))),
        "PolynomialLR" => boxed(PolynomialLR::new(opt, i(a, "total_iters"), f(a, "power"))),
        "LambdaLR" => fun().and_then(|l| boxed(LambdaLR::new(opt, vec![l]))),
        "MultiplicativeLR" => fun().and_then(|l| boxed(MultiplicativeLR::new(opt, vec![l]))),
        "CyclicLR" => {
            let mode = match CyclicMode::parse(a["mode"].as_str().unwrap_or("")) {
                Ok(m) => m,
                Err(e) => return Some(Err(e)),
            };
            let o = CyclicOptions {
                step_size_up: f(a, "step_size_up"),
                step_size_down: a["step_size_down"].as_f64(),
                mode,
                gamma: f(a, "gamma"),
                cycle_momentum: a["cycle_momentum"] == true,
                base_momentum: f(a, "base_momentum"),
                max_momentum: f(a, "max_momentum"),
            };
            boxed(CyclicLR::new(opt, f(a, "base_lr"), f(a, "max_lr"), o))
        }
        "ChainedScheduler" => {
            let subs = a["schedulers"].as_array().unwrap().iter();
            let subs = subs
                .map(|s| make(opt, s["type"].as_str().unwrap(), s))
                .collect::<kiln::Result<Vec<_>>>();
            subs.and_then(|subs| boxed(ChainedScheduler::new(&*opt, subs)))
        }
        _ => return None,
    })
}
