//! Run configs: every hyper-parameter of `kiln train` as one TOML file.
//!
//! A [`RunConfig`] is what `--config run.toml` reads, what `--print-config`
//! prints and what each checkpoint stores (`extra/config`). Command-line
//! flags override the file; the file overrides the defaults. Optimizer and
//! schedule fields left out take their optimizer's or schedule's own default
//! ([`RunConfig::resolved`] fills them in), so the printed config is
//! complete and reproduces the run. `examples/run.toml` is the default run.
//!
//! ```
//! use kiln::train::config::RunConfig;
//! let c = RunConfig::from_toml_str("epochs = 3\n[optimizer]\nname = \"adamw\"\n").unwrap();
//! let c = c.resolved();
//! assert_eq!(c.epochs, 3);
//! assert_eq!(c.optimizer.weight_decay, Some(1e-2)); // AdamW's default
//! assert!(RunConfig::from_toml_str("epoch = 3").unwrap_err().to_string().contains("epoch"));
//! ```

use super::{ModelKind, TrainConfig};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The optimizers `kiln train --optimizer` offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adam,
    Adamw,
    Rmsprop,
    Adagrad,
}

/// The learning-rate schedules of `kiln train --schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// `ExponentialLR(gamma)`, stepped per epoch (the default, gamma 0.85).
    Exponential,
    /// `StepLR(step_size, gamma)`, stepped per epoch.
    Step,
    /// `CosineAnnealingLR(T_max = epochs, eta_min)`, stepped per epoch.
    Cosine,
    /// `SequentialLR([LinearLR(start_factor, 1, warmup_epochs), CosineAnnealingLR(epochs - warmup_epochs, eta_min)], [warmup_epochs])`, per epoch.
    WarmupCosine,
    /// `OneCycleLR(max_lr, total_steps = epochs * optimizer steps per epoch)`, stepped per optimizer step.
    Onecycle,
    /// The lr stays put.
    Constant,
}

/// Mixed precision for the forward pass (`torch.autocast`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AmpKind {
    /// bf16 has f32's exponent range: no GradScaler.
    Bf16,
    /// f16 gradients can underflow: the loss goes through a GradScaler.
    F16,
}

/// The optimizer and its hyper-parameters; `None` takes the optimizer's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    pub name: OptimizerKind,
    /// SGD, RMSprop (SGD default here 0.9; RMSprop's 0).
    pub momentum: Option<f64>,
    /// SGD only (default here true).
    pub nesterov: Option<bool>,
    /// SGD 5e-4 here, AdamW 1e-2, the others 0.
    pub weight_decay: Option<f64>,
    /// Adam, AdamW (0.9, 0.999).
    pub betas: Option<[f64; 2]>,
    /// Adam, AdamW, RMSprop 1e-8; Adagrad 1e-10.
    pub eps: Option<f64>,
    /// RMSprop's smoothing constant (0.99).
    pub alpha: Option<f64>,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            name: OptimizerKind::Sgd,
            momentum: None,
            nesterov: None,
            weight_decay: None,
            betas: None,
            eps: None,
            alpha: None,
        }
    }
}

/// The lr schedule and its parameters; `None` takes the schedule's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    pub name: ScheduleKind,
    /// exponential (0.85), step (0.1).
    pub gamma: Option<f64>,
    /// step: epochs between decays (default 5).
    pub step_size: Option<u64>,
    /// cosine, warmup-cosine: the floor (default 0).
    pub eta_min: Option<f64>,
    /// warmup-cosine: linear warm-up epochs (default 1).
    pub warmup_epochs: Option<u64>,
    /// warmup-cosine: the first epoch's lr factor (default 0.1).
    pub warmup_start_factor: Option<f64>,
    /// onecycle: the peak lr (default `lr`).
    pub max_lr: Option<f64>,
    /// onecycle: share of the steps spent rising (default 0.3).
    pub pct_start: Option<f64>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            name: ScheduleKind::Exponential,
            gamma: None,
            step_size: None,
            eta_min: None,
            warmup_epochs: None,
            warmup_start_factor: None,
            max_lr: None,
            pct_start: None,
        }
    }
}

impl ScheduleConfig {
    /// Whether this schedule moves after every optimizer step (OneCycleLR)
    /// rather than after every epoch: stepping OneCycleLR per epoch would
    /// spend its whole cycle in the first few epochs' worth of steps.
    pub fn per_step(&self) -> bool {
        self.name == ScheduleKind::Onecycle
    }
}

/// Every hyper-parameter of a `kiln train` run (paths, output and
/// profiling options stay on the command line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub model: ModelKind,
    pub epochs: u64,
    pub batch_size: usize,
    pub lr: f64,
    pub seed: u64,
    pub workers: usize,
    pub compile: bool,
    /// Micro-batches per optimizer step (each loss divided by this).
    pub accumulate: usize,
    /// Clip the gradients' total L2 norm to this before each step.
    pub clip_grad_norm: Option<f64>,
    pub amp: Option<AmpKind>,
    /// Keep the checkpoint of the best test accuracy beside `--checkpoint`.
    pub keep_best: bool,
    /// Stop after this many epochs without a better test accuracy.
    pub early_stop: Option<u64>,
    /// `use_deterministic_algorithms(true)` for the run.
    pub deterministic: bool,
    pub optimizer: OptimizerConfig,
    pub schedule: ScheduleConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig::of(&TrainConfig::default())
    }
}

fn cfg_err(path: &str, msg: impl ToString) -> Error {
    Error::Io {
        path: path.to_string(),
        msg: msg.to_string(),
    }
}

impl RunConfig {
    /// The hyper-parameters of `t`.
    pub fn of(t: &TrainConfig) -> RunConfig {
        RunConfig {
            model: t.model,
            epochs: t.epochs,
            batch_size: t.batch_size,
            lr: t.lr,
            seed: t.seed,
            workers: t.workers,
            compile: t.compile,
            accumulate: t.accumulate,
            clip_grad_norm: t.clip_grad_norm,
            amp: t.amp,
            keep_best: t.keep_best,
            early_stop: t.early_stop,
            deterministic: t.deterministic,
            optimizer: t.optimizer.clone(),
            schedule: t.schedule.clone(),
        }
    }

    /// Writes these hyper-parameters into `t` (its paths and output options stay).
    pub fn apply_to(&self, t: &mut TrainConfig) {
        let c = self.clone();
        t.model = c.model;
        t.epochs = c.epochs;
        t.batch_size = c.batch_size;
        t.lr = c.lr;
        t.seed = c.seed;
        t.workers = c.workers;
        t.compile = c.compile;
        t.accumulate = c.accumulate;
        t.clip_grad_norm = c.clip_grad_norm;
        t.amp = c.amp;
        t.keep_best = c.keep_best;
        t.early_stop = c.early_stop;
        t.deterministic = c.deterministic;
        t.optimizer = c.optimizer;
        t.schedule = c.schedule;
    }

    /// Parses a TOML run config; unknown keys are errors naming the key.
    pub fn from_toml_str(s: &str) -> Result<RunConfig> {
        toml::from_str(s).map_err(|e| cfg_err("<run config>", e.message()))
    }

    /// Reads a TOML run config file.
    pub fn load(path: &Path) -> Result<RunConfig> {
        let p = path.display().to_string();
        let s = std::fs::read_to_string(path).map_err(|e| cfg_err(&p, e))?;
        toml::from_str(&s).map_err(|e| {
            let at = e
                .span()
                .map(|r| format!(" (line {})", s[..r.start].matches('\n').count() + 1))
                .unwrap_or_default();
            cfg_err(&p, format!("{}{at}", e.message().trim_end()))
        })
    }

    /// The config with every optimizer and schedule default written out.
    pub fn resolved(&self) -> RunConfig {
        let mut c = self.clone();
        let o = &mut c.optimizer;
        use OptimizerKind as K;
        let sgd = o.name == K::Sgd;
        if matches!(o.name, K::Sgd | K::Rmsprop) {
            o.momentum.get_or_insert(if sgd { 0.9 } else { 0.0 });
        }
        if sgd {
            o.nesterov.get_or_insert(true);
        }
        o.weight_decay.get_or_insert(match o.name {
            K::Sgd => 5e-4,
            K::Adamw => 1e-2,
            _ => 0.0,
        });
        if matches!(o.name, K::Adam | K::Adamw) {
            o.betas.get_or_insert([0.9, 0.999]);
        }
        if o.name != K::Sgd {
            o.eps
                .get_or_insert(if o.name == K::Adagrad { 1e-10 } else { 1e-8 });
        }
        if o.name == K::Rmsprop {
            o.alpha.get_or_insert(0.99);
        }
        let s = &mut c.schedule;
        use ScheduleKind as S;
        match s.name {
            S::Exponential => {
                s.gamma.get_or_insert(super::LR_GAMMA);
            }
            S::Step => {
                s.gamma.get_or_insert(0.1);
                s.step_size.get_or_insert(5);
            }
            S::Cosine => {
                s.eta_min.get_or_insert(0.0);
            }
            S::WarmupCosine => {
                s.eta_min.get_or_insert(0.0);
                s.warmup_epochs.get_or_insert(1);
                s.warmup_start_factor.get_or_insert(0.1);
            }
            S::Onecycle => {
                s.max_lr.get_or_insert(c.lr);
                s.pct_start.get_or_insert(0.3);
            }
            S::Constant => {}
        }
        c
    }

    /// The TOML text (what `--print-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run config serialises")
    }

    /// The keys whose values differ between `self` and `other`, as
    /// `key: self -> other` lines (`epochs` is left out: a resumed run may
    /// extend the run).
    pub fn differences(&self, other: &RunConfig) -> Vec<String> {
        let flat = |c: &RunConfig| -> Vec<(String, String)> {
            let v = match toml::Value::try_from(c) {
                Ok(toml::Value::Table(t)) => t,
                _ => unreachable!("a run config serialises to a table"),
            };
            let mut out = vec![];
            for (k, v) in v {
                match v {
                    toml::Value::Table(t) => out.extend(
                        t.into_iter()
                            .map(|(k2, v)| (format!("{k}.{k2}"), v.to_string())),
                    ),
                    v => out.push((k, v.to_string())),
                }
            }
            out
        };
        let (a, b) = (flat(self), flat(other));
        let get = |l: &[(String, String)], k: &str| {
            l.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone())
        };
        let mut keys: Vec<String> = a.iter().chain(&b).map(|(k, _)| k.clone()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| k != "epochs")
            .filter_map(|k| {
                let (x, y) = (get(&a, &k), get(&b, &k));
                let show = |v: Option<String>| v.unwrap_or_else(|| "(unset)".into());
                (x != y).then(|| format!("{k}: {} -> {}", show(x), show(y)))
            })
            .collect()
    }
}

/// The options that cannot run, as errors naming the flag.
pub(super) fn check(cfg: &TrainConfig) -> Result<()> {
    let bad = |msg: String| Err(Error::op("train", msg));
    if cfg.batch_size == 0 || cfg.epochs == 0 {
        return bad("--epochs and --batch-size must be positive".into());
    }
    if cfg.accumulate == 0 {
        return bad("--accumulate must be at least 1".into());
    }
    if cfg.keep_best && cfg.checkpoint.is_none() {
        return bad("--keep-best keeps a copy of --checkpoint PATH: give --checkpoint".into());
    }
    if cfg.clip_grad_norm.is_some_and(|c| c.is_nan() || c <= 0.0) {
        return bad(format!(
            "--clip-grad-norm must be positive, got {}",
            cfg.clip_grad_norm.unwrap_or(0.0)
        ));
    }
    if cfg.early_stop == Some(0) {
        return bad("--early-stop PATIENCE must be at least 1 epoch".into());
    }
    Ok(())
}
