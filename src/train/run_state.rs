//! What `kiln train` keeps in a checkpoint besides the model and optimizer:
//! the effective run config, the best test accuracy so far (for
//! `--keep-best` and `--early-stop`), and the checks `--resume` makes
//! against the current config.

use super::config::RunConfig;
use super::{Splits, TrainConfig};
use crate::amp::GradScaler;
use crate::checkpoint::{Checkpoint, ScalerState};
use crate::Result;
use std::path::{Path, PathBuf};

/// The best test accuracy so far and the epochs since it was reached.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Best {
    pub accuracy: Option<f64>,
    pub epochs_since: u64,
}

impl Best {
    /// Records an epoch's test accuracy; true when it beats every earlier one.
    pub fn update(&mut self, acc: f64) -> bool {
        let better = self.accuracy.is_none_or(|b| acc > b);
        if better {
            self.accuracy = Some(acc);
            self.epochs_since = 0;
        } else {
            self.epochs_since += 1;
        }
        better
    }

    /// Stores the state as `extra/best_test_accuracy`, `extra/epochs_since_best`.
    pub fn store(&self, ck: &mut Checkpoint) {
        if let Some(a) = self.accuracy {
            ck.extra.insert("best_test_accuracy".into(), a.to_string());
        }
        ck.extra
            .insert("epochs_since_best".into(), self.epochs_since.to_string());
    }

    /// The state [`Best::store`] wrote (missing keys: a fresh start).
    pub fn load(ck: &Checkpoint) -> Best {
        Best {
            accuracy: ck
                .extra
                .get("best_test_accuracy")
                .and_then(|s| s.parse().ok()),
            epochs_since: ck
                .extra
                .get("epochs_since_best")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// Where `--keep-best` keeps the best epoch's checkpoint: `run.ckpt` ->
/// `run.best.ckpt` (beside the rolling one).
pub fn best_path(ckpt: &Path) -> PathBuf {
    let stem = ckpt
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match ckpt.extension() {
        Some(e) => format!("{stem}.best.{}", e.to_string_lossy()),
        None => format!("{stem}.best"),
    };
    ckpt.with_file_name(name)
}

/// Stores the effective config (`extra/config`, TOML) and the scaler.
pub fn store_config(ck: &mut Checkpoint, cfg: &RunConfig, scaler: Option<&GradScaler>) {
    ck.extra.insert("config".into(), cfg.resolved().to_toml());
    ck.scaler = scaler.map(|s| ScalerState {
        values: s.state_dict(),
        tensors: vec![],
    });
}

/// The warnings `--resume` prints when the checkpoint's config differs from
/// this run's (one per key; `epochs` may differ, a run can be extended).
pub fn config_warnings(path: &Path, ck: &Checkpoint, now: &RunConfig) -> Vec<String> {
    let Some(text) = ck.extra.get("config") else {
        return vec![];
    };
    let at = path.display();
    match RunConfig::from_toml_str(text) {
        Ok(saved) => saved
            .resolved()
            .differences(&now.resolved())
            .into_iter()
            .map(|d| format!("--resume {at}: this run's config differs from the checkpoint's: {d}"))
            .collect(),
        Err(e) => vec![format!(
            "--resume {at}: metadata key `extra/config` is not a run config ({e}); not compared"
        )],
    }
}

/// What an epoch's checkpoint records besides the live state.
pub struct Context<'a> {
    pub cfg: &'a TrainConfig,
    pub split_seed: u64,
    pub splits: &'a Splits,
    pub best: Best,
}

/// Writes an epoch's checkpoint `ck` to `path` with the run's `extra/*`
/// keys (model, split seed, seed, batch size, normalisation, config, best
/// accuracy) and, when this epoch is the best and `keep_best` is set, a
/// copy at [`best_path`].
pub fn save(
    mut ck: Checkpoint,
    path: &Path,
    ctx: &Context<'_>,
    scaler: Option<&GradScaler>,
    improved: bool,
) -> Result<()> {
    let cfg = ctx.cfg;
    ck.extra.insert("model".into(), cfg.model.name().into());
    ck.extra
        .insert("split_seed".into(), ctx.split_seed.to_string());
    ck.extra.insert("seed".into(), cfg.seed.to_string());
    ck.extra
        .insert("batch_size".into(), cfg.batch_size.to_string());
    ck.extra.insert(
        "normalize".into(),
        format!("mean {} std {}", ctx.splits.mean, ctx.splits.std),
    );
    store_config(&mut ck, &RunConfig::of(cfg), scaler);
    ctx.best.store(&mut ck);
    ck.save(path)?;
    if cfg.keep_best && improved {
        ck.save(best_path(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_path_keeps_the_extension() {
        assert_eq!(
            best_path(Path::new("a/run.ckpt")),
            Path::new("a/run.best.ckpt")
        );
        assert_eq!(best_path(Path::new("run")), Path::new("run.best"));
    }

    #[test]
    fn best_counts_epochs_without_improvement() {
        let mut b = Best::default();
        assert!(b.update(0.5));
        assert!(!b.update(0.5));
        assert!(!b.update(0.4));
        assert_eq!(b.epochs_since, 2);
        assert!(b.update(0.6));
        assert_eq!((b.accuracy, b.epochs_since), (Some(0.6), 0));
    }
}
