//! Full checkpoints and reproducibility of `kiln train` (on a small subset of
//! the digits so that each run takes well under a second):
//! * training 2 epochs == training 1, checkpointing, resuming in a fresh model
//!   and optimizer, training 1 more: parameters and buffers bit-identical;
//! * the same seed gives bit-identical parameters (whatever `workers` is), a
//!   different seed does not;
//! * a checkpoint with a missing key, a wrong shape or dtype, or truncated
//!   bytes is an error naming the file and the key.

use kiln::checkpoint::Checkpoint;
use kiln::nn::ModuleExt;
use kiln::serialize;
use kiln::train::{run, ModelKind, Outcome, TrainConfig};
use kiln::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// `manual_seed` and the default generator are process-wide: one run at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cfg(model: ModelKind, epochs: u64, seed: u64) -> TrainConfig {
    TrainConfig {
        model,
        epochs,
        batch_size: 32,
        lr: 0.05,
        seed,
        limit: Some(240),
        ..TrainConfig::default()
    }
}

/// Every state_dict entry as raw bytes (bit-exact comparison).
fn state_bytes(out: &Outcome) -> Vec<(String, Vec<u8>)> {
    out.model
        .state_dict()
        .into_iter()
        .map(|(k, t)| (k, t.to_bytes()))
        .collect()
}

fn assert_same(a: &Outcome, b: &Outcome, what: &str) {
    let (a, b) = (state_bytes(a), state_bytes(b));
    assert_eq!(a.len(), b.len());
    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
        assert_eq!(ka, kb);
        assert!(va == vb, "{what}: `{ka}` differs");
    }
}

#[test]
fn resuming_from_a_checkpoint_is_bit_identical_to_training_through() {
    let _g = lock();
    let d = tmp("resume");
    // The MLP has dropout, so this also checks that the RNG state is restored.
    for model in [ModelKind::Cnn, ModelKind::Mlp] {
        let ck = d.join(format!("{}.safetensors", model.name()));
        let straight = run(&cfg(model, 2, 7)).unwrap();
        let first = run(&TrainConfig {
            checkpoint: Some(ck.clone()),
            ..cfg(model, 1, 7)
        })
        .unwrap();
        assert_eq!(first.epochs.len(), 1);
        let saved = Checkpoint::load(&ck).unwrap();
        assert_eq!((saved.epoch, saved.loader_epoch), (1, 1));
        assert!(saved.scheduler.is_some() && !saved.optimizer.state.is_empty());
        // A fresh run with another seed: everything must come from the checkpoint.
        let resumed = run(&TrainConfig {
            resume: Some(ck.clone()),
            ..cfg(model, 2, 12345)
        })
        .unwrap();
        assert_eq!((resumed.resumed_at, resumed.epochs.len()), (1, 1));
        assert_same(&straight, &resumed, model.name());
        assert_eq!(straight.test_accuracy, resumed.test_accuracy);
        let (a, b) = (&straight.epochs[1], &resumed.epochs[0]);
        assert_eq!((a.lr, a.train_loss), (b.lr, b.train_loss));
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_same_seed_gives_bit_identical_parameters() {
    let _g = lock();
    let a = run(&cfg(ModelKind::Cnn, 2, 3)).unwrap();
    let b = run(&cfg(ModelKind::Cnn, 2, 3)).unwrap();
    assert_same(&a, &b, "same seed");
    // Worker threads load the same batches in the same order.
    let w = run(&TrainConfig {
        workers: 2,
        ..cfg(ModelKind::Cnn, 2, 3)
    })
    .unwrap();
    assert_same(&a, &w, "workers 2 vs 0");
    let c = run(&cfg(ModelKind::Cnn, 2, 4)).unwrap();
    assert_ne!(
        state_bytes(&a),
        state_bytes(&c),
        "a different seed must differ"
    );
}

/// Rewrites checkpoint `src` to `dst` with `edit` applied to its tensors.
fn rewrite(src: &Path, dst: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    let f = serialize::open(src).unwrap();
    let meta = f.metadata().clone();
    let mut ts: Vec<(String, Tensor)> = f.into_map().into_iter().collect();
    edit(&mut ts);
    serialize::save_with_metadata(dst, &ts, Some(&meta)).unwrap();
}

fn resume_err(model: ModelKind, path: &Path) -> String {
    let e = match run(&TrainConfig {
        resume: Some(path.to_path_buf()),
        ..cfg(model, 2, 0)
    }) {
        Ok(_) => panic!("resuming from {} should fail", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&path.display().to_string()),
        "the error must name the file: {e}"
    );
    e
}

#[test]
fn a_bad_checkpoint_is_an_error_naming_the_file_and_key() {
    let _g = lock();
    let d = tmp("bad");
    let good = d.join("good.safetensors");
    run(&TrainConfig {
        checkpoint: Some(good.clone()),
        ..cfg(ModelKind::Cnn, 1, 0)
    })
    .unwrap();

    let missing = d.join("missing_key.safetensors");
    rewrite(&good, &missing, |ts| {
        ts.retain(|(k, _)| k != "model/0.weight")
    });
    let e = resume_err(ModelKind::Cnn, &missing);
    assert!(e.contains("missing key `model/0.weight`"), "{e}");

    let shape = d.join("wrong_shape.safetensors");
    rewrite(&good, &shape, |ts| {
        for (k, t) in ts.iter_mut() {
            if k == "model/1.running_mean" {
                *t = Tensor::zeros(&[3], DType::F32);
            }
        }
    });
    let e = resume_err(ModelKind::Cnn, &shape);
    assert!(
        e.contains("`model/1.running_mean`") && e.contains("shape mismatch"),
        "{e}"
    );

    let dtype = d.join("wrong_dtype.safetensors");
    rewrite(&good, &dtype, |ts| {
        for (k, t) in ts.iter_mut() {
            if k == "optim/state/0/momentum_buffer" {
                *t = t.to_dtype(DType::F64).unwrap();
            }
        }
    });
    let e = resume_err(ModelKind::Cnn, &dtype);
    assert!(
        e.contains("`optim/state/0/momentum_buffer`") && e.contains("dtype mismatch"),
        "{e}"
    );

    let rng = d.join("no_rng.safetensors");
    rewrite(&good, &rng, |ts| ts.retain(|(k, _)| k != "rng/default"));
    let e = resume_err(ModelKind::Cnn, &rng);
    assert!(e.contains("`rng/default`"), "{e}");

    let bytes = std::fs::read(&good).unwrap();
    let truncated = d.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = resume_err(ModelKind::Cnn, &truncated);
    assert!(e.contains("truncated"), "{e}");

    // A checkpoint of the other model is refused before any tensor is read.
    let e = resume_err(ModelKind::Mlp, &good);
    assert!(e.contains("`extra/model`") && e.contains("cnn"), "{e}");

    // A plain state dict is not a checkpoint.
    let plain = d.join("plain.safetensors");
    serialize::save(&plain, &[("w".into(), Tensor::zeros(&[2], DType::F32))]).unwrap();
    let e = resume_err(ModelKind::Cnn, &plain);
    assert!(e.contains("`format`"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
