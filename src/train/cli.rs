//! `kiln train`'s flags and output.
//!
//! Hyper-parameters resolve in three layers: the defaults
//! ([`TrainConfig::default`]), then `--config run.toml`, then the flags
//! given on the command line (a flag left out does not override the file).

use super::config::{AmpKind, OptimizerKind, RunConfig, ScheduleKind};
use super::{accuracy_line, run, step_time, ModelKind, TrainConfig};
use crate::Result;
use std::path::PathBuf;

/// The flags of `kiln train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// cnn or mlp (default cnn).
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Total epochs (default 20).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Samples per (micro-)batch (default 32).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Initial learning rate (default 0.2; SGD, Nesterov momentum 0.9,
    /// weight decay 5e-4, x0.85 per epoch).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Seed of init, dropout and shuffling (default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write a full checkpoint here at the end of every epoch.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Continue from a checkpoint (up to --epochs in total); warns when the
    /// checkpoint's config differs from this run's.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Print a JSON summary line (before the last line), no bar or epoch lines.
    #[arg(long)]
    pub json: bool,
    /// DataLoader worker threads (default 0; the batches do not depend on it).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The digits file (default: data/digits.safetensors here, else the project's).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Profile the first epoch: write its Chrome trace (Perfetto,
    /// chrome://tracing) to this file and print its op/kernel table.
    #[arg(long, value_name = "TRACE.json")]
    pub profile: Option<PathBuf>,
    /// Train and evaluate through `compile(&model)`; then time eager vs
    /// compiled steps side by side (see --compare-steps).
    #[arg(long)]
    pub compile: bool,
    /// With --compile: after training, time this many steps of an eager and a
    /// compiled copy of the trained model on the same batches and print
    /// `step time: eager X ms, compiled Y ms (Z.ZZx)` (medians; 0 skips it).
    #[arg(long, default_value_t = 20)]
    pub compare_steps: usize,
    /// After training, quantize the model's Linear layers to int8
    /// (`quantize_dynamic`, per tensor and per channel) and print their test
    /// accuracy beside the float one.
    #[arg(long)]
    pub quantize: bool,
    /// Read the hyper-parameters from this TOML file (flags override it;
    /// see examples/run.toml).
    #[arg(long, value_name = "RUN.toml")]
    pub config: Option<PathBuf>,
    /// Print the effective config as TOML and exit without training.
    #[arg(long)]
    pub print_config: bool,
    /// Write TensorBoard curves (loss, lr, grad norm, throughput per step;
    /// accuracies per epoch) into this folder.
    #[arg(long, value_name = "DIR")]
    pub logdir: Option<PathBuf>,
    /// No model summary at the start.
    #[arg(long)]
    pub quiet: bool,
    /// sgd, adam, adamw, rmsprop or adagrad (default sgd).
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// SGD / RMSprop momentum (SGD default 0.9).
    #[arg(long)]
    pub momentum: Option<f64>,
    /// SGD's Nesterov momentum (default true).
    #[arg(long)]
    pub nesterov: Option<bool>,
    /// Weight decay (SGD default 5e-4, AdamW 1e-2, others 0).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Adam/AdamW betas, as B1,B2 (default 0.9,0.999).
    #[arg(long, value_delimiter = ',', num_args = 2)]
    pub betas: Option<Vec<f64>>,
    /// Adam/AdamW/RMSprop/Adagrad epsilon.
    #[arg(long)]
    pub eps: Option<f64>,
    /// exponential (default), step, cosine, warmup-cosine, onecycle (per
    /// step) or constant.
    #[arg(long, value_enum)]
    pub schedule: Option<ScheduleKind>,
    /// exponential / step decay factor (0.85 / 0.1).
    #[arg(long)]
    pub gamma: Option<f64>,
    /// step: epochs between decays (default 5).
    #[arg(long)]
    pub step_size: Option<u64>,
    /// warmup-cosine: warm-up epochs (default 1).
    #[arg(long)]
    pub warmup_epochs: Option<u64>,
    /// onecycle: the peak lr (default --lr).
    #[arg(long)]
    pub max_lr: Option<f64>,
    /// Clip the gradients' total L2 norm to this before each step.
    #[arg(long, value_name = "X")]
    pub clip_grad_norm: Option<f64>,
    /// Accumulate N micro-batches of --batch-size per optimizer step.
    #[arg(long, value_name = "N")]
    pub accumulate: Option<usize>,
    /// Autocast the forward to bf16 (or f16, with a GradScaler).
    #[arg(long, value_enum)]
    pub amp: Option<AmpKind>,
    /// Keep the best test accuracy's checkpoint as NAME.best.EXT beside --checkpoint.
    #[arg(long)]
    pub keep_best: bool,
    /// Stop after PATIENCE epochs without a better test accuracy.
    #[arg(long, value_name = "PATIENCE")]
    pub early_stop: Option<u64>,
    /// use_deterministic_algorithms(true): every kernel sums in a fixed order.
    #[arg(long)]
    pub deterministic: bool,
    /// Start N data-parallel ranks on this machine (runs `mpirun -n N kiln train --ddp ...`).
    #[arg(long, value_name = "N")]
    pub nproc: Option<usize>,
    /// Data-parallel training on the ranks mpirun started (`mpirun -n N kiln train --ddp`):
    /// --batch-size is the global batch, split over the ranks; rank 0 prints and checkpoints.
    #[arg(long)]
    pub ddp: bool,
}

impl TrainArgs {
    /// The effective config: defaults, then `--config`, then these flags.
    pub fn run_config(&self) -> Result<RunConfig> {
        let mut c = match &self.config {
            Some(p) => RunConfig::load(p)?,
            None => RunConfig::default(),
        };
        macro_rules! set {
            ($($dst:expr => $src:expr),* $(,)?) => { $( if let Some(v) = $src.clone() { $dst = v; } )* };
        }
        set!(c.model => self.model, c.epochs => self.epochs, c.batch_size => self.batch_size,
             c.lr => self.lr, c.seed => self.seed, c.workers => self.workers,
             c.accumulate => self.accumulate);
        let o = &mut c.optimizer;
        if let Some(name) = self.optimizer {
            if name != o.name {
                // another optimizer: the file's hyper-parameters were for the old one
                *o = super::config::OptimizerConfig {
                    name,
                    ..Default::default()
                };
            }
        }
        set!(o.momentum => self.momentum.map(Some), o.nesterov => self.nesterov.map(Some),
             o.weight_decay => self.weight_decay.map(Some), o.eps => self.eps.map(Some));
        if let Some(b) = &self.betas {
            o.betas = Some([b[0], b[1]]);
        }
        let s = &mut c.schedule;
        if let Some(name) = self.schedule {
            if name != s.name {
                *s = super::config::ScheduleConfig {
                    name,
                    ..Default::default()
                };
            }
        }
        set!(s.gamma => self.gamma.map(Some), s.step_size => self.step_size.map(Some),
             s.warmup_epochs => self.warmup_epochs.map(Some), s.max_lr => self.max_lr.map(Some));
        set!(c.clip_grad_norm => self.clip_grad_norm.map(Some), c.amp => self.amp.map(Some),
             c.early_stop => self.early_stop.map(Some));
        c.compile |= self.compile;
        c.keep_best |= self.keep_best;
        c.deterministic |= self.deterministic;
        Ok(c.resolved())
    }

    /// The [`TrainConfig`] these flags (and `--config`) describe.
    pub fn train_config(&self) -> Result<TrainConfig> {
        let mut cfg = TrainConfig {
            checkpoint: self.checkpoint.clone(),
            resume: self.resume.clone(),
            data: self.data.clone(),
            progress: !self.json,
            verbose: !self.json,
            profile: self.profile.clone(),
            logdir: self.logdir.clone(),
            summary: !self.quiet && !self.json,
            ..TrainConfig::default()
        };
        self.run_config()?.apply_to(&mut cfg);
        Ok(cfg)
    }
}

/// `kiln train`: runs and prints the summary; the last line is [`accuracy_line`].
pub fn cli(a: TrainArgs) -> Result<()> {
    let cfg = a.train_config()?;
    if a.print_config {
        print!("{}", RunConfig::of(&cfg).to_toml());
        return Ok(());
    }
    if let Some(n) = a.nproc {
        return super::ddp::launch(n);
    }
    if a.ddp {
        return super::ddp::cli(cfg, a.json);
    }
    let out = run(&cfg)?;
    // Timed on copies of the trained model: its results are already fixed.
    let cmp = match cfg.compile && a.compare_steps > 0 {
        true => Some(step_time::compare(&cfg, &out.model, a.compare_steps)?),
        false => None,
    };
    if a.json {
        let mut j: serde_json::Value = serde_json::from_str(&out.json(&cfg)).expect("valid json");
        if let Some(c) = &cmp {
            j["compare_steps"] = c.steps.into();
            j["step_ms_eager"] = c.eager_ms.into();
            j["step_ms_compiled"] = c.compiled_ms.into();
        }
        println!("{j}");
    } else {
        let peak = crate::memory::format_bytes(out.peak_memory_bytes);
        println!("peak memory: {peak} ({} bytes)", out.peak_memory_bytes);
        let mode = if cfg.compile { "compiled" } else { "eager" };
        println!(
            "train step ({mode}): mean {:.3} ms, median {:.3} ms over {} steps (first {:.1} ms)",
            out.step_ms_mean, out.step_ms_median, out.steps, out.first_step_ms
        );
        if let Some(c) = &cmp {
            println!("{}", c.line());
        }
        if let Some(d) = &cfg.logdir {
            println!(
                "curves: {} (tensorboard --logdir {}; kiln plot {} -o curves.svg)",
                d.display(),
                d.display(),
                d.display()
            );
        }
    }
    if a.quantize {
        for line in super::quantized::report(&cfg, &out.model, out.test_accuracy)? {
            println!("{line}");
        }
    }
    println!("{}", accuracy_line(out.test_accuracy));
    Ok(())
}
