//! `kiln train`'s workflow options: run configs (file, flags, checkpoint),
//! gradient accumulation, schedules, curves (TensorBoard event files, read
//! back in Rust and, when installed, by the `tensorboard` package), the
//! plot, early stopping, keep-best, AMP and deterministic mode. Each run is
//! small (a few hundred digits, one to three epochs).

use clap::Parser;
use kiln::checkpoint::Checkpoint;
use kiln::nn::ModuleExt;
use kiln::tensorboard::read_scalars;
use kiln::train::config::{AmpKind, OptimizerKind, ScheduleKind};
use kiln::train::{run, ModelKind, Outcome, RunConfig, TrainArgs, TrainConfig};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// `manual_seed` and the default generator are process-wide: one run at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TrainArgs,
}

fn args(flags: &[&str]) -> TrainArgs {
    Cli::parse_from(std::iter::once("train").chain(flags.iter().copied())).args
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-workflow-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn example_toml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/run.toml")
}

/// A small run: the first `limit` digits (80% train), MLP.
fn small(limit: usize, epochs: u64) -> TrainConfig {
    TrainConfig {
        model: ModelKind::Mlp,
        epochs,
        limit: Some(limit),
        ..TrainConfig::default()
    }
}

#[test]
fn the_example_run_toml_is_the_default_run() {
    let file = RunConfig::load(&example_toml()).unwrap();
    assert_eq!(file, RunConfig::default().resolved());
    let with_file = args(&["--config", example_toml().to_str().unwrap()])
        .run_config()
        .unwrap();
    let no_flags = args(&[]).run_config().unwrap();
    assert_eq!(with_file, no_flags);
    // and the printed config is that file, key for key
    assert_eq!(RunConfig::from_toml_str(&no_flags.to_toml()).unwrap(), file);
}

#[test]
fn flags_override_the_file_and_the_file_overrides_the_defaults() {
    let d = tmp("override");
    let f = d.join("run.toml");
    std::fs::write(
        &f,
        "epochs = 3\nlr = 0.01\n[optimizer]\nname = \"adamw\"\nbetas = [0.8, 0.99]\n[schedule]\nname = \"onecycle\"\n",
    )
    .unwrap();
    let c = args(&[
        "--config",
        f.to_str().unwrap(),
        "--epochs",
        "5",
        "--accumulate",
        "2",
    ])
    .run_config()
    .unwrap();
    assert_eq!((c.epochs, c.lr, c.accumulate), (5, 0.01, 2));
    assert_eq!(c.optimizer.name, OptimizerKind::Adamw);
    assert_eq!(c.optimizer.betas, Some([0.8, 0.99]));
    assert_eq!(c.optimizer.weight_decay, Some(1e-2), "AdamW's own default");
    assert_eq!(c.schedule.name, ScheduleKind::Onecycle);
    assert_eq!(
        c.schedule.max_lr,
        Some(0.01),
        "onecycle peaks at --lr by default"
    );
    // another optimizer on the command line drops the file's optimizer fields
    let c = args(&["--config", f.to_str().unwrap(), "--optimizer", "sgd"])
        .run_config()
        .unwrap();
    assert_eq!((c.optimizer.betas, c.optimizer.momentum), (None, Some(0.9)));
    // a typo in the file is an error naming the key and the line
    std::fs::write(&f, "epochs = 3\nbatchsize = 8\n").unwrap();
    let e = args(&["--config", f.to_str().unwrap()])
        .run_config()
        .unwrap_err()
        .to_string();
    assert!(e.contains("batchsize") && e.contains("line 2"), "{e}");
}

#[test]
fn accumulating_four_batches_of_8_follows_the_loss_curve_of_batches_of_32() {
    let _l = lock();
    // The MLP has no BatchNorm; 400 digits give 320 training images, 10
    // batches of 32 per epoch, so every group of 4 micro-batches holds the
    // same 32 images as one big batch (the shuffle does not depend on the
    // batch size). Dropout draws its masks in order from the same stream.
    let big = run(&TrainConfig {
        batch_size: 32,
        ..small(400, 2)
    })
    .unwrap();
    let acc = run(&TrainConfig {
        batch_size: 8,
        accumulate: 4,
        ..small(400, 2)
    })
    .unwrap();
    assert_eq!(big.step_records.len(), 20);
    assert_eq!(acc.step_records.len(), 20);
    for (a, b) in big.step_records.iter().zip(&acc.step_records) {
        assert_eq!(a.lr, b.lr);
        let d = (a.loss - b.loss).abs();
        assert!(
            d < 1e-4 * a.loss.max(1.0),
            "step {}: loss {} vs {}",
            a.step,
            a.loss,
            b.loss
        );
        let g = (a.grad_norm - b.grad_norm).abs();
        assert!(
            g < 1e-3 * a.grad_norm.max(1.0),
            "step {}: grad norm {} vs {}",
            a.step,
            a.grad_norm,
            b.grad_norm
        );
    }
    // a real difference would show: plain batches of 8 take 4x the steps
    let plain8 = run(&TrainConfig {
        batch_size: 8,
        ..small(400, 1)
    })
    .unwrap();
    assert_eq!(plain8.step_records.len(), 40);
    println!(
        "final loss: batch 32 {:.6}, 4 x 8 accumulated {:.6}",
        big.step_records[19].loss, acc.step_records[19].loss
    );
}

fn curves_run(d: &Path) -> Outcome {
    run(&TrainConfig {
        logdir: Some(d.to_path_buf()),
        clip_grad_norm: Some(1.0),
        ..small(300, 2)
    })
    .unwrap()
}

#[test]
fn curves_are_written_as_tensorboard_events_and_read_back() {
    let _l = lock();
    let d = tmp("curves");
    let out = curves_run(&d);
    let curves = read_scalars(&d).unwrap();
    let steps = out.step_records.len();
    assert!(steps > 10);
    for tag in kiln::train::step::STEP_TAGS {
        assert_eq!(curves[tag].len(), steps, "{tag}");
    }
    for (r, p) in out.step_records.iter().zip(&curves["train/loss"]) {
        assert_eq!((p.step, p.value), (r.step, r.loss as f32));
    }
    for (r, p) in out.step_records.iter().zip(&curves["train/grad_norm"]) {
        assert_eq!(p.value, r.grad_norm as f32);
    }
    let test_acc: Vec<f32> = curves["epoch/test_accuracy"]
        .iter()
        .map(|p| p.value)
        .collect();
    let want: Vec<f32> = out.epochs.iter().map(|e| e.test_accuracy as f32).collect();
    assert_eq!(test_acc, want);
    assert_eq!(curves["epoch/train_accuracy"].len(), 2);

    // The SVG: every per-step panel and the accuracies.
    let svg = d.join("curves.svg");
    let tags = kiln::plot::plot(&d, &svg).unwrap();
    for t in [
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "epoch/test_accuracy",
    ] {
        assert!(tags.iter().any(|x| x == t), "{t} not drawn: {tags:?}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<svg") && text.matches("<polyline").count() >= 5,
        "few lines"
    );

    // What the `tensorboard` package's own reader sees, when it is installed.
    tensorboard_reads(&d, &out);
}

/// The python with the `tensorboard` package: `$KILN_TENSORBOARD_PYTHON`,
/// else `.venv-tb/bin/python` here (what `.ci/run` installs).
fn tensorboard_python() -> Option<PathBuf> {
    let p = std::env::var_os("KILN_TENSORBOARD_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-tb/bin/python"));
    let ok = std::process::Command::new(&p)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

fn tensorboard_reads(d: &Path, out: &Outcome) {
    let Some(py) = tensorboard_python() else {
        eprintln!("skipped: the tensorboard package is not installed (see .ci/run); the Rust reader checked the file");
        return;
    };
    let script = r#"
import glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let o = std::process::Command::new(py)
        .args(["-c", script, d.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let loss = j["train/loss"].as_array().unwrap();
    assert_eq!(loss.len(), out.step_records.len());
    for (r, p) in out.step_records.iter().zip(loss) {
        assert_eq!(p[0].as_i64().unwrap(), r.step);
        assert_eq!(p[1].as_f64().unwrap() as f32, r.loss as f32);
    }
    let lr = j["train/lr"].as_array().unwrap();
    assert_eq!(
        lr[0][1].as_f64().unwrap() as f32,
        out.step_records[0].lr as f32
    );
    assert_eq!(
        j["epoch/test_accuracy"].as_array().unwrap().len(),
        out.epochs.len()
    );
    println!(
        "tensorboard's EventAccumulator read {} tags",
        j.as_object().unwrap().len()
    );
}

#[test]
fn schedules_step_per_epoch_or_per_step_as_each_requires() {
    let _l = lock();
    let lrs = |schedule: ScheduleKind| {
        let mut c = small(200, 3);
        c.schedule.name = schedule;
        let out = run(&c).unwrap();
        out.step_records.iter().map(|r| r.lr).collect::<Vec<_>>()
    };
    // 160 images, 5 steps an epoch
    let cos = lrs(ScheduleKind::Cosine);
    assert_eq!(cos.len(), 15);
    assert!(
        cos[..5].iter().all(|&l| l == 0.2),
        "constant within an epoch: {cos:?}"
    );
    assert!((cos[5] - 0.2 * 0.75).abs() < 1e-12, "cos(pi/3): {}", cos[5]);
    let warm = lrs(ScheduleKind::WarmupCosine);
    assert!(
        (warm[0] - 0.02).abs() < 1e-12 && (warm[5] - 0.2).abs() < 1e-12,
        "{warm:?}"
    );
    let one = lrs(ScheduleKind::Onecycle);
    assert!(
        (one[0] - 0.2 / 25.0).abs() < 1e-12,
        "onecycle starts at max_lr / 25: {}",
        one[0]
    );
    assert!(
        one[1] > one[0] && one[2] > one[1],
        "rises step by step: {one:?}"
    );
    let peak = one.iter().cloned().fold(0.0, f64::max);
    assert!((peak - 0.2).abs() < 0.02, "peaks near max_lr: {peak}");
    assert!(one[14] < 0.01, "anneals: {}", one[14]);
}

#[test]
fn every_optimizer_trains_and_the_config_lands_in_the_checkpoint() {
    let _l = lock();
    let d = tmp("optim");
    for (name, lr) in [
        (OptimizerKind::Adam, 1e-2),
        (OptimizerKind::Adamw, 1e-2),
        (OptimizerKind::Rmsprop, 1e-3),
        (OptimizerKind::Adagrad, 5e-2),
    ] {
        let mut c = small(300, 2);
        c.optimizer.name = name;
        c.lr = lr;
        c.checkpoint = Some(d.join("ck.safetensors"));
        let out = run(&c).unwrap();
        let r = &out.step_records;
        assert!(
            r.last().unwrap().loss < r[0].loss,
            "{name:?}: {} -> {}",
            r[0].loss,
            r.last().unwrap().loss
        );
        let ck = Checkpoint::load(d.join("ck.safetensors")).unwrap();
        let saved = RunConfig::from_toml_str(&ck.extra["config"]).unwrap();
        assert_eq!(saved, RunConfig::of(&c).resolved());
    }
}

#[test]
fn resume_warns_when_the_config_differs() {
    let _l = lock();
    let d = tmp("resume");
    let ck = d.join("ck.safetensors");
    run(&TrainConfig {
        checkpoint: Some(ck.clone()),
        ..small(200, 1)
    })
    .unwrap();
    let same = run(&TrainConfig {
        resume: Some(ck.clone()),
        ..small(200, 2)
    })
    .unwrap();
    assert!(
        same.warnings.is_empty(),
        "more epochs is no difference: {:?}",
        same.warnings
    );
    let other = run(&TrainConfig {
        resume: Some(ck.clone()),
        lr: 0.1,
        ..small(200, 2)
    })
    .unwrap();
    assert_eq!(other.warnings.len(), 1, "{:?}", other.warnings);
    assert!(
        other.warnings[0].contains("lr: 0.2 -> 0.1"),
        "{}",
        other.warnings[0]
    );
}

#[test]
fn early_stop_and_keep_best() {
    let _l = lock();
    // lr 0: nothing changes, so epoch 2 is no better than epoch 1.
    let d = tmp("early");
    let ck = d.join("run.safetensors");
    let out = run(&TrainConfig {
        lr: 0.0,
        early_stop: Some(1),
        keep_best: true,
        checkpoint: Some(ck.clone()),
        ..small(200, 5)
    })
    .unwrap();
    assert!(out.stopped_early);
    assert_eq!(out.epochs.len(), 2);
    assert_eq!(Checkpoint::load(&ck).unwrap().epoch, 2);
    let best = Checkpoint::load(d.join("run.best.safetensors")).unwrap();
    assert_eq!(best.epoch, 1);
    assert_eq!(
        best.extra["best_test_accuracy"],
        out.epochs[0].test_accuracy.to_string()
    );
    // --keep-best without a checkpoint path is an error naming both flags
    let e = run(&TrainConfig {
        keep_best: true,
        ..small(200, 1)
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("--keep-best") && e.contains("--checkpoint"),
        "{e}"
    );
}

#[test]
fn amp_bf16_and_f16_train() {
    let _l = lock();
    for amp in [AmpKind::Bf16, AmpKind::F16] {
        let out = run(&TrainConfig {
            amp: Some(amp),
            ..small(300, 2)
        })
        .unwrap();
        let r = &out.step_records;
        assert!(r.iter().all(|s| s.loss.is_finite()), "{amp:?}");
        assert!(
            r.last().unwrap().loss < r[0].loss,
            "{amp:?}: {} -> {}",
            r[0].loss,
            r.last().unwrap().loss
        );
        assert!(out.test_accuracy > 0.5, "{amp:?}: {}", out.test_accuracy);
    }
}

#[test]
fn deterministic_runs_are_bit_identical() {
    let _l = lock();
    // The CNN's conv weight gradient is the reduction the switch pins down.
    let c = TrainConfig {
        model: ModelKind::Cnn,
        deterministic: true,
        ..small(200, 1)
    };
    let a = run(&c).unwrap();
    let b = run(&c).unwrap();
    assert!(kiln::are_deterministic_algorithms_enabled());
    let bytes = |o: &Outcome| -> Vec<Vec<f32>> {
        o.model
            .state_dict()
            .iter()
            .map(|(_, t)| t.to_f64_vec().iter().map(|&v| v as f32).collect())
            .collect()
    };
    assert_eq!(bytes(&a), bytes(&b));
}

#[test]
fn the_model_summary_lists_shapes_and_parameters() {
    let _l = lock();
    let m = ModelKind::Cnn.build().unwrap();
    let s =
        kiln::summary::summary(&m, &kiln::Tensor::zeros(&[1, 1, 8, 8], kiln::DType::F32)).unwrap();
    assert_eq!(
        s.total_params,
        m.parameters().iter().map(|p| p.numel()).sum::<usize>()
    );
    assert_eq!(s.rows.last().unwrap().output, vec![1, 10]);
    insta::assert_snapshot!("cnn_summary", s.to_string());
}
