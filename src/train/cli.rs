//! `kiln train`'s flags and output.

use super::{accuracy_line, run, step_time, ModelKind, TrainConfig};
use crate::Result;
use std::path::PathBuf;

/// The flags of `kiln train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[arg(long, value_enum, default_value_t = ModelKind::Cnn)]
    pub model: ModelKind,
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    pub epochs: u64,
    #[arg(long, default_value_t = TrainConfig::default().batch_size)]
    pub batch_size: usize,
    /// Initial learning rate (SGD, Nesterov momentum 0.9, x0.85 per epoch).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub lr: f64,
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    pub seed: u64,
    /// Write a full checkpoint here at the end of every epoch.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Continue from a checkpoint (up to --epochs in total).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Print a JSON summary line (before the last line), no bar or epoch lines.
    #[arg(long)]
    pub json: bool,
    /// DataLoader worker threads (the batches do not depend on it).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
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
    /// Start N data-parallel ranks on this machine (runs `mpirun -n N kiln train --ddp ...`).
    #[arg(long, value_name = "N")]
    pub nproc: Option<usize>,
    /// Data-parallel training on the ranks mpirun started (`mpirun -n N kiln train --ddp`):
    /// --batch-size is the global batch, split over the ranks; rank 0 prints and checkpoints.
    #[arg(long)]
    pub ddp: bool,
}

/// `kiln train`: runs and prints the summary; the last line is [`accuracy_line`].
pub fn cli(a: TrainArgs) -> Result<()> {
    if let Some(n) = a.nproc {
        return super::ddp::launch(n);
    }
    let ddp = a.ddp;
    let cfg = TrainConfig {
        model: a.model,
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        seed: a.seed,
        checkpoint: a.checkpoint,
        resume: a.resume,
        workers: a.workers,
        data: a.data,
        limit: None,
        progress: !a.json,
        verbose: !a.json,
        profile: a.profile,
        compile: a.compile,
    };
    if ddp {
        return super::ddp::cli(cfg, a.json);
    }
    let out = run(&cfg)?;
    // Timed on copies of the trained model: its results are already fixed.
    let cmp = match a.compile && a.compare_steps > 0 {
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
    }
    println!("{}", accuracy_line(out.test_accuracy));
    Ok(())
}
