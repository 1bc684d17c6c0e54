//! Scheduler state round trips and the hand-checkable sequences.

use super::*;
use crate::optim::{Adam, AdamConfig, Optimizer, ParamGroup, SgdConfig, SGD};
use crate::{DType, Tensor};

fn sgd() -> SGD {
    let p = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    let q = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    let groups = vec![
        ParamGroup::new(vec![p]),
        ParamGroup::new(vec![q]).with("lr", 0.01),
    ];
    SGD::new(
        groups,
        SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap()
}

type Make = dyn Fn(&mut SGD) -> Box<dyn LRScheduler>;

/// Saves after `k` steps, loads into a fresh optimizer + scheduler; the next lrs match.
fn round_trip(make: &Make, k: usize) {
    let mut opt = sgd();
    let mut s = make(&mut opt);
    for _ in 0..k {
        s.step(&mut opt).unwrap();
    }
    let (osd, ssd) = (opt.state_dict(), s.state_dict());
    let mut opt2 = sgd();
    let mut s2 = make(&mut opt2);
    opt2.load_state_dict(&osd).unwrap();
    s2.load_state_dict(&ssd).unwrap();
    assert_eq!(s.get_last_lr(), s2.get_last_lr());
    for _ in 0..15 {
        s.step(&mut opt).unwrap();
        s2.step(&mut opt2).unwrap();
        let lr = |o: &SGD| {
            o.param_groups()
                .iter()
                .map(|g| (g.lr(), g.momentum()))
                .collect::<Vec<_>>()
        };
        assert_eq!(lr(&opt), lr(&opt2));
        assert_eq!(s.get_last_lr(), s2.get_last_lr());
    }
}

#[test]
fn every_scheduler_saves_and_loads() {
    let makers: Vec<Box<Make>> = vec![
        Box::new(|o| Box::new(StepLR::new(o, 3, 0.5).unwrap())),
        Box::new(|o| Box::new(MultiStepLR::new(o, &[2, 5, 5, 9], 0.5).unwrap())),
        Box::new(|o| Box::new(ExponentialLR::new(o, 0.9).unwrap())),
        Box::new(|o| Box::new(LinearLR::new(o, 0.1, 1.0, 6).unwrap())),
        Box::new(|o| Box::new(CosineAnnealingLR::new(o, 7, 1e-3).unwrap())),
        Box::new(|o| Box::new(CosineAnnealingWarmRestarts::new(o, 3, 2, 0.0).unwrap())),
        Box::new(|o| Box::new(OneCycleLR::new(o, 0.2, 30, OneCycleOptions::default()).unwrap())),
        Box::new(|o| {
            let a: Box<dyn LRScheduler> = Box::new(LinearLR::new(o, 0.1, 1.0, 4).unwrap());
            let b: Box<dyn LRScheduler> = Box::new(CosineAnnealingLR::new(o, 10, 0.0).unwrap());
            Box::new(SequentialLR::new(o, vec![a, b], vec![4]).unwrap())
        }),
    ];
    for m in &makers {
        for k in [0, 2, 5] {
            round_trip(m.as_ref(), k);
        }
    }
}

#[test]
fn plateau_saves_and_loads() {
    let metrics = [1.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8];
    let o = || PlateauOptions {
        patience: 1,
        cooldown: 1,
        factor: 0.5,
        ..Default::default()
    };
    let mut opt = sgd();
    let mut s = ReduceLROnPlateau::new(&mut opt, o()).unwrap();
    for m in &metrics[..4] {
        s.step(&mut opt, *m).unwrap();
    }
    let mut opt2 = sgd();
    let mut s2 = ReduceLROnPlateau::new(&mut opt2, o()).unwrap();
    opt2.load_state_dict(&opt.state_dict()).unwrap();
    s2.load_state_dict(&s.state_dict()).unwrap();
    for m in &metrics[4..] {
        s.step(&mut opt, *m).unwrap();
        s2.step(&mut opt2, *m).unwrap();
        assert_eq!(s.get_last_lr(), s2.get_last_lr());
    }
    assert!(s.get_last_lr()[0] < 0.1);
}

#[test]
fn one_cycle_cycles_adam_beta1() {
    let p = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    let mut opt = Adam::with_params(vec![p], AdamConfig::default()).unwrap();
    let mut s = OneCycleLR::new(&mut opt, 0.1, 10, OneCycleOptions::default()).unwrap();
    assert!((opt.param_groups()[0].lr() - 0.004).abs() < 1e-12);
    assert_eq!(opt.param_groups()[0].betas().unwrap(), (0.95, 0.999));
    // the peak is at step pct_start * total - 1 = 2
    for _ in 0..2 {
        s.step(&mut opt).unwrap();
    }
    assert!((opt.param_groups()[0].lr() - 0.1).abs() < 1e-12);
    assert!((opt.param_groups()[0].betas().unwrap().0 - 0.85).abs() < 1e-12);
}

#[test]
fn cosine_climbs_again_past_t_max() {
    let mut opt = sgd();
    let mut s = CosineAnnealingLR::new(&mut opt, 4, 0.0).unwrap();
    let mut lrs = vec![];
    for _ in 0..9 {
        lrs.push(opt.param_groups()[0].lr());
        s.step(&mut opt).unwrap();
    }
    assert!(lrs[4].abs() < 1e-12);
    assert!((lrs[8] - 0.1).abs() < 1e-9, "{lrs:?}");
}
