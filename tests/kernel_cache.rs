//! The kernel cache is keyed by signature (dtypes, rank after collapsing,
//! inner-stride pattern), not sizes: a new batch size reuses machine code.
//! (Its own test binary: the cache counters are process-wide.)

use kiln::runtime::cache_stats;
use kiln::{DType, Tensor};

// Counters are process-wide: tests in this binary take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn launches() -> usize {
    let s = cache_stats();
    s.hits + s.compiles
}

#[test]
fn new_batch_size_reuses_machine_code() {
    let _g = SERIAL.lock().unwrap();
    let x = Tensor::full(&[8, 100], 0.5, DType::F32);
    let before = cache_stats();
    let y = x.elu(0.7).unwrap();
    let after_first = cache_stats();
    assert_eq!(
        after_first.compiles,
        before.compiles + 1,
        "first elu compiles one kernel"
    );

    for batch in [1usize, 3, 16, 257] {
        let x = Tensor::full(&[batch, 100], -0.25, DType::F32);
        x.elu(0.7).unwrap();
    }
    let after_sizes = cache_stats();
    assert_eq!(
        after_sizes.compiles, after_first.compiles,
        "other sizes reuse the kernel"
    );
    assert!(after_sizes.hits >= after_first.hits + 4);

    // a transposed input is another signature (strided inner loop): one new kernel,
    // then reused for other sizes too
    let t = Tensor::full(&[100, 8], 1.0, DType::F32).t().unwrap();
    t.elu(0.7).unwrap();
    let after_t = cache_stats();
    assert_eq!(after_t.compiles, after_sizes.compiles + 1);
    Tensor::full(&[100, 33], 1.0, DType::F32)
        .t()
        .unwrap()
        .elu(0.7)
        .unwrap();
    assert_eq!(cache_stats().compiles, after_t.compiles);
    assert_eq!(y.dims(), &[8, 100]);
}

#[test]
fn eager_composites_fuse_pointwise_chains() {
    let _g = SERIAL.lock().unwrap();
    let x = Tensor::full(&[64, 256], 0.5, DType::F32);
    let (w, b) = (
        Tensor::ones(&[256], DType::F32),
        Tensor::zeros(&[256], DType::F32),
    );
    let count = |f: &dyn Fn()| {
        let before = launches();
        f();
        launches() - before
    };
    // one online log-sum-exp pass storing (shift, logsum), whose row pass
    // stores exp((x - shift) - logsum)
    assert_eq!(count(&|| drop(x.softmax(-1).unwrap())), 1);
    // the same pass; its row pass stores (x - shift) - logsum
    assert_eq!(count(&|| drop(x.log_softmax(-1).unwrap())), 1);
    // the log-sum-exp pass alone
    assert_eq!(count(&|| drop(x.logsumexp(&[-1], false).unwrap())), 1);
    // one Welford pass storing (mean, var, rstd); its row pass stores
    // (x - mean) * rstd * w + b
    assert_eq!(
        count(&|| drop(
            kiln::functional::layer_norm(&x, &[256], Some(&w), Some(&b), 1e-5).unwrap()
        )),
        1
    );
    // over a dim that is not the last: the reduction, then the reader
    assert_eq!(count(&|| drop(x.softmax(0).unwrap())), 2);
    // unfused gelu chain of W1 is one kernel per op
    assert_eq!(count(&|| drop(x.gelu(false).unwrap())), 1);
}

/// `fused: true` optimizers compile one step kernel per dtype, whatever the
/// parameters' shapes, and an lr schedule or the step count never recompiles.
#[test]
fn fused_optimizer_compiles_one_kernel_per_dtype() {
    use kiln::optim::{AdamConfig, AdamW, Optimizer, SgdConfig, SGD};
    let _g = SERIAL.lock().unwrap();
    let shapes: [&[usize]; 6] = [&[4, 5], &[9], &[3, 2, 2], &[33], &[2, 7], &[5, 1, 3]];
    let make = || -> Vec<Tensor> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let dt = if i % 2 == 0 { DType::F32 } else { DType::F64 };
                Tensor::full(d, 0.1 * i as f64, dt).requires_grad_(true)
            })
            .collect()
    };
    let grads = |ps: &[Tensor], step: usize| {
        let gs: Vec<Tensor> = ps
            .iter()
            .map(|p| Tensor::full(p.dims(), 0.3 - 0.1 * step as f64, p.dtype()))
            .collect();
        for (p, g) in ps.iter().zip(gs) {
            p.set_grad(Some(g));
        }
    };
    let sgd = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 1e-2,
        nesterov: true,
        fused: true,
        ..Default::default()
    };
    let adamw = AdamConfig {
        fused: true,
        ..AdamConfig::adamw()
    };
    let opts: Vec<(&str, Box<dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>>)> = vec![
        (
            "sgd",
            Box::new(move |ps| Box::new(SGD::with_params(ps, sgd.clone()).unwrap())),
        ),
        (
            "adamw",
            Box::new(move |ps| Box::new(AdamW::with_params(ps, adamw.clone()).unwrap())),
        ),
    ];
    // reading the `step` counter (a 0-dim f32) is its own one-off kernel
    Tensor::scalar(1.0f32).item().unwrap();
    for (name, mk) in opts {
        let ps = make();
        let mut opt = mk(ps.clone());
        for step in 0..4 {
            grads(&ps, step);
            opt.param_groups_mut()[0].set_lr(0.1 / (step + 1) as f64);
            let before = cache_stats().compiles;
            opt.step().unwrap();
            let compiled = cache_stats().compiles - before;
            let want = if step == 0 { 2 } else { 0 };
            assert_eq!(compiled, want, "{name} step {step}: compiles");
        }
    }
}
