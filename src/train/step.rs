//! One micro-batch of `kiln train`, and the optimizer step that ends each
//! group of `--accumulate N` of them.
//!
//! * Accumulation: the gradients of a group's micro-batches add up before
//!   one optimizer step. Each micro-batch's mean loss is weighted by its
//!   share of the group's samples (`loss * n_i / n_group`), which is
//!   `loss / N` for equal micro-batches and keeps the last, shorter group of
//!   an epoch exact too: the summed gradient is the gradient of the mean
//!   loss over the group's samples, as one batch of that size gives (up to
//!   BatchNorm, whose statistics are per micro-batch).
//! * Order per step: unscale (f16's GradScaler), total gradient norm, clip
//!   (`--clip-grad-norm`), optimizer step (skipped by the scaler on
//!   inf/NaN), scaler update, and a per-step schedule (OneCycleLR).
//! * Curves (`--logdir`): per optimizer step `train/loss` (the group's
//!   sample-weighted mean loss), `train/lr` (the lr that step used),
//!   `train/grad_norm` (before clipping) and `train/samples_per_sec`.

use super::config::AmpKind;
use crate::amp::{self, GradScaler};
use crate::optim::lr_scheduler::LRScheduler;
use crate::optim::{clip_grad_norm_, vector_norm, Optimizer};
use crate::tensorboard::SummaryWriter;
use crate::{autograd, functional as F, ClassLossOpts, DType, Result, Tensor};
use std::time::Instant;

/// The per-step tags written to the event file.
pub const STEP_TAGS: [&str; 4] = [
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/samples_per_sec",
];

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRecord {
    /// 1-based over the whole run (a resumed run continues the count).
    pub step: i64,
    pub loss: f64,
    pub lr: f64,
    /// Total L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    pub samples_per_sec: f64,
}

/// Runs micro-batches and groups them into optimizer steps.
pub(super) struct Stepper {
    pub accumulate: usize,
    pub clip: Option<f64>,
    pub amp: Option<AmpKind>,
    pub scaler: Option<GradScaler>,
    pub per_step_schedule: bool,
    pub log: Option<SummaryWriter>,
    /// Optimizer steps taken so far in the run.
    pub global_step: i64,
    pub records: Vec<StepRecord>,
    params: Vec<Tensor>,
    group: Group,
}

#[derive(Default)]
struct Group {
    samples: usize,
    loss_sum: f64,
    start: Option<Instant>,
}

impl Stepper {
    pub fn new(params: Vec<Tensor>, accumulate: usize) -> Stepper {
        Stepper {
            accumulate: accumulate.max(1),
            clip: None,
            amp: None,
            scaler: None,
            per_step_schedule: false,
            log: None,
            global_step: 0,
            records: vec![],
            params,
            group: Group::default(),
        }
    }

    /// Optimizer steps per epoch of `n_batches` micro-batches.
    pub fn steps_per_epoch(&self, n_batches: usize) -> usize {
        n_batches.div_ceil(self.accumulate)
    }

    /// Forward, loss and backward of micro-batch `i` of `sizes` (the epoch's
    /// micro-batch sizes); steps `opt` at the end of its group. Returns the
    /// micro-batch's mean loss and its logits.
    #[allow(clippy::too_many_arguments)]
    pub fn micro_batch(
        &mut self,
        i: usize,
        sizes: &[usize],
        x: &Tensor,
        y: &Tensor,
        fwd: &dyn Fn(&Tensor) -> Result<Tensor>,
        opt: &mut Box<dyn Optimizer>,
        sched: &mut Box<dyn LRScheduler>,
    ) -> Result<(f64, Tensor)> {
        let n = self.accumulate;
        let first = i / n * n;
        let last = (first + n).min(sizes.len()) - 1;
        let group_samples: usize = sizes[first..=last].iter().sum();
        if i == first {
            opt.zero_grad();
            self.group = Group {
                start: Some(Instant::now()),
                ..Group::default()
            };
        }
        let (logits, loss) = {
            let _ac = match self.amp {
                Some(AmpKind::Bf16) => Some(amp::autocast(DType::BF16)?),
                Some(AmpKind::F16) => Some(amp::autocast(DType::F16)?),
                None => None,
            };
            let logits = fwd(x)?;
            let loss = F::cross_entropy(&logits, y, None, ClassLossOpts::default())?;
            (logits, loss)
        };
        let rows = y.numel();
        let weighted = if rows == group_samples {
            loss.clone() // the group is this one micro-batch
        } else {
            let share = rows as f64 / group_samples.max(1) as f64;
            loss.binary_scalar(crate::ir::BinaryOp::Mul, share, false)?
        };
        match &self.scaler {
            Some(s) => s.scale(&weighted)?.backward()?,
            None => weighted.backward()?,
        }
        let value = loss.item()?;
        self.group.samples += rows;
        self.group.loss_sum += value * rows as f64;
        if i == last {
            self.finish(opt, sched)?;
        }
        Ok((value, logits))
    }

    fn finish(
        &mut self,
        opt: &mut Box<dyn Optimizer>,
        sched: &mut Box<dyn LRScheduler>,
    ) -> Result<()> {
        let lr = opt.param_groups()[0].lr();
        if let Some(s) = &mut self.scaler {
            s.unscale_(&mut **opt)?;
        }
        let norm = match self.clip {
            Some(max) => clip_grad_norm_(&self.params, max, 2.0)?.item()?,
            None => grad_norm(&self.params)?,
        };
        let step = crate::profiler::record_function("optimizer.step");
        match &mut self.scaler {
            Some(s) => {
                s.step(&mut **opt)?;
                s.update()?;
            }
            None => opt.step()?,
        }
        drop(step);
        if self.per_step_schedule {
            sched.step(opt)?;
        }
        self.global_step += 1;
        let secs = self
            .group
            .start
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let r = StepRecord {
            step: self.global_step,
            loss: self.group.loss_sum / self.group.samples.max(1) as f64,
            lr,
            grad_norm: norm,
            samples_per_sec: self.group.samples as f64 / secs.max(1e-9),
        };
        if let Some(w) = &mut self.log {
            let vals = [r.loss, r.lr, r.grad_norm, r.samples_per_sec];
            for (tag, v) in STEP_TAGS.iter().zip(vals) {
                w.add_scalar(tag, v, r.step)?;
            }
        }
        self.records.push(r);
        Ok(())
    }
}

/// The total L2 norm of the gradients of `params` (those that have one).
pub fn grad_norm(params: &[Tensor]) -> Result<f64> {
    let _g = autograd::no_grad();
    let mut sq = 0.0f64;
    for g in params.iter().filter_map(Tensor::grad) {
        let n = vector_norm(&g.to_dtype(DType::F32)?, 2.0)?.item()?;
        sq += n * n;
    }
    Ok(sq.sqrt())
}
