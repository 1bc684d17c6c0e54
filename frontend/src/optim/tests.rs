//! Optimizer behaviour beyond the PyTorch fixtures: groups, zero_grad,
//! state_dict round trips, skipped parameters, clipping by value.

use super::*;
use crate::{DType, Tensor};

fn t(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn param(v: &[f32]) -> Tensor {
    t(v).requires_grad_(true)
}

fn close(a: &Tensor, b: &[f64]) {
    let a = a.to_f64_vec();
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

#[test]
fn groups_keep_their_own_lr_and_fill_defaults() {
    let (a, b) = (param(&[1.0, 1.0]), param(&[1.0]));
    let groups = vec![
        ParamGroup::new(vec![a.clone()]),
        ParamGroup::new(vec![b.clone()])
            .with("lr", 0.5)
            .with("momentum", 0.0),
    ];
    let cfg = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    };
    let mut opt = SGD::new(groups, cfg).unwrap();
    assert_eq!(opt.param_groups()[0].lr(), 0.1);
    assert_eq!(opt.param_groups()[1].lr(), 0.5);
    assert_eq!(opt.param_groups()[1].f64("dampening").unwrap(), 0.0);
    for _ in 0..2 {
        a.set_grad(Some(t(&[1.0, 2.0])));
        b.set_grad(Some(t(&[1.0])));
        opt.step().unwrap();
    }
    // group 0: buf 1 then 1.9 -> 1 - 0.1 - 0.19; group 1: no momentum
    close(&a, &[1.0 - 0.1 - 0.19, 1.0 - 0.2 - 0.38]);
    close(&b, &[0.0]);
    opt.param_groups_mut()[1].set_lr(1.0);
    b.set_grad(Some(t(&[1.0])));
    a.set_grad(None);
    opt.step().unwrap();
    close(&b, &[-1.0]);
    close(&a, &[1.0 - 0.1 - 0.19, 1.0 - 0.2 - 0.38]); // no grad: skipped
                                                      // the same parameter twice is an error, as in PyTorch
    let dup = opt.add_param_group(ParamGroup::new(vec![a.clone()]));
    assert!(dup.is_err());
}

#[test]
fn zero_grad_sets_none_and_updates_reach_every_clone() {
    let p = param(&[2.0]);
    let field = p.clone();
    let mut opt = Adam::with_params(
        vec![p.clone()],
        AdamConfig {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    p.set_grad(Some(t(&[1.0])));
    opt.step().unwrap();
    close(&field, &[1.9]);
    opt.zero_grad();
    assert!(p.grad().is_none() && field.grad().is_none());
}

/// Runs `steps` steps of an optimizer built by `make` with fixed grads.
fn run(opt: &mut dyn Optimizer, p: &Tensor, from: usize, to: usize) {
    for s in from..to {
        let g: Vec<f32> = (0..3).map(|i| ((s * 3 + i) as f32 * 0.7).sin()).collect();
        p.set_grad(Some(t(&g)));
        opt.step().unwrap();
    }
}

fn round_trip(make: &dyn Fn(Tensor) -> Box<dyn Optimizer>) {
    let p = param(&[0.5, -1.0, 2.0]);
    let mut opt = make(p.clone());
    run(opt.as_mut(), &p, 0, 2);
    let sd = opt.state_dict();
    let q = p.copy().unwrap().requires_grad_(true);
    let mut fresh = make(q.clone());
    fresh.load_state_dict(&sd).unwrap();
    run(opt.as_mut(), &p, 2, 3);
    run(fresh.as_mut(), &q, 2, 3);
    assert_eq!(p.to_f64_vec(), q.to_f64_vec());
    let (a, b) = (opt.state(&p).unwrap(), fresh.state(&q).unwrap());
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, v) in a {
        assert_eq!(v.to_f64_vec(), b[k].to_f64_vec(), "state {k}");
    }
}

#[test]
fn state_dict_round_trip_every_optimizer() {
    round_trip(&|p| {
        let cfg = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
            ..Default::default()
        };
        Box::new(SGD::with_params(vec![p], cfg).unwrap())
    });
    round_trip(&|p| {
        let cfg = AdamConfig {
            lr: 0.01,
            amsgrad: true,
            weight_decay: 0.1,
            ..Default::default()
        };
        Box::new(Adam::with_params(vec![p], cfg).unwrap())
    });
    round_trip(&|p| Box::new(AdamW::with_params(vec![p], AdamConfig::adamw()).unwrap()));
    round_trip(&|p| {
        let cfg = RmspropConfig {
            momentum: 0.9,
            centered: true,
            ..Default::default()
        };
        Box::new(RMSprop::with_params(vec![p], cfg).unwrap())
    });
    round_trip(&|p| {
        let cfg = AdagradConfig {
            lr_decay: 0.01,
            ..Default::default()
        };
        Box::new(Adagrad::with_params(vec![p], cfg).unwrap())
    });
}

#[test]
fn state_dict_names_and_checks() {
    let p = param(&[1.0, 2.0]);
    let mut opt = Adam::with_params(vec![p.clone()], AdamConfig::default()).unwrap();
    p.set_grad(Some(t(&[0.1, 0.2])));
    opt.step().unwrap();
    let mut sd = opt.state_dict();
    let keys: Vec<&String> = sd.state[&0].keys().collect();
    assert_eq!(keys, ["exp_avg", "exp_avg_sq", "step"]);
    assert_eq!(sd.state[&0]["step"].item().unwrap(), 1.0);
    assert_eq!(sd.param_groups[0]["lr"], Value::Float(1e-3));
    assert_eq!(sd.param_groups[0]["params"], Value::Ints(vec![0]));
    // the saved state is a copy: later steps do not change it
    opt.step().unwrap();
    assert_eq!(sd.state[&0]["step"].item().unwrap(), 1.0);
    // the lr saved with the groups comes back on load
    sd.param_groups[0].insert("lr".into(), Value::Float(0.5));
    opt.load_state_dict(&sd).unwrap();
    assert_eq!(opt.param_groups()[0].lr(), 0.5);
    // a group of another size is an error
    let two = vec![param(&[1.0]), param(&[2.0])];
    let mut other = Adam::with_params(two, AdamConfig::default()).unwrap();
    let e = other.load_state_dict(&sd).unwrap_err().to_string();
    assert!(e.contains("parameter group"), "{e}");
}

#[test]
fn clip_grad_value_and_inf_norm() {
    let p = param(&[0.0, 0.0, 0.0]);
    p.set_grad(Some(t(&[-3.0, 0.5, 2.0])));
    clip_grad_value_(std::slice::from_ref(&p), 1.0).unwrap();
    close(&p.grad().unwrap(), &[-1.0, 0.5, 1.0]);
    let total = clip_grad_norm_(std::slice::from_ref(&p), 0.5, f64::INFINITY).unwrap();
    assert_eq!(total.item().unwrap(), 1.0);
    close(&p.grad().unwrap(), &[-0.5, 0.25, 0.5]);
    let none = clip_grad_norm_(&[param(&[1.0])], 1.0, 2.0).unwrap();
    assert_eq!(none.item().unwrap(), 0.0);
    assert_eq!(Tensor::zeros(&[1], DType::F32).dtype(), DType::F32);
}
