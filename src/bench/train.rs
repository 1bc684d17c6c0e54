//! W5, W6 and GPT2: training steps, timed eagerly and with the model wrapped
//! in `compile(&model)` (loss and optimizer stay eager, as
//! `torch.compile(model)` does in `benches/torch_baseline.py`'s
//! `train_step_factory`).
//!
//! A step is `zero_grad` (grads set to None) + forward + cross-entropy +
//! backward + optimizer step. Each mode builds a fresh model after
//! `manual_seed(1)` and trains it on one fixed batch; a compiled row reports
//! its first step (trace and compile) as `compile_ms`.

use super::{peak_of, randn, row, time_ms, Row};
use crate::ir::op::conv::Padding;
use crate::models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use crate::nn::{
    Activation, BatchNorm, Conv, ConvOptions, Flatten, Linear, Module, ModuleExt, Pool2d,
    Sequential,
};
use crate::optim::{AdamConfig, AdamW, Optimizer, SgdConfig, SGD};
use crate::random::{randint, Generator};
use crate::{functional as F, ClassLossOpts, Result, Tensor};
use std::time::Instant;

/// A model with its optimizer.
pub type ModelAndOpt = (Box<dyn Module>, Box<dyn Optimizer>);

/// A training-step workload: how to build the model and optimizer, and the batch.
pub struct TrainWorkload {
    pub name: &'static str,
    pub what: &'static str,
    /// "gflops" or "" (no rate).
    pub unit: &'static str,
    /// Flops per step (gflops).
    pub amount: f64,
    /// Builds the model and optimizer; `fused`: the optimizer step as one
    /// kernel per dtype (compiled mode), else PyTorch's default per-tensor step.
    pub build: fn(bool) -> Result<ModelAndOpt>,
    pub x: Tensor,
    pub y: Tensor,
}

/// `small_cnn()` of the baseline: Conv(1,8,3,p1)-BN-ReLU-Conv(8,16,3,s2,p1)-BN-ReLU-
/// AdaptiveAvgPool(1)-Flatten-Linear(16,10).
pub fn small_cnn() -> Result<Sequential> {
    let p1 = ConvOptions {
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
    let p2 = ConvOptions {
        stride: 2,
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
    Ok(Sequential::new()
        .add(Conv::conv2d(1, 8, 3, p1)?)
        .add(BatchNorm::new_2d(8))
        .add(Activation::relu())
        .add(Conv::conv2d(8, 16, 3, p2)?)
        .add(BatchNorm::new_2d(16))
        .add(Activation::relu())
        .add(Pool2d::AdaptiveAvg([1, 1]))
        .add(Flatten::default())
        .add(Linear::new(16, 10, true)?))
}

/// `mlp()` of the baseline: Linear(784,1024)-ReLU-Linear(1024,1024)-ReLU-Linear(1024,10).
pub fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(784, 1024, true)?)
        .add(Activation::relu())
        .add(Linear::new(1024, 1024, true)?)
        .add(Activation::relu())
        .add(Linear::new(1024, 10, true)?))
}

fn labels(n: usize, seed: u64) -> Tensor {
    randint(0, 10, &[n], Some(&mut Generator::new(seed))).expect("valid range")
}

/// W5: small CNN training step at batch 256 on (256,1,8,8), SGD(lr 0.1, momentum 0.9).
pub fn w5() -> TrainWorkload {
    TrainWorkload {
        name: "W5",
        what: "small CNN train step, batch 256, SGD momentum",
        unit: "",
        amount: 0.0,
        build: |fused| {
            crate::manual_seed(1);
            let m = small_cnn()?;
            let cfg = SgdConfig {
                lr: 0.1,
                momentum: 0.9,
                fused,
                ..SgdConfig::default()
            };
            let opt = SGD::with_params(m.parameters(), cfg)?;
            Ok((Box::new(m), Box::new(opt)))
        },
        x: randn(&[256, 1, 8, 8], 19),
        y: labels(256, 20),
    }
}

/// W6: MLP 784-1024-1024-10 training step at batch 256, AdamW(lr 1e-3, weight_decay 0.01).
pub fn w6() -> TrainWorkload {
    TrainWorkload {
        name: "W6",
        what: "MLP 784-1024-1024-10 train step, batch 256, AdamW",
        unit: "gflops",
        amount: 3.0 * 2.0 * 256.0 * (784.0 * 1024.0 + 1024.0 * 1024.0 + 1024.0 * 10.0),
        build: |fused| {
            crate::manual_seed(1);
            let m = mlp()?;
            let cfg = AdamConfig {
                lr: 1e-3,
                weight_decay: 0.01,
                fused,
                ..AdamConfig::default()
            };
            let opt = AdamW::with_params(m.parameters(), cfg)?;
            Ok((Box::new(m), Box::new(opt)))
        },
        x: randn(&[256, 784], 21),
        y: labels(256, 22),
    }
}

/// GPT-2's logits as (batch * seq, vocab), the shape cross-entropy takes
/// (the baseline wraps GPT2LMHeadModel the same way).
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct FlatLogits {
    pub lm: Gpt2LMHeadModel,
}

impl FlatLogits {
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let logits = self.lm.forward(ids)?;
        let vocab = logits.dims()[2] as i64;
        logits.reshape(&[-1, vocab])
    }
}

/// The GPT2 workload's model: transformers' GPT2LMHeadModel with 4 layers,
/// d 256, 4 heads, vocab 8192, 128 positions, no dropout.
pub fn gpt2_config() -> Gpt2Config {
    Gpt2Config {
        vocab_size: 8192,
        n_positions: 128,
        n_embd: 256,
        n_layer: 4,
        n_head: 4,
        resid_pdrop: 0.0,
        embd_pdrop: 0.0,
        attn_pdrop: 0.0,
        ..Gpt2Config::default()
    }
}

/// GPT2: a GPT-2 (see [`gpt2_config`]) training step on random token ids
/// (8, 128) and random next tokens, AdamW(lr 1e-3, weight_decay 0.01).
pub fn gpt2() -> TrainWorkload {
    let c = gpt2_config();
    let (batch, seq) = (8, c.n_positions);
    let ids = randint(
        0,
        c.vocab_size as i64,
        &[batch, seq],
        Some(&mut Generator::new(24)),
    );
    let next = randint(
        0,
        c.vocab_size as i64,
        &[batch * seq],
        Some(&mut Generator::new(25)),
    );
    TrainWorkload {
        name: "GPT2",
        what: "GPT-2 4 layers d256 4 heads vocab 8192 train step, batch 8 x 128 tokens, AdamW",
        unit: "",
        amount: 0.0,
        build: |fused| {
            crate::manual_seed(1);
            let m = FlatLogits {
                lm: Gpt2LMHeadModel::new(&gpt2_config())?,
            };
            let cfg = AdamConfig {
                lr: 1e-3,
                weight_decay: 0.01,
                fused,
                ..AdamConfig::default()
            };
            let opt = AdamW::with_params(m.parameters(), cfg)?;
            Ok((Box::new(m), Box::new(opt)))
        },
        x: ids.expect("valid range"),
        y: next.expect("valid range"),
    }
}

/// One training step: zero_grad (set to None), forward through `fwd`,
/// cross-entropy, backward, optimizer step. Returns the loss.
pub fn step(
    fwd: &dyn Fn(&Tensor) -> Result<Tensor>,
    opt: &mut dyn Optimizer,
    x: &Tensor,
    y: &Tensor,
) -> Result<Tensor> {
    opt.zero_grad();
    let loss = F::cross_entropy(&fwd(x)?, y, None, ClassLossOpts::default())?;
    loss.backward()?;
    opt.step()?;
    Ok(loss)
}

/// Times `w`'s step eagerly, or with the model compiled (its first step is
/// reported as `compile_ms`); median of `iters` steps after 2 warm-up steps,
/// then the peak memory of one more step.
pub fn measure_train(w: &TrainWorkload, compiled: bool, iters: usize) -> Result<Row> {
    let (model, mut opt) = (w.build)(compiled)?;
    model.train();
    let (ms, compile_ms, peak) = if compiled {
        let c = crate::compile::compile(model.as_ref());
        let fwd = |x: &Tensor| c.forward(x);
        let s = Instant::now();
        step(&fwd, &mut *opt, &w.x, &w.y)?;
        let first = s.elapsed().as_secs_f64() * 1e3;
        let ms = time_ms(iters, 2, || {
            std::hint::black_box(step(&fwd, &mut *opt, &w.x, &w.y)?);
            Ok(())
        })?;
        let peak = peak_of(|| Ok(vec![step(&fwd, &mut *opt, &w.x, &w.y)?]))?;
        (ms, Some(first), peak)
    } else {
        let fwd = |x: &Tensor| model.forward(x);
        let ms = time_ms(iters, 2, || {
            std::hint::black_box(step(&fwd, &mut *opt, &w.x, &w.y)?);
            Ok(())
        })?;
        let peak = peak_of(|| Ok(vec![step(&fwd, &mut *opt, &w.x, &w.y)?]))?;
        (ms, None, peak)
    };
    let mut r = row(w.name, w.what, ms, w.unit, w.amount);
    if compiled {
        r.mode = "compiled".into();
    }
    r.compile_ms = compile_ms;
    // a warm step's high-water mark beyond what was live before it: the
    // gradients and every temporary of forward, backward and optimizer step
    r.peak_bytes = Some(peak);
    Ok(r)
}
