//! Eager vs compiled training-step time, side by side (`kiln train --compile`).

use super::{load_splits, sgd_config, TrainConfig};
use crate::bench::train::step;
use crate::nn::{Module, ModuleExt, Sequential};
use crate::optim::SGD;
use crate::{Result, Tensor};
use std::time::Instant;

/// Median step times of the same batches, eager and compiled.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub steps: usize,
    pub eager_ms: f64,
    pub compiled_ms: f64,
}

impl Comparison {
    /// Eager time over compiled time.
    pub fn speedup(&self) -> f64 {
        self.eager_ms / self.compiled_ms
    }

    /// `step time: eager X ms, compiled Y ms (Z.ZZx)`.
    pub fn line(&self) -> String {
        format!(
            "step time: eager {:.3} ms, compiled {:.3} ms ({:.2}x)",
            self.eager_ms,
            self.compiled_ms,
            self.speedup()
        )
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Times `steps` training steps (zero_grad, forward, cross-entropy,
/// backward, SGD step) of two copies of `trained` (same weights and buffers,
/// each with a fresh optimiser as `cfg` configures it): one eager, one
/// through `compile()`. Both take the same batches of `cfg`'s training split
/// in order, alternating step by step so machine noise hits both alike, after
/// one untimed warm-up step each (the compiled one compiles). `trained` is
/// not touched.
pub fn compare(cfg: &TrainConfig, trained: &Sequential, steps: usize) -> Result<Comparison> {
    let data = cfg.data.clone().unwrap_or_else(super::default_data_path);
    let (x, y) = load_splits(&data, cfg.seed, cfg.limit)?.train;
    let n = y.numel();
    let bs = cfg.batch_size.min(n).max(1);
    let batches: Vec<(Tensor, Tensor)> = (0..(n / bs).max(1))
        .map(|i| {
            Ok((
                x.narrow(0, (i * bs) as i64, bs)?,
                y.narrow(0, (i * bs) as i64, bs)?,
            ))
        })
        .collect::<Result<_>>()?;
    let copy = || -> Result<Sequential> {
        let m = cfg.model.build()?;
        m.load_state_dict(&trained.state_dict(), true)?;
        m.train();
        Ok(m)
    };
    let (eager, comp) = (copy()?, copy()?);
    let mut opt_e = SGD::with_params(eager.parameters(), sgd_config(cfg.lr, false))?;
    let mut opt_c = SGD::with_params(comp.parameters(), sgd_config(cfg.lr, true))?;
    let c = crate::compile::compile(&comp);
    let fwd_e = |x: &Tensor| eager.forward(x);
    let fwd_c = |x: &Tensor| c.forward(x);
    let (x0, y0) = &batches[0];
    step(&fwd_e, &mut opt_e, x0, y0)?;
    step(&fwd_c, &mut opt_c, x0, y0)?;
    let (mut te, mut tc) = (vec![], vec![]);
    for i in 0..steps.max(1) {
        let (x, y) = &batches[(i + 1) % batches.len()];
        let t = Instant::now();
        std::hint::black_box(step(&fwd_e, &mut opt_e, x, y)?);
        te.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(step(&fwd_c, &mut opt_c, x, y)?);
        tc.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Comparison {
        steps: te.len(),
        eager_ms: median(te),
        compiled_ms: median(tc),
    })
}
