//! `kiln train --compile` and the W5/W6 training-step benchmarks.
//! * training through `compile(&model)` reaches the eager run's accuracy;
//! * checkpoint and resume work with `--compile` (the wrapper borrows the
//!   model; the checkpoint holds the model's own parameters);
//! * the eager-vs-compiled step-time comparison runs on copies and leaves the
//!   trained model alone;
//! * `kiln bench --only W5,W6 --mode both` gives an eager and a compiled row
//!   for each. No timing assertions.

use kiln::bench::{self, Mode};
use kiln::nn::ModuleExt;
use kiln::train::{run, step_time, ModelKind, Outcome, TrainConfig};
use std::sync::{Mutex, MutexGuard};

/// `manual_seed` and the default generator are process-wide: one run at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn cfg(model: ModelKind, epochs: u64, compile: bool) -> TrainConfig {
    TrainConfig {
        model,
        epochs,
        batch_size: 32,
        lr: 0.05,
        seed: 7,
        limit: Some(600),
        compile,
        ..TrainConfig::default()
    }
}

fn params(out: &Outcome) -> Vec<(String, Vec<f64>)> {
    let sd = out.model.state_dict();
    sd.into_iter().map(|(k, t)| (k, t.to_f64_vec())).collect()
}

fn max_diff(a: &Outcome, b: &Outcome) -> f64 {
    let (a, b) = (params(a), params(b));
    assert_eq!(a.len(), b.len());
    let mut m = 0.0f64;
    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
        assert_eq!(ka, kb);
        for (x, y) in va.iter().zip(vb) {
            m = m.max((x - y).abs());
        }
    }
    m
}

#[test]
fn compiled_training_reaches_the_eager_accuracy() {
    let _g = lock();
    // The whole digits set, default lr: a few epochs reach ~0.95.
    let full = |model, compile| TrainConfig {
        limit: None,
        lr: TrainConfig::default().lr,
        ..cfg(model, 4, compile)
    };
    for model in [ModelKind::Cnn, ModelKind::Mlp] {
        let eager = run(&full(model, false)).unwrap();
        let comp = run(&full(model, true)).unwrap();
        eprintln!(
            "{}: eager {} compiled {}",
            model.name(),
            eager.test_accuracy,
            comp.test_accuracy
        );
        let (e, c) = (eager.test_accuracy, comp.test_accuracy);
        assert!(e > 0.9, "{}: eager accuracy {e}", model.name());
        assert!(
            (e - c).abs() <= 0.02,
            "{}: compiled accuracy {c} vs eager {e}",
            model.name()
        );
        assert_eq!(comp.steps, eager.steps);
        assert!(comp.step_ms_mean > 0.0 && comp.first_step_ms > 0.0);
        let j: serde_json::Value = serde_json::from_str(&comp.json(&full(model, true))).unwrap();
        assert_eq!(j["compile"], true);
        assert_eq!(j["steps"], comp.steps);
    }
}

#[test]
fn checkpoint_and_resume_work_with_compile() {
    let _g = lock();
    let d = std::env::temp_dir().join(format!("kiln-train-compile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let ck = d.join("cnn.safetensors");
    let c = |epochs| TrainConfig {
        limit: Some(240),
        ..cfg(ModelKind::Cnn, epochs, true)
    };
    let straight = run(&c(2)).unwrap();
    let first = run(&TrainConfig {
        checkpoint: Some(ck.clone()),
        ..c(1)
    })
    .unwrap();
    assert_eq!(first.epochs.len(), 1);
    let resumed = run(&TrainConfig {
        resume: Some(ck.clone()),
        ..c(2)
    })
    .unwrap();
    assert_eq!((resumed.resumed_at, resumed.epochs.len()), (1, 1));
    // Bit-identical while compiled training steps run eagerly; a compiled
    // backward may reorder float sums, hence the tolerance.
    let diff = max_diff(&straight, &resumed);
    assert!(diff < 1e-4, "resumed parameters differ by {diff}");
    // The eager path resumes from a checkpoint written by --compile.
    let eager = run(&TrainConfig {
        resume: Some(ck.clone()),
        compile: false,
        ..c(2)
    })
    .unwrap();
    assert!(max_diff(&straight, &eager) < 1e-4);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn step_time_comparison_leaves_the_trained_model_alone() {
    let _g = lock();
    let c = TrainConfig {
        limit: Some(240),
        ..cfg(ModelKind::Cnn, 1, true)
    };
    let out = run(&c).unwrap();
    let before = params(&out);
    let cmp = step_time::compare(&c, &out.model, 3).unwrap();
    assert_eq!(cmp.steps, 3);
    assert!(cmp.eager_ms > 0.0 && cmp.compiled_ms > 0.0);
    let line = cmp.line();
    assert!(
        line.starts_with("step time: eager ")
            && line.contains(" ms, compiled ")
            && line.ends_with("x)"),
        "{line}"
    );
    assert_eq!(before, params(&out), "compare must not train the model");
}

#[test]
fn bench_w5_w6_give_eager_and_compiled_rows() {
    let _g = lock();
    let only = vec!["W5".to_string(), "W6".to_string()];
    let rows = bench::run_profiled(&only, 1, Mode::Both, None).unwrap();
    let got: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.workload.as_str(), r.mode.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("W5", "eager"),
            ("W5", "compiled"),
            ("W6", "eager"),
            ("W6", "compiled")
        ]
    );
    for r in &rows {
        let j: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(j["workload"], r.workload.as_str());
        assert!(j["median_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(j.get("compile_ms").is_some(), r.mode == "compiled");
        assert_eq!(j.get("gflops").is_some(), r.workload == "W6");
    }
}
