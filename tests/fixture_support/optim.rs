//! The `optim` and `sched` fixture suites (and `optim_more`, `sched_more`):
//! optimizers over 5 steps (params after each step, named state after step
//! 5; saved before step 3 and resumed in a fresh optimizer), clip_grad_norm_, and the lr
//! (and momentum) sequences of the schedulers over 50 steps — each scheduler
//! also saved after 20 steps and resumed in a fresh optimizer + scheduler.

use super::{compare, load_suite, Case, Fixtures};
use kiln::optim::lr_scheduler::{
    Anneal, CosineAnnealingLR, CosineAnnealingWarmRestarts, ExponentialLR, LRScheduler, LinearLR,
    MultiStepLR, OneCycleLR, OneCycleOptions, PlateauOptions, ReduceLROnPlateau, SequentialLR,
    StepLR,
};
use kiln::optim::{
    clip_grad_norm_, Adagrad, AdagradConfig, Adam, AdamConfig, AdamW, Optimizer, RMSprop,
    RmspropConfig, SgdConfig, SGD,
};
use kiln::{DType, Tensor};
use serde_json::Value;

/// Runs every case of `suite` ("optim", "sched", "optim_more" or
/// "sched_more"); returns (passed, total, failure lines).
pub fn run_suite(fx: &Fixtures, suite: &str) -> (usize, usize, Vec<String>) {
    let cases = load_suite(fx, suite);
    let mut fails = vec![];
    for c in &cases {
        let raw = fx
            .cases
            .iter()
            .find(|r| r["suite"] == suite && r["case"] == c.case.as_str())
            .expect("case in manifest");
        let r = match suite {
            "optim" if c.op.ends_with("clip_grad_norm_") => clip_case(fx, c),
            "optim" | "optim_more" => optim_case(fx, c, raw, false),
            _ => sched_case(fx, c, raw),
        };
        if let Err(e) = r {
            fails.push(format!("{suite}/{}: {e}", c.case));
        }
    }
    (cases.len() - fails.len(), cases.len(), fails)
}

/// The SGD, Adam and AdamW cases of the optim and optim_more suites again with
/// `fused: true` (options the fused step lacks take the eager fallback and
/// count too); returns (passed, total, failure lines).
pub fn run_fused(fx: &Fixtures) -> (usize, usize, Vec<String>) {
    let fusable = |op: &str| matches!(op.rsplit('.').next(), Some("SGD" | "Adam" | "AdamW"));
    let cases: Vec<Case> = ["optim", "optim_more"]
        .iter()
        .flat_map(|suite| load_suite(fx, suite))
        .filter(|c| fusable(&c.op))
        .collect();
    let mut fails = vec![];
    for c in &cases {
        let raw = fx
            .cases
            .iter()
            .find(|r| r["suite"] == c.suite.as_str() && r["case"] == c.case.as_str())
            .expect("case in manifest");
        if let Err(e) = optim_case(fx, c, raw, true) {
            fails.push(format!("fused {}/{}: {e}", c.suite, c.case));
        }
    }
    (cases.len() - fails.len(), cases.len(), fails)
}

fn f(a: &Value, k: &str) -> f64 {
    match &a[k] {
        Value::String(s) if s == "inf" => f64::INFINITY,
        v => v.as_f64().unwrap_or_else(|| panic!("attr {k}: {v}")),
    }
}
fn b(a: &Value, k: &str) -> bool {
    a[k].as_bool().unwrap_or(false)
}
fn i(a: &Value, k: &str) -> i64 {
    a[k].as_i64()
        .unwrap_or_else(|| panic!("attr {k}: {}", a[k]))
}

fn make_optimizer(
    op: &str,
    a: &Value,
    p: Tensor,
    fused: bool,
) -> Result<Box<dyn Optimizer>, String> {
    let params = vec![p];
    let name = op.rsplit('.').next().unwrap();
    let betas = |a: &Value| {
        let v = a["betas"].as_array().unwrap();
        (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
    };
    let r: kiln::Result<Box<dyn Optimizer>> = match name {
        "SGD" => SGD::with_params(
            params,
            SgdConfig {
                lr: f(a, "lr"),
                momentum: f(a, "momentum"),
                dampening: f(a, "dampening"),
                weight_decay: f(a, "weight_decay"),
                nesterov: b(a, "nesterov"),
                maximize: b(a, "maximize"),
                fused,
            },
        )
        .map(|o| Box::new(o) as Box<dyn Optimizer>),
        "Adam" | "AdamW" => {
            let cfg = AdamConfig {
                lr: f(a, "lr"),
                betas: betas(a),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                amsgrad: b(a, "amsgrad"),
                maximize: b(a, "maximize"),
                fused,
            };
            if name == "AdamW" || b(a, "decoupled_weight_decay") {
                AdamW::with_params(params, cfg).map(|o| Box::new(o) as Box<dyn Optimizer>)
            } else {
                Adam::with_params(params, cfg).map(|o| Box::new(o) as Box<dyn Optimizer>)
            }
        }
        "RMSprop" => RMSprop::with_params(
            params,
            RmspropConfig {
                lr: f(a, "lr"),
                alpha: f(a, "alpha"),
                eps: f(a, "eps"),
                weight_decay: f(a, "weight_decay"),
                momentum: f(a, "momentum"),
                centered: b(a, "centered"),
                maximize: b(a, "maximize"),
            },
        )
        .map(|o| Box::new(o) as Box<dyn Optimizer>),
        "Adagrad" => Adagrad::with_params(
            params,
            AdagradConfig {
                lr: f(a, "lr"),
                lr_decay: f(a, "lr_decay"),
                weight_decay: f(a, "weight_decay"),
                initial_accumulator_value: f(a, "initial_accumulator_value"),
                eps: f(a, "eps"),
                maximize: b(a, "maximize"),
            },
        )
        .map(|o| Box::new(o) as Box<dyn Optimizer>),
        other => match super::optim_more::make(other, a, params) {
            Some(r) => r,
            None => return Err(format!("unknown optimizer {other}")),
        },
    };
    r.map_err(|e| format!("kiln error: {e}"))
}

/// The optimizer step before which `optim_case` saves its state_dict and
/// continues in a fresh optimizer loaded from it.
const RESUME_STEP: usize = 3;

fn optim_case(fx: &Fixtures, c: &Case, raw: &Value, fused: bool) -> Result<(), String> {
    let p = fx.tensor(c, &c.inputs[0])?.requires_grad_(true);
    let mut opt = make_optimizer(&c.op, &c.attrs, p.clone(), fused)?;
    // 5 steps, or `meta.steps` (optim_more's radam_8steps)
    let steps = raw["meta"]["steps"].as_u64().unwrap_or(5) as usize;
    for t in 1..=steps {
        if t == RESUME_STEP {
            // save, then continue in a fresh optimizer loaded from it
            let sd = opt.state_dict();
            opt = make_optimizer(&c.op, &c.attrs, p.clone(), fused)?;
            opt.load_state_dict(&sd)
                .map_err(|e| format!("load_state_dict: {e}"))?;
        }
        p.set_grad(Some(fx.tensor(c, &c.inputs[t])?));
        opt.step().map_err(|e| format!("step {t}: {e}"))?;
        let want = fx.tensor(c, &c.outputs[t - 1])?;
        compare(&p, &want, c.rtol, c.atol).map_err(|e| format!("param after step {t}: {e}"))?;
    }
    let st = opt.state(&p);
    for name in raw["state"].as_array().into_iter().flatten() {
        let name = name.as_str().unwrap();
        let key = name.rsplit('/').next().unwrap();
        let got = st
            .and_then(|s| s.get(key))
            .ok_or(format!("no state '{key}' after step {steps}"))?;
        let want = fx.tensor(c, name)?;
        compare(got, &want, c.rtol, c.atol).map_err(|e| format!("state {key}: {e}"))?;
    }
    Ok(())
}

fn clip_case(fx: &Fixtures, c: &Case) -> Result<(), String> {
    let grads = fx.inputs(c)?;
    let params: Vec<Tensor> = grads
        .iter()
        .map(|g| Tensor::zeros(g.dims(), g.dtype()).requires_grad_(true))
        .collect();
    for (p, g) in params.iter().zip(&grads) {
        p.set_grad(Some(g.clone()));
    }
    let a = &c.attrs;
    let total = clip_grad_norm_(&params, f(a, "max_norm"), f(a, "norm_type"))
        .map_err(|e| format!("kiln error: {e}"))?;
    for (k, p) in params.iter().enumerate() {
        let want = fx.tensor(c, &c.outputs[k])?;
        compare(&p.grad().unwrap(), &want, c.rtol, c.atol).map_err(|e| format!("grad {k}: {e}"))?;
    }
    let want = fx.tensor(c, &c.outputs[params.len()])?;
    compare(&total, &want, c.rtol, c.atol).map_err(|e| format!("total norm: {e}"))
}

enum Sched {
    Epoch(Box<dyn LRScheduler>),
    Plateau(ReduceLROnPlateau),
}

fn make_sched(opt: &mut SGD, ty: &str, a: &Value) -> kiln::Result<Box<dyn LRScheduler>> {
    Ok(match ty {
        "StepLR" => Box::new(StepLR::new(opt, i(a, "step_size"), f(a, "gamma"))?),
        "MultiStepLR" => {
            let ms: Vec<i64> = a["milestones"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_i64().unwrap())
                .collect();
            Box::new(MultiStepLR::new(opt, &ms, f(a, "gamma"))?)
        }
        "ExponentialLR" => Box::new(ExponentialLR::new(opt, f(a, "gamma"))?),
        "LinearLR" => Box::new(LinearLR::new(
            opt,
            f(a, "start_factor"),
            f(a, "end_factor"),
            i(a, "total_iters"),
        )?),
        "CosineAnnealingLR" => {
            Box::new(CosineAnnealingLR::new(opt, i(a, "T_max"), f(a, "eta_min"))?)
        }
        "CosineAnnealingWarmRestarts" => Box::new(CosineAnnealingWarmRestarts::new(
            opt,
            i(a, "T_0"),
            i(a, "T_mult"),
            f(a, "eta_min"),
        )?),
        "OneCycleLR" => {
            let o = OneCycleOptions {
                pct_start: f(a, "pct_start"),
                anneal_strategy: if a["anneal_strategy"] == "linear" {
                    Anneal::Linear
                } else {
                    Anneal::Cos
                },
                cycle_momentum: b(a, "cycle_momentum"),
                base_momentum: f(a, "base_momentum"),
                max_momentum: f(a, "max_momentum"),
                div_factor: f(a, "div_factor"),
                final_div_factor: f(a, "final_div_factor"),
                three_phase: b(a, "three_phase"),
            };
            Box::new(OneCycleLR::new(
                opt,
                f(a, "max_lr"),
                i(a, "total_steps"),
                o,
            )?)
        }
        "SequentialLR" => {
            let mut subs = vec![];
            for s in a["schedulers"].as_array().unwrap() {
                subs.push(make_sched(opt, s["type"].as_str().unwrap(), s)?);
            }
            let ms = a["milestones"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_i64().unwrap())
                .collect();
            Box::new(SequentialLR::new(opt, subs, ms)?)
        }
        other => match super::sched_more::make(opt, other, a, make_sched) {
            Some(s) => s?,
            None => {
                return Err(kiln::Error::op(
                    "sched fixture",
                    format!("unknown scheduler {other}"),
                ))
            }
        },
    })
}

/// A fresh SGD over one parameter and the case's scheduler on it.
fn build(c: &Case) -> Result<(SGD, Sched), String> {
    let a = &c.attrs;
    let o = &a["optimizer"];
    let p = Tensor::zeros(&[1], DType::F64).requires_grad_(true);
    let cfg = SgdConfig {
        lr: f(o, "lr"),
        momentum: f(o, "momentum"),
        dampening: f(o, "dampening"),
        weight_decay: f(o, "weight_decay"),
        nesterov: b(o, "nesterov"),
        maximize: b(o, "maximize"),
        fused: false,
    };
    let mut opt = SGD::with_params(vec![p], cfg).map_err(|e| e.to_string())?;
    let ty = c.op.rsplit('.').next().unwrap();
    let s = if ty == "ReduceLROnPlateau" {
        let po = PlateauOptions {
            mode: a["mode"].as_str().unwrap().into(),
            factor: f(a, "factor"),
            patience: i(a, "patience"),
            threshold: f(a, "threshold"),
            threshold_mode: a["threshold_mode"].as_str().unwrap().into(),
            cooldown: i(a, "cooldown"),
            min_lr: vec![f(a, "min_lr")],
            eps: f(a, "eps"),
        };
        Sched::Plateau(ReduceLROnPlateau::new(&mut opt, po).map_err(|e| e.to_string())?)
    } else {
        Sched::Epoch(make_sched(&mut opt, ty, a).map_err(|e| e.to_string())?)
    };
    Ok((opt, s))
}

const RESUME_AT: usize = 20;

fn sched_case(fx: &Fixtures, c: &Case, raw: &Value) -> Result<(), String> {
    let metrics: Vec<f64> = raw["metrics"]
        .as_array()
        .map(|m| m.iter().map(|x| x.as_f64().unwrap()).collect())
        .unwrap_or_default();
    let (mut opt, mut s) = build(c)?;
    let (mut lrs, mut moms) = (vec![], vec![]);
    for t in 0..50 {
        if t == RESUME_AT {
            // save, then continue in a fresh optimizer + scheduler loaded from it
            let osd = opt.state_dict();
            let (mut opt2, mut s2) = build(c)?;
            opt2.load_state_dict(&osd).map_err(|e| e.to_string())?;
            match (&s, &mut s2) {
                (Sched::Epoch(a), Sched::Epoch(b)) => b.load_state_dict(&a.state_dict()),
                (Sched::Plateau(a), Sched::Plateau(b)) => b.load_state_dict(&a.state_dict()),
                _ => unreachable!(),
            }
            .map_err(|e| format!("load_state_dict: {e}"))?;
            (opt, s) = (opt2, s2);
        }
        let g = &opt.param_groups()[0];
        lrs.push(g.lr());
        moms.push(g.momentum().unwrap_or(f64::NAN));
        opt.step().map_err(|e| e.to_string())?;
        match &mut s {
            Sched::Epoch(s) => s.step(&mut opt),
            Sched::Plateau(p) => p.step(&mut opt, metrics[t]),
        }
        .map_err(|e| format!("step {t}: {e}"))?;
    }
    for (k, name) in c.outputs.iter().enumerate() {
        let got = if name.ends_with("/momentums") {
            &moms
        } else {
            &lrs
        };
        let got = Tensor::from_vec(got.clone(), &[50]).unwrap();
        let want = fx.tensor(c, name)?;
        compare(&got, &want, c.rtol, c.atol).map_err(|e| format!("out{k} ({name}): {e}"))?;
    }
    Ok(())
}
