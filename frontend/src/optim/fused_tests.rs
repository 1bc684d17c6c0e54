//! The fused optimizer step against the eager one (bit for bit), the
//! kernels it launches, and what falls back to the eager formula.

use super::*;
use crate::{DType, Tensor};
use kiln_codegen::Kernel;
use kiln_runtime::record_kernels;
use std::collections::HashSet;

const SHAPES: [&[usize]; 3] = [&[3, 5], &[7], &[2, 3, 4]];

fn data(dims: &[usize], seed: usize, dt: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i * 7 + seed * 13) % 17) as f64 - 8.0) * 0.173)
        .collect();
    Tensor::from_vec(v, dims).unwrap().to_dtype(dt).unwrap()
}

fn params(dt: DType) -> Vec<Tensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, d)| data(d, i, dt).requires_grad_(true))
        .collect()
}

fn set_grads(ps: &[Tensor], step: usize) {
    for (i, p) in ps.iter().enumerate() {
        p.set_grad(Some(data(p.dims(), step * 3 + i + 1, p.dtype())));
    }
}

#[derive(Clone)]
enum Kind {
    Sgd(SgdConfig),
    Adam(AdamConfig),
    AdamW(AdamConfig),
}

fn make(kind: &Kind, ps: Vec<Tensor>, fused: bool) -> Box<dyn Optimizer> {
    match kind {
        Kind::Sgd(c) => Box::new(SGD::with_params(ps, SgdConfig { fused, ..c.clone() }).unwrap()),
        Kind::Adam(c) => {
            Box::new(Adam::with_params(ps, AdamConfig { fused, ..c.clone() }).unwrap())
        }
        Kind::AdamW(c) => {
            Box::new(AdamW::with_params(ps, AdamConfig { fused, ..c.clone() }).unwrap())
        }
    }
}

fn sgd(lr: f64, momentum: f64, dampening: f64, wd: f64, nesterov: bool, maximize: bool) -> Kind {
    Kind::Sgd(SgdConfig {
        lr,
        momentum,
        dampening,
        weight_decay: wd,
        nesterov,
        maximize,
        fused: false,
    })
}

fn adam(lr: f64, betas: (f64, f64), wd: f64, maximize: bool) -> AdamConfig {
    AdamConfig {
        lr,
        betas,
        weight_decay: wd,
        maximize,
        ..Default::default()
    }
}

fn cases() -> Vec<(&'static str, Kind)> {
    vec![
        ("sgd", sgd(0.1, 0.0, 0.0, 0.0, false, false)),
        ("sgd momentum", sgd(0.1, 0.9, 0.0, 0.0, false, false)),
        ("sgd dampening", sgd(0.05, 0.9, 0.3, 0.0, false, false)),
        ("sgd nesterov", sgd(0.1, 0.8, 0.0, 0.0, true, false)),
        ("sgd wd", sgd(0.1, 0.9, 0.0, 0.01, false, false)),
        ("sgd wd no momentum", sgd(0.1, 0.0, 0.0, 0.05, false, false)),
        ("sgd maximize", sgd(0.1, 0.5, 0.0, 0.1, false, true)),
        ("adam", Kind::Adam(adam(0.01, (0.9, 0.999), 0.0, false))),
        ("adam wd", Kind::Adam(adam(0.01, (0.9, 0.999), 0.1, false))),
        (
            "adam maximize",
            Kind::Adam(adam(0.02, (0.8, 0.99), 0.0, true)),
        ),
        ("adamw", Kind::AdamW(adam(0.01, (0.9, 0.999), 0.01, false))),
        // 1 - beta1 >= 0.5 takes lerp's other side
        (
            "adamw low beta1",
            Kind::AdamW(adam(0.01, (0.3, 0.9), 0.1, true)),
        ),
    ]
}

/// The fused step kernels `f` launched (not fills of fresh state).
fn step_kernels(f: impl FnOnce()) -> Vec<Kernel> {
    let ((), ks) = record_kernels(f);
    ks.into_iter()
        .filter(|k| k.name.ends_with("_step"))
        .collect()
}

#[test]
fn fused_step_equals_eager_bit_for_bit() {
    for dt in [DType::F32, DType::F64] {
        for (name, kind) in cases() {
            let (pe, pf) = (params(dt), params(dt));
            let mut eager = make(&kind, pe.clone(), false);
            let mut fused = make(&kind, pf.clone(), true);
            for step in 0..4 {
                set_grads(&pe, step);
                set_grads(&pf, step);
                eager.step().unwrap();
                let ks = step_kernels(|| fused.step().unwrap());
                assert_eq!(ks.len(), 3, "{name}: one launch per parameter");
                assert_eq!(
                    ks.iter().collect::<HashSet<_>>().len(),
                    1,
                    "{name}: one kernel"
                );
                for (a, b) in pe.iter().zip(&pf) {
                    assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{name} {dt} step {step}");
                }
            }
            for (a, b) in pe.iter().zip(&pf) {
                let (se, sf) = (eager.state(a).unwrap(), fused.state(b).unwrap());
                assert_eq!(se.keys().collect::<Vec<_>>(), sf.keys().collect::<Vec<_>>());
                for (k, t) in se {
                    assert_eq!(t.to_f64_vec(), sf[k].to_f64_vec(), "{name} {dt} state {k}");
                }
            }
        }
    }
}

#[test]
fn one_kernel_per_dtype_and_lr_changes_reuse_it() {
    let dims: [&[usize]; 4] = [&[4, 5], &[9], &[3, 2, 2], &[33]];
    let ps: Vec<Tensor> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let dt = if i % 2 == 0 { DType::F32 } else { DType::F64 };
            data(d, i, dt).requires_grad_(true)
        })
        .collect();
    for kind in [
        sgd(0.1, 0.9, 0.0, 0.01, true, false),
        Kind::AdamW(adam(0.01, (0.9, 0.999), 0.01, false)),
    ] {
        let mut opt = make(&kind, ps.clone(), true);
        let mut seen: Option<HashSet<Kernel>> = None;
        for step in 0..3 {
            set_grads(&ps, step);
            opt.param_groups_mut()[0].set_lr(0.1 / (step + 1) as f64);
            let ks = step_kernels(|| opt.step().unwrap());
            assert_eq!(ks.len(), ps.len());
            let distinct: HashSet<Kernel> = ks.into_iter().collect();
            assert_eq!(distinct.len(), 2, "one kernel per dtype");
            // same kernels (the runtime's cache key) whatever lr and step are
            if let Some(s) = &seen {
                assert_eq!(s, &distinct, "step {step} needs another kernel");
            }
            seen = Some(distinct);
        }
    }
}

#[test]
fn params_without_grad_are_skipped() {
    let (a, b) = (data(&[6], 1, DType::F32), data(&[6], 2, DType::F32));
    let (a, b) = (a.requires_grad_(true), b.requires_grad_(true));
    let before = b.to_f64_vec();
    let mut opt = make(
        &Kind::Adam(AdamConfig::default()),
        vec![a.clone(), b.clone()],
        true,
    );
    a.set_grad(Some(data(&[6], 3, DType::F32)));
    let ks = step_kernels(|| opt.step().unwrap());
    assert_eq!(ks.len(), 1);
    assert_eq!(b.to_f64_vec(), before);
    assert!(opt.state(&b).is_none());
    assert!(opt.state(&a).is_some());
}

#[test]
fn unsupported_cases_fall_back_to_eager() {
    // amsgrad, a transposed (non-contiguous) parameter, f16
    let ams = AdamConfig {
        amsgrad: true,
        ..AdamConfig::default()
    };
    let transposed = || {
        data(&[5, 3], 4, DType::F32)
            .transpose(0, 1)
            .unwrap()
            .detach()
            .requires_grad_(true)
    };
    let setups: Vec<(&str, Kind, fn(usize) -> Tensor)> = vec![
        ("amsgrad", Kind::Adam(ams), |_| {
            data(&[4, 3], 0, DType::F32).requires_grad_(true)
        }),
        ("half", sgd(0.1, 0.9, 0.0, 0.0, false, false), |_| {
            half_param()
        }),
    ];
    for (name, kind, mk) in setups {
        let (pe, pf) = (mk(0), mk(0));
        let mut eager = make(&kind, vec![pe.clone()], false);
        let mut fused = make(&kind, vec![pf.clone()], true);
        for step in 0..3 {
            for p in [&pe, &pf] {
                p.set_grad(Some(data(p.dims(), step + 7, p.dtype())));
            }
            eager.step().unwrap();
            let ks = step_kernels(|| fused.step().unwrap());
            assert!(ks.is_empty(), "{name}: should run the eager formula");
            assert_eq!(pe.to_f64_vec(), pf.to_f64_vec(), "{name}");
        }
    }
    let (pe, pf) = (transposed(), transposed());
    assert!(!pf.is_contiguous());
    let kind = Kind::AdamW(AdamConfig::adamw());
    let mut eager = make(&kind, vec![pe.clone()], false);
    let mut fused = make(&kind, vec![pf.clone()], true);
    for p in [&pe, &pf] {
        p.set_grad(Some(data(p.dims(), 9, p.dtype())));
    }
    eager.step().unwrap();
    assert!(step_kernels(|| fused.step().unwrap()).is_empty());
    assert_eq!(pe.to_f64_vec(), pf.to_f64_vec());
}

fn half_param() -> Tensor {
    data(&[8], 5, DType::F16).requires_grad_(true)
}

#[test]
fn eager_state_continues_fused() {
    let kind = Kind::Adam(adam(0.01, (0.9, 0.999), 0.05, false));
    let (pe, pf) = (params(DType::F32), params(DType::F32));
    let mut eager = make(&kind, pe.clone(), false);
    let mut first = make(&kind, pf.clone(), false);
    for step in 0..2 {
        set_grads(&pe, step);
        set_grads(&pf, step);
        eager.step().unwrap();
        first.step().unwrap();
    }
    let mut fused = make(&kind, pf.clone(), true);
    fused.load_state_dict(&first.state_dict()).unwrap();
    // the saved groups say fused: false, as PyTorch's would
    assert!(!fused.param_groups()[0].bool("fused").unwrap());
    fused.param_groups_mut()[0].set("fused", true);
    for step in 2..4 {
        set_grads(&pe, step);
        set_grads(&pf, step);
        eager.step().unwrap();
        assert_eq!(step_kernels(|| fused.step().unwrap()).len(), 3);
        for (a, b) in pe.iter().zip(&pf) {
            assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "step {step}");
        }
    }
}
