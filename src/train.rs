//! `kiln train`: trains a small CNN or MLP on the shipped digits dataset
//! (`data/digits.safetensors`, 1797 8x8 images, 10 classes).
//!
//! * Split: a seeded 80/20 [`random_split`] (generator `Generator::new(seed)`),
//!   1437 training and 360 test images.
//! * Normalisation: pixels are scaled to `[0, 1]` (`x / 16`), then
//!   standardised with the mean and standard deviation of all training-split
//!   pixels: `(x/16 - mean) / std` (torchvision's `Normalize((mean,), (std,))`).
//! * Optimiser: SGD with Nesterov momentum 0.9 and weight decay 5e-4, the lr
//!   decayed per epoch by `ExponentialLR(gamma = 0.85)`.
//! * Each epoch: train mode over shuffled batches, then the test split is
//!   evaluated in eval mode under `no_grad`. With a checkpoint path, a full
//!   [`Checkpoint`] is written (atomically) after every epoch; `--resume`
//!   continues from one bit for bit (see `tests/train_resume.rs`).
//! * Reproducibility: [`crate::manual_seed`] seeds init, dropout and the loader
//!   seed; the same seed gives bit-identical parameters.
//! * `--compile`: the model is wrapped in [`crate::compile::compile`] for the
//!   training forward (its backward runs the compiled backward graph) and for
//!   evaluation, and the SGD step is fused (one kernel per dtype). Data, seeds, schedule and checkpoints are the same as eager:
//!   the compiled wrapper borrows the model, whose parameters it trains.
//!   [`step_time::compare`] then times eager vs compiled steps on copies.

mod cli;
pub mod config;
mod data;
pub mod ddp;
pub mod quantized;
pub mod recipe;
pub mod run_state;
pub mod step;
pub mod step_time;
pub use data::{default_data_path, load_splits, Splits};

pub use cli::{cli, TrainArgs};
pub use config::RunConfig;

use crate::checkpoint::Checkpoint;
use crate::data::{digits, random_split, DataLoader, TensorDataset};
use crate::ir::op::conv::Padding;
use crate::nn::{
    Activation, BatchNorm, Conv, ConvOptions, Dropout, Flatten, Linear, Module, ModuleExt, Pool2d,
    Sequential,
};
use crate::optim::SgdConfig;
use crate::profiler::{self, Profile, Profiler};
use crate::random::Generator;
use crate::{autograd, Error, Result, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The lr decays by this factor after every epoch (`ExponentialLR`), a
/// schedule that does not depend on `--epochs`, so a run can be extended.
pub const LR_GAMMA: f64 = 0.85;

/// Which network to train.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Conv(1,16,3,p1)-BN-ReLU-Conv(16,32,3,s2,p1)-BN-ReLU-AdaptiveAvgPool(1)-Flatten-Linear(32,10).
    Cnn,
    /// Flatten-Linear(64,128)-ReLU-Dropout(0.1)-Linear(128,10) on the flattened 8x8 image.
    Mlp,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Cnn => "cnn",
            ModelKind::Mlp => "mlp",
        }
    }

    /// A freshly initialised model (draws from the default generator).
    pub fn build(self) -> Result<Sequential> {
        Ok(match self {
            ModelKind::Cnn => {
                let p1 = ConvOptions {
                    padding: Padding::Explicit(vec![1]),
                    ..ConvOptions::default()
                };
                let p2 = ConvOptions {
                    stride: 2,
                    padding: Padding::Explicit(vec![1]),
                    ..ConvOptions::default()
                };
                Sequential::new()
                    .add(Conv::conv2d(1, 16, 3, p1)?)
                    .add(BatchNorm::new_2d(16))
                    .add(Activation::relu())
                    .add(Conv::conv2d(16, 32, 3, p2)?)
                    .add(BatchNorm::new_2d(32))
                    .add(Activation::relu())
                    .add(Pool2d::AdaptiveAvg([1, 1]))
                    .add(Flatten::default())
                    .add(Linear::new(32, 10, true)?)
            }
            ModelKind::Mlp => Sequential::new()
                .add(Flatten::default())
                .add(Linear::new(64, 128, true)?)
                .add(Activation::relu())
                .add(Dropout::new(0.1)?)
                .add(Linear::new(128, 10, true)?),
        })
    }

    pub fn parse(s: &str) -> Option<ModelKind> {
        match s {
            "cnn" => Some(ModelKind::Cnn),
            "mlp" => Some(ModelKind::Mlp),
            _ => None,
        }
    }
}

/// The options of `kiln train` (see [`TrainConfig::default`] for the defaults).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelKind,
    /// Total epochs (a resumed run continues up to this many).
    pub epochs: u64,
    pub batch_size: usize,
    pub lr: f64,
    pub seed: u64,
    /// Write a full checkpoint here after every epoch.
    pub checkpoint: Option<PathBuf>,
    /// Resume from this checkpoint.
    pub resume: Option<PathBuf>,
    /// DataLoader worker threads (batches are the same whatever the count).
    pub workers: usize,
    /// The digits file (default: [`default_data_path`]).
    pub data: Option<PathBuf>,
    /// Use only the first `n` images (quick runs and tests).
    pub limit: Option<usize>,
    /// Show a progress bar (only when stdout is a terminal).
    pub progress: bool,
    /// Print a line per epoch when no bar is shown.
    pub verbose: bool,
    /// Profile the first epoch of this run: write its Chrome trace here and
    /// print its table (to stderr with `--json`).
    pub profile: Option<PathBuf>,
    /// Train and evaluate through `compile(&model)`.
    pub compile: bool,
    /// The optimizer and its hyper-parameters (see [`config::OptimizerConfig`]).
    pub optimizer: config::OptimizerConfig,
    /// The lr schedule (see [`config::ScheduleConfig`]).
    pub schedule: config::ScheduleConfig,
    /// Micro-batches of `batch_size` per optimizer step (see [`step`]).
    pub accumulate: usize,
    /// Clip the gradients' total L2 norm to this before each step.
    pub clip_grad_norm: Option<f64>,
    /// Autocast the forward pass to bf16 or f16 (f16 with a GradScaler).
    pub amp: Option<config::AmpKind>,
    /// Keep the best test accuracy's checkpoint at [`run_state::best_path`] (needs `checkpoint`).
    pub keep_best: bool,
    /// Stop after this many epochs without a better test accuracy.
    pub early_stop: Option<u64>,
    /// Run with `use_deterministic_algorithms(true)`.
    pub deterministic: bool,
    /// Write TensorBoard curves into this folder.
    pub logdir: Option<PathBuf>,
    /// Print the model summary before training.
    pub summary: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Cnn,
            epochs: 20,
            batch_size: 32,
            lr: 0.2,
            seed: 0,
            checkpoint: None,
            resume: None,
            workers: 0,
            data: None,
            limit: None,
            progress: false,
            verbose: false,
            profile: None,
            compile: false,
            optimizer: config::OptimizerConfig::default(),
            schedule: config::ScheduleConfig::default(),
            accumulate: 1,
            clip_grad_norm: None,
            amp: None,
            keep_best: false,
            early_stop: None,
            deterministic: false,
            logdir: None,
            summary: false,
        }
    }
}

/// One epoch's numbers.
#[derive(Clone, Debug)]
pub struct EpochStats {
    /// 1-based.
    pub epoch: u64,
    pub lr: f64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub test_accuracy: f64,
    pub seconds: f64,
}

/// What a run produced.
pub struct Outcome {
    pub model: Sequential,
    /// The epochs trained in this run (after any resumed ones).
    pub epochs: Vec<EpochStats>,
    pub test_accuracy: f64,
    /// Epochs completed before this run (from `--resume`), else 0.
    pub resumed_at: u64,
    pub seconds: f64,
    pub train_size: usize,
    pub test_size: usize,
    /// `memory::max_memory_allocated()` at the end of the run (process-wide peak).
    pub peak_memory_bytes: usize,
    /// Training steps taken in this run (forward, loss, backward, optimizer step).
    pub steps: usize,
    /// Their mean wall time in ms (the first, which compiles under `--compile`, included).
    pub step_ms_mean: f64,
    /// Their median wall time in ms.
    pub step_ms_median: f64,
    /// The first step's wall time in ms.
    pub first_step_ms: f64,
    /// Every optimizer step of this run (the per-step curves).
    pub step_records: Vec<step::StepRecord>,
    /// The best test accuracy of the run so far (resumed epochs included).
    pub best_test_accuracy: Option<f64>,
    /// Whether `early_stop` ended the run before `epochs`.
    pub stopped_early: bool,
    /// What `--resume` warned about (also printed to stderr).
    pub warnings: Vec<String>,
}

impl Outcome {
    /// The `--json` summary (one line).
    pub fn json(&self, cfg: &TrainConfig) -> String {
        let last = self.epochs.last();
        json!({
            "model": cfg.model.name(),
            "epochs": cfg.epochs,
            "resumed_at": self.resumed_at,
            "batch_size": cfg.batch_size,
            "lr": cfg.lr,
            "seed": cfg.seed,
            "workers": cfg.workers,
            "train_size": self.train_size,
            "test_size": self.test_size,
            "parameters": self.model.parameters().iter().map(|p| p.numel()).sum::<usize>(),
            "train_loss": last.map(|e| e.train_loss),
            "train_accuracy": last.map(|e| e.train_accuracy),
            "test_accuracy": self.test_accuracy,
            "seconds": self.seconds,
            "peak_memory_bytes": self.peak_memory_bytes,
            "compile": cfg.compile,
            "steps": self.steps,
            "step_ms_mean": self.step_ms_mean,
            "step_ms_median": self.step_ms_median,
            "first_step_ms": self.first_step_ms,
            "per_epoch": self.epochs.iter().map(|e| json!({
                "epoch": e.epoch, "lr": e.lr, "train_loss": e.train_loss,
                "train_accuracy": e.train_accuracy, "test_accuracy": e.test_accuracy,
                "seconds": e.seconds,
            })).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

/// Accuracy of `model` on `(x, y)` in eval mode under `no_grad` (restores train mode).
pub fn evaluate(model: &Sequential, x: &Tensor, y: &Tensor) -> Result<f64> {
    evaluate_with(model, &|x| model.forward(x), x, y)
}

/// [`evaluate`] through `fwd` (the model itself, or `compile(&model)`).
pub fn evaluate_with(
    model: &Sequential,
    fwd: &dyn Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
    y: &Tensor,
) -> Result<f64> {
    model.eval();
    let acc = {
        let _g = autograd::no_grad();
        let logits = fwd(x)?;
        correct(&logits, y)? as f64 / y.numel().max(1) as f64
    };
    model.train();
    Ok(acc)
}

fn correct(logits: &Tensor, y: &Tensor) -> Result<usize> {
    let _g = autograd::no_grad();
    let pred = logits.argmax(Some(1), false)?.to_vec::<i64>()?;
    let y = y.to_vec::<i64>()?;
    Ok(pred.iter().zip(&y).filter(|(a, b)| a == b).count())
}

fn bar(len: usize, show: bool, epoch: u64, epochs: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}")
        .expect("valid template")
        .progress_chars("=> ");
    b.set_style(style);
    b.set_prefix(format!("epoch {epoch}/{epochs}"));
    b
}

fn ckpt_err(path: &Path, msg: String) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg,
    }
}

/// The optimiser: SGD with Nesterov momentum 0.9 and weight decay 5e-4;
/// `fused` (with `--compile`): the step as one kernel per dtype.
pub fn sgd_config(lr: f64, fused: bool) -> SgdConfig {
    SgdConfig {
        lr,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 5e-4,
        fused,
        ..SgdConfig::default()
    }
}

/// Trains as `cfg` says and returns the model and the numbers.
pub fn run(cfg: &TrainConfig) -> Result<Outcome> {
    let start = Instant::now();
    config::check(cfg)?;
    if cfg.deterministic {
        crate::use_deterministic_algorithms(true);
    }
    let rc = RunConfig::of(cfg);
    // A resumed run takes the data split and model kind from the checkpoint.
    let resume = match &cfg.resume {
        Some(p) => Some((p.clone(), Checkpoint::load(p)?)),
        None => None,
    };
    let mut split_seed = cfg.seed;
    let mut warnings = vec![];
    if let Some((p, ck)) = &resume {
        split_seed = resumed_split_seed(cfg, p, ck)?;
        warnings = run_state::config_warnings(p, ck, &rc);
        warnings
            .iter()
            .for_each(|w| eprintln!("kiln train: warning: {w}"));
    }
    let data = cfg.data.clone().unwrap_or_else(default_data_path);
    let splits = load_splits(&data, split_seed, cfg.limit)?;
    let (xtr, ytr) = splits.train.clone();
    let (xte, yte) = splits.test.clone();
    let n_train = ytr.numel();

    crate::manual_seed(cfg.seed);
    let model = cfg.model.build()?;
    if cfg.summary {
        println!(
            "{}",
            crate::summary::summary(&model, &xtr.narrow(0, 0, 1)?)?
        );
    }
    let mut opt = recipe::optimizer(&rc, model.parameters(), cfg.compile)?;
    let train_ds = TensorDataset::new(vec![xtr, ytr])?;
    let mut loader = DataLoader::new(train_ds, cfg.batch_size)
        .shuffle(true)
        .drop_last(n_train % cfg.batch_size == 1) // BatchNorm cannot train on a batch of one
        .num_workers(cfg.workers)
        .persistent_workers(cfg.workers > 0);
    // The micro-batch sizes of every epoch (the loader's batches).
    let sizes: Vec<usize> = (0..loader.len())
        .map(|k| (n_train - k * cfg.batch_size).min(cfg.batch_size))
        .collect();
    let mut stepper = step::Stepper::new(model.parameters(), cfg.accumulate);
    let steps_per_epoch = stepper.steps_per_epoch(sizes.len());
    let mut sched = recipe::scheduler(&rc, &mut opt, steps_per_epoch)?;
    stepper.clip = cfg.clip_grad_norm;
    stepper.amp = cfg.amp;
    stepper.scaler = (cfg.amp == Some(config::AmpKind::F16)).then(crate::amp::GradScaler::new);
    stepper.per_step_schedule = rc.schedule.per_step();
    stepper.log = match &cfg.logdir {
        Some(d) => Some(crate::tensorboard::SummaryWriter::new(d)?),
        None => None,
    };
    let mut first_epoch = 0;
    let mut best = run_state::Best::default();
    if let Some((p, ck)) = &resume {
        ck.restore_model(p, &model)?;
        ck.restore_optimizer(p, &mut *opt)?;
        ck.restore_scheduler(p, &mut *sched)?;
        if let (Some(s), Some(st)) = (&mut stepper.scaler, &ck.scaler) {
            s.load_state_dict(&st.values)
                .map_err(|e| ckpt_err(p, format!("metadata key `scaler`: {e}")))?;
        }
        ck.restore_rng();
        loader = loader.seed(ck.loader_seed);
        loader.set_epoch(ck.loader_epoch);
        first_epoch = ck.epoch;
        best = run_state::Best::load(ck);
    }
    stepper.global_step = (first_epoch as usize * steps_per_epoch) as i64;

    // The compiled wrapper borrows `model`: parameters, optimizer state and
    // checkpoints are the model's own.
    let compiled = cfg.compile.then(|| crate::compile::compile(&model));
    let fwd = |x: &Tensor| match &compiled {
        Some(c) => c.forward(x),
        None => model.forward(x),
    };
    let mut step_times: Vec<Duration> = vec![];
    let show = cfg.progress && std::io::stdout().is_terminal();
    let mut stats = vec![];
    let mut stopped_early = false;
    model.train();
    for epoch in first_epoch..cfg.epochs {
        let t0 = Instant::now();
        let lr = opt.param_groups()[0].lr();
        let pb = bar(loader.len(), show, epoch + 1, cfg.epochs);
        let (mut loss_sum, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
        let loader_epoch = loader.epoch();
        let prof = (epoch == first_epoch && cfg.profile.is_some()).then(Profiler::start);
        for (i, batch) in loader.iter_epoch(loader_epoch).enumerate() {
            let batch = batch?;
            let (x, y) = (&batch[0], &batch[1]);
            let _step = profiler::record_function("train_step");
            let t_step = Instant::now();
            let (loss, logits) =
                stepper.micro_batch(i, &sizes, x, y, &fwd, &mut opt, &mut sched)?;
            step_times.push(t_step.elapsed());
            let n = y.numel();
            loss_sum += loss * n as f64;
            hits += correct(&logits, y)?;
            seen += n;
            pb.inc(1);
            pb.set_message(format!(
                "loss {:.4} acc {:.4}",
                loss_sum / seen as f64,
                hits as f64 / seen as f64
            ));
        }
        if !stepper.per_step_schedule {
            sched.step(&mut opt)?;
        }
        let test_accuracy = {
            let _eval = profiler::record_function("evaluate");
            evaluate_with(&model, &fwd, &xte, &yte)?
        };
        let prof = prof.map(Profiler::stop);
        let s = EpochStats {
            epoch: epoch + 1,
            lr,
            train_loss: loss_sum / seen.max(1) as f64,
            train_accuracy: hits as f64 / seen.max(1) as f64,
            test_accuracy,
            seconds: t0.elapsed().as_secs_f64(),
        };
        let line = format!(
            "epoch {}/{}: lr {:.4} loss {:.4} acc {:.4} test acc {:.4} ({:.1}s)",
            s.epoch, cfg.epochs, s.lr, s.train_loss, s.train_accuracy, s.test_accuracy, s.seconds
        );
        if show {
            pb.finish_and_clear();
            println!("{line}");
        } else if cfg.verbose {
            println!("{line}");
        }
        if let Some(w) = &mut stepper.log {
            let e = s.epoch as i64;
            w.add_scalar("epoch/train_loss", s.train_loss, e)?;
            w.add_scalar("epoch/train_accuracy", s.train_accuracy, e)?;
            w.add_scalar("epoch/test_accuracy", s.test_accuracy, e)?;
            w.flush()?;
        }
        let improved = best.update(s.test_accuracy);
        stats.push(s);
        if let (Some(prof), Some(path)) = (prof, &cfg.profile) {
            write_profile(prof, path, epoch + 1, !cfg.verbose)?;
        }
        if let Some(p) = &cfg.checkpoint {
            let ck = Checkpoint::capture(
                &model,
                &*opt,
                Some(&*sched),
                epoch + 1,
                loader.initial_seed(),
                loader.epoch(),
            );
            let ctx = run_state::Context {
                cfg,
                split_seed,
                splits: &splits,
                best,
            };
            run_state::save(ck, p, &ctx, stepper.scaler.as_ref(), improved)?;
        }
        if cfg.early_stop.is_some_and(|k| best.epochs_since >= k) {
            stopped_early = true;
            if cfg.verbose || show {
                println!(
                    "early stop: no better test accuracy for {} epochs (best {:.4})",
                    best.epochs_since,
                    best.accuracy.unwrap_or(0.0)
                );
            }
            break;
        }
    }
    let test_accuracy = match stats.last() {
        Some(s) => s.test_accuracy,
        None => evaluate_with(&model, &fwd, &xte, &yte)?,
    };
    drop(compiled);
    if let Some(w) = &mut stepper.log {
        w.flush()?;
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let step_ms_mean = step_times.iter().map(ms).sum::<f64>() / step_times.len().max(1) as f64;
    let mut sorted: Vec<f64> = step_times.iter().map(ms).collect();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let step_ms_median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    Ok(Outcome {
        model,
        epochs: stats,
        test_accuracy,
        resumed_at: first_epoch,
        seconds: start.elapsed().as_secs_f64(),
        train_size: n_train,
        test_size: yte.numel(),
        peak_memory_bytes: crate::memory::max_memory_allocated(),
        steps: step_times.len(),
        step_ms_mean,
        step_ms_median,
        first_step_ms: step_times.first().map(ms).unwrap_or(0.0),
        step_records: std::mem::take(&mut stepper.records),
        best_test_accuracy: best.accuracy,
        stopped_early,
        warnings,
    })
}

/// Writes the Chrome trace of a profiled epoch and prints its table (the 30
/// rows with the most total time) to stdout, or stderr when `to_stderr`.
fn write_profile(p: Profile, path: &Path, epoch: u64, to_stderr: bool) -> Result<()> {
    p.export_chrome_trace(path)?;
    let msg = format!(
        "profile of epoch {epoch} (open {} in https://ui.perfetto.dev):\n{}",
        path.display(),
        p.table_top(false, 30)
    );
    match to_stderr {
        true => eprint!("{msg}"),
        false => print!("{msg}"),
    }
    Ok(())
}

/// The last line `kiln train` prints.
pub fn accuracy_line(acc: f64) -> String {
    format!("test accuracy: {acc:.4}")
}

/// The split seed a resumed run must reuse (its checkpoint's `extra/split_seed`,
/// else `cfg.seed`), after checking the checkpoint is for `cfg.model`.
pub(crate) fn resumed_split_seed(cfg: &TrainConfig, p: &Path, ck: &Checkpoint) -> Result<u64> {
    if let Some(m) = ck.extra.get("model") {
        if ModelKind::parse(m) != Some(cfg.model) {
            return Err(ckpt_err(
                p,
                format!(
                    "metadata key `extra/model`: the checkpoint is for a `{m}` model, not `{}`",
                    cfg.model.name()
                ),
            ));
        }
    }
    match ck.extra.get("split_seed") {
        Some(s) => s.parse().map_err(|_| {
            ckpt_err(
                p,
                format!("metadata key `extra/split_seed`: `{s}` is not an integer"),
            )
        }),
        None => Ok(cfg.seed),
    }
}
