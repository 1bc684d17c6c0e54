//! Builds the optimizer and the lr schedule a [`RunConfig`] names.

use super::config::{OptimizerKind, RunConfig, ScheduleKind};
use crate::optim::lr_scheduler::{
    CosineAnnealingLR, ExponentialLR, LRScheduler, LinearLR, OneCycleLR, OneCycleOptions,
    SequentialLR, StepLR,
};
use crate::optim::{
    Adagrad, AdagradConfig, Adam, AdamConfig, AdamW, Optimizer, RMSprop, RmspropConfig, SgdConfig,
    SGD,
};
use crate::{Error, Result, Tensor};

/// The optimizer of `c` (resolved first) over `params`; `fused` (with
/// `--compile`): SGD, Adam and AdamW step as one kernel per dtype.
pub fn optimizer(c: &RunConfig, params: Vec<Tensor>, fused: bool) -> Result<Box<dyn Optimizer>> {
    let c = c.resolved();
    let o = &c.optimizer;
    let wd = o.weight_decay.unwrap_or(0.0);
    let betas = o.betas.map(|[a, b]| (a, b)).unwrap_or((0.9, 0.999));
    let adam = |base: AdamConfig| AdamConfig {
        lr: c.lr,
        betas,
        eps: o.eps.unwrap_or(base.eps),
        weight_decay: wd,
        fused,
        ..base
    };
    Ok(match o.name {
        OptimizerKind::Sgd => Box::new(SGD::with_params(
            params,
            SgdConfig {
                lr: c.lr,
                momentum: o.momentum.unwrap_or(0.0),
                nesterov: o.nesterov.unwrap_or(false),
                weight_decay: wd,
                fused,
                ..SgdConfig::default()
            },
        )?),
        OptimizerKind::Adam => Box::new(Adam::with_params(params, adam(AdamConfig::default()))?),
        OptimizerKind::Adamw => Box::new(AdamW::with_params(params, adam(AdamConfig::adamw()))?),
        OptimizerKind::Rmsprop => Box::new(RMSprop::with_params(
            params,
            RmspropConfig {
                lr: c.lr,
                alpha: o.alpha.unwrap_or(0.99),
                eps: o.eps.unwrap_or(1e-8),
                weight_decay: wd,
                momentum: o.momentum.unwrap_or(0.0),
                ..RmspropConfig::default()
            },
        )?),
        OptimizerKind::Adagrad => Box::new(Adagrad::with_params(
            params,
            AdagradConfig {
                lr: c.lr,
                eps: o.eps.unwrap_or(1e-10),
                weight_decay: wd,
                ..AdagradConfig::default()
            },
        )?),
    })
}

/// The lr schedule of `c` on `opt`. Per-epoch schedules count epochs;
/// OneCycleLR (see [`super::config::ScheduleConfig::per_step`]) counts
/// `epochs * steps_per_epoch` optimizer steps.
pub fn scheduler(
    c: &RunConfig,
    opt: &mut Box<dyn Optimizer>,
    steps_per_epoch: usize,
) -> Result<Box<dyn LRScheduler>> {
    let c = c.resolved();
    let s = &c.schedule;
    let epochs = c.epochs as i64;
    Ok(match s.name {
        ScheduleKind::Exponential => Box::new(ExponentialLR::new(opt, s.gamma.unwrap_or(0.85))?),
        ScheduleKind::Constant => Box::new(ExponentialLR::new(opt, 1.0)?),
        ScheduleKind::Step => Box::new(StepLR::new(
            opt,
            s.step_size.unwrap_or(5) as i64,
            s.gamma.unwrap_or(0.1),
        )?),
        ScheduleKind::Cosine => Box::new(CosineAnnealingLR::new(
            opt,
            epochs,
            s.eta_min.unwrap_or(0.0),
        )?),
        ScheduleKind::WarmupCosine => {
            let warm = s.warmup_epochs.unwrap_or(1) as i64;
            if warm >= epochs {
                return Err(Error::op(
                    "train",
                    format!("schedule warmup-cosine: warmup_epochs ({warm}) must be below epochs ({epochs})"),
                ));
            }
            let up = LinearLR::new(opt, s.warmup_start_factor.unwrap_or(0.1), 1.0, warm)?;
            let down = CosineAnnealingLR::new(opt, epochs - warm, s.eta_min.unwrap_or(0.0))?;
            Box::new(SequentialLR::new(
                opt,
                vec![Box::new(up), Box::new(down)],
                vec![warm],
            )?)
        }
        ScheduleKind::Onecycle => Box::new(OneCycleLR::new(
            opt,
            s.max_lr.unwrap_or(c.lr),
            epochs * steps_per_epoch.max(1) as i64,
            OneCycleOptions {
                pct_start: s.pct_start.unwrap_or(0.3),
                // PyTorch's default cycles momentum (beta1 for Adam/AdamW);
                // an optimizer without one cannot.
                cycle_momentum: match c.optimizer.name {
                    OptimizerKind::Adam | OptimizerKind::Adamw => true,
                    OptimizerKind::Sgd | OptimizerKind::Rmsprop => {
                        c.optimizer.momentum.unwrap_or(0.0) > 0.0
                    }
                    OptimizerKind::Adagrad => false,
                },
                ..OneCycleOptions::default()
            },
        )?),
    })
}
