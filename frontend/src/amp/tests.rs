use super::*;
use crate::functional as F;
use crate::nn::{Activation, Linear, Module, ModuleExt, Sequential};
use crate::optim::{Optimizer, SgdConfig, SGD};
use crate::random::{randn, Generator};
use kiln_ir::op::conv::ConvParams;
use kiln_passes::{ClassLossOpts, Reduction};

fn gen(seed: u64) -> Generator {
    Generator::new(seed)
}

fn sgd(params: Vec<Tensor>, lr: f64) -> SGD {
    SGD::with_params(
        params,
        SgdConfig {
            lr,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn autocast_runs_matmul_and_conv_low_and_losses_in_f32() {
    let mut g = gen(0);
    let x = randn(&[4, 3], Some(&mut g));
    let w = randn(&[5, 3], Some(&mut g));
    let b = randn(&[5], Some(&mut g));
    let img = randn(&[2, 3, 6, 6], Some(&mut g));
    let k = randn(&[4, 3, 3, 3], Some(&mut g));
    let target = Tensor::from_vec(vec![0i64, 1, 2, 3], &[4]).unwrap();
    assert!(!autocast_enabled());
    assert_eq!(F::linear(&x, &w, Some(&b)).unwrap().dtype(), DType::F32);
    let _ac = autocast_cpu();
    assert!(autocast_enabled() && autocast_dtype() == DType::BF16);
    let y = F::linear(&x, &w, Some(&b)).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(F::matmul(&x, &w.t().unwrap()).unwrap().dtype(), DType::BF16);
    let c = F::conv2d(&img, &k, None, &ConvParams::default()).unwrap();
    assert_eq!(c.dtype(), DType::BF16);
    // the bf16 result is the f32 one rounded (inputs rounded first)
    let y32 = {
        let _off = set_autocast_enabled(false);
        let r = |t: &Tensor| {
            t.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        };
        F::linear(&r(&x), &r(&w), Some(&r(&b))).unwrap()
    };
    for (a, e) in y.to_f64_vec().iter().zip(y32.to_f64_vec()) {
        assert!((a - e).abs() <= 1e-2 * (1.0 + e.abs()), "{a} vs {e}");
    }
    // fp32 list: losses, softmax, reductions, exp/log
    let l = F::cross_entropy(&y, &target, None, ClassLossOpts::default()).unwrap();
    assert_eq!(l.dtype(), DType::F32);
    let t = Tensor::zeros(&[4, 5], DType::BF16);
    assert_eq!(
        F::mse_loss(&y, &t, Reduction::Mean).unwrap().dtype(),
        DType::F32
    );
    for r in [
        y.softmax(-1).unwrap(),
        y.log_softmax(-1).unwrap(),
        y.sum(None, false).unwrap(),
        y.mean(Some(&[0]), false).unwrap(),
        y.exp().unwrap(),
        F::layer_norm(&y, &[5], None, None, 1e-5).unwrap(),
    ] {
        assert_eq!(r.dtype(), DType::F32);
    }
    // f64 and integer tensors are never cast; other pointwise ops keep bf16
    let x64 = x.to_dtype(DType::F64).unwrap();
    assert_eq!(
        F::matmul(&x64, &x64.t().unwrap()).unwrap().dtype(),
        DType::F64
    );
    assert_eq!(target.sum(None, false).unwrap().dtype(), DType::I64);
    assert_eq!(y.relu().unwrap().dtype(), DType::BF16);
}

#[test]
fn guards_nest_and_restore() {
    let x = Tensor::ones(&[2, 2], DType::F32);
    assert!(autocast(DType::F32).is_err());
    {
        let _a = autocast(DType::BF16).unwrap();
        {
            let _off = set_autocast_enabled(false);
            assert!(!autocast_enabled());
            assert_eq!(F::matmul(&x, &x).unwrap().dtype(), DType::F32);
            {
                let _f16 = autocast(DType::F16).unwrap();
                assert_eq!(F::matmul(&x, &x).unwrap().dtype(), DType::F16);
            }
            assert!(!autocast_enabled());
        }
        assert!(autocast_enabled());
        assert_eq!(F::matmul(&x, &x).unwrap().dtype(), DType::BF16);
    }
    assert!(!autocast_enabled());
    assert_eq!(autocast_dtype(), DEFAULT_DTYPE);
    // thread-local: another thread does not see this thread's scope
    let _a = autocast_cpu();
    assert!(!std::thread::spawn(autocast_enabled).join().unwrap());
}

#[test]
fn gradients_reach_f32_params_through_the_casts() {
    let mut g = gen(1);
    let x = randn(&[8, 4], Some(&mut g));
    let w = randn(&[3, 4], Some(&mut g)).requires_grad_(true);
    let b = randn(&[3], Some(&mut g)).requires_grad_(true);
    let grads = |ac: bool| {
        w.set_grad(None);
        b.set_grad(None);
        let _g = set_autocast_enabled(ac);
        let y = F::linear(&x, &w, Some(&b)).unwrap();
        let l = y.exp().unwrap().mean(None, false).unwrap();
        assert_eq!(l.dtype(), DType::F32);
        l.backward().unwrap();
        (w.grad().unwrap(), b.grad().unwrap())
    };
    let (gw, gb) = grads(true);
    assert_eq!((gw.dtype(), gb.dtype()), (DType::F32, DType::F32));
    let (ew, eb) = grads(false);
    for (a, e) in gw.to_f64_vec().iter().zip(ew.to_f64_vec()) {
        assert!((a - e).abs() < 3e-2 * (1.0 + e.abs()), "{a} vs {e}");
    }
    for (a, e) in gb.to_f64_vec().iter().zip(eb.to_f64_vec()) {
        assert!((a - e).abs() < 3e-2 * (1.0 + e.abs()), "{a} vs {e}");
    }
}

#[test]
fn inf_gradient_skips_the_step_and_backs_off() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2])
        .unwrap()
        .requires_grad_(true);
    let mut opt = sgd(vec![w.clone()], 0.1);
    let mut scaler = GradScaler::new();
    assert_eq!(scaler.get_scale(), 65536.0);
    // a clean step: the gradient is unscaled before the update
    let loss = w.sum(None, false).unwrap();
    let scaled = scaler.scale(&loss).unwrap();
    assert_eq!(scaled.item().unwrap(), 3.0 * 65536.0);
    scaled.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_f64_vec(), vec![65536.0; 2]);
    assert!(scaler.step(&mut opt).unwrap());
    scaler.update().unwrap();
    assert_eq!(w.grad().unwrap().to_f64_vec(), vec![1.0; 2]);
    let after = w.to_f64_vec();
    assert!((after[0] - 0.9).abs() < 1e-6 && (after[1] - 1.9).abs() < 1e-6);
    assert_eq!(
        (scaler.get_scale(), scaler.get_growth_tracker()),
        (65536.0, 1)
    );
    // an inf gradient: no update, scale halves, growth count restarts
    for bad in [f32::INFINITY, f32::NAN] {
        opt.zero_grad();
        w.set_grad(Some(Tensor::from_vec(vec![1.0f32, bad], &[2]).unwrap()));
        let before = scaler.get_scale();
        assert!(!scaler.step(&mut opt).unwrap());
        assert!(scaler.found_inf());
        scaler.update().unwrap();
        assert_eq!(w.to_f64_vec(), after, "params unchanged");
        assert_eq!(scaler.get_scale(), before * 0.5);
        assert_eq!(scaler.get_growth_tracker(), 0);
    }
}

#[test]
fn unscale_once_per_step_and_misuse_errors() {
    let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    let mut opt = sgd(vec![w.clone()], 0.1);
    let mut scaler = GradScaler::with_config(GradScalerConfig {
        init_scale: 4.0,
        ..Default::default()
    })
    .unwrap();
    assert!(scaler.update().is_err(), "update before any step");
    w.set_grad(Some(Tensor::full(&[2], 8.0, DType::F32)));
    scaler.unscale_(&mut opt).unwrap();
    assert_eq!(w.grad().unwrap().to_f64_vec(), vec![2.0; 2]);
    let e = scaler.unscale_(&mut opt).unwrap_err().to_string();
    assert!(e.contains("already been called"), "{e}");
    // step after unscale_ does not unscale again (clip_grad_norm_ between them works)
    assert!(scaler.step(&mut opt).unwrap());
    assert!((w.to_f64_vec()[0] - 0.8).abs() < 1e-6);
    assert!(scaler.step(&mut opt).is_err());
    scaler.update().unwrap();
    // f16 gradients are refused, as PyTorch does
    w.set_grad(Some(Tensor::ones(&[2], DType::F16)));
    assert!(scaler.unscale_(&mut opt).is_err());
    // disabled: a plain optimizer step
    let mut off = GradScaler::with_config(GradScalerConfig {
        enabled: false,
        ..Default::default()
    })
    .unwrap();
    w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    let l = Tensor::scalar(2.0f32);
    assert_eq!(off.scale(&l).unwrap().item().unwrap(), 2.0);
    assert!(off.step(&mut opt).unwrap());
    off.update().unwrap();
    assert_eq!(off.get_scale(), 1.0);
    assert!(off.state_dict().is_empty());
}

#[test]
fn scale_grows_after_growth_interval_clean_steps() {
    let w = Tensor::ones(&[1], DType::F32).requires_grad_(true);
    let mut opt = sgd(vec![w.clone()], 0.0);
    let mut scaler = GradScaler::with_config(GradScalerConfig {
        init_scale: 8.0,
        growth_interval: 3,
        ..Default::default()
    })
    .unwrap();
    let mut scales = vec![];
    for i in 0..7 {
        let g = if i == 4 { f32::INFINITY } else { 1.0 };
        w.set_grad(Some(Tensor::from_vec(vec![g], &[1]).unwrap()));
        scaler.step(&mut opt).unwrap();
        scaler.update().unwrap();
        scales.push(scaler.get_scale());
    }
    // grows on the 3rd clean step, backs off at the inf, counts again from 0
    assert_eq!(scales, vec![8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0]);
    assert_eq!(scaler.get_growth_tracker(), 2);
}

#[test]
fn scaler_state_round_trips() {
    let w = Tensor::ones(&[1], DType::F32).requires_grad_(true);
    let mut opt = sgd(vec![w.clone()], 0.0);
    let cfg = GradScalerConfig {
        init_scale: 1024.0,
        growth_factor: 4.0,
        backoff_factor: 0.25,
        growth_interval: 10,
        enabled: true,
    };
    let mut a = GradScaler::with_config(cfg).unwrap();
    for g in [f32::NAN, 1.0, 1.0] {
        w.set_grad(Some(Tensor::from_vec(vec![g], &[1]).unwrap()));
        a.step(&mut opt).unwrap();
        a.update().unwrap();
    }
    let sd = a.state_dict();
    let keys: Vec<&str> = sd.keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "_growth_tracker",
            "backoff_factor",
            "growth_factor",
            "growth_interval",
            "scale"
        ]
    );
    let mut b = GradScaler::new();
    b.load_state_dict(&sd).unwrap();
    assert_eq!(b.get_scale(), 256.0);
    assert_eq!(b.get_growth_tracker(), 2);
    assert_eq!(b.state_dict(), sd);
    let mut missing = sd.clone();
    missing.remove("scale");
    let e = b.load_state_dict(&missing).unwrap_err().to_string();
    assert!(e.contains("'scale'"), "{e}");
}

#[test]
fn a_small_model_trains_under_autocast_and_the_scaler() {
    let model = Sequential::new()
        .add(Linear::new(4, 16, true).unwrap())
        .add(Activation::relu())
        .add(Linear::new(16, 3, true).unwrap());
    // a private generator (the default one is shared with concurrent tests)
    let mut g = gen(7);
    for p in model.parameters() {
        let _ng = crate::autograd::no_grad();
        let init = randn(p.dims(), Some(&mut g));
        p.copy_(&(&init * 0.4)).unwrap();
    }
    let x = randn(&[32, 4], Some(&mut g));
    // the class is the index of the largest of the first three features
    let target = x.narrow(1, 0, 3).unwrap().argmax(Some(1), false).unwrap();
    let mut opt = SGD::with_params(
        model.parameters(),
        SgdConfig {
            lr: 0.5,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap();
    let mut scaler = GradScaler::new();
    let mut losses = vec![];
    for _ in 0..30 {
        opt.zero_grad();
        let loss = {
            let _ac = autocast_cpu();
            let logits = model.forward(&x).unwrap();
            assert_eq!(logits.dtype(), DType::BF16);
            F::cross_entropy(&logits, &target, None, ClassLossOpts::default()).unwrap()
        };
        assert_eq!(loss.dtype(), DType::F32);
        losses.push(loss.item().unwrap());
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(&mut opt).unwrap();
        scaler.update().unwrap();
    }
    for p in model.parameters() {
        assert_eq!(p.dtype(), DType::F32);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.5 * first, "loss {first} -> {last}: {losses:?}");
}
