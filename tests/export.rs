//! `kiln::export`: export -> save -> load round trips bit-identical to eager
//! on the digits CNN and MLP at two batch sizes other than the example's,
//! compiled loaded models, guards on call, and damaged files.

use kiln::export::{self, Dim, DynamicDim, ExportedModel};
use kiln::nn::{Module, ModuleExt, Sequential};
use kiln::train::ModelKind;
use kiln::{DType, Tensor};

/// A digits model in eval mode with non-trivial BatchNorm running stats
/// (a fresh model's are 0 and 1, which would hide a stats mix-up).
fn model(kind: ModelKind) -> Sequential {
    kiln::manual_seed(3);
    let m = kind.build().unwrap();
    let _ng = kiln::autograd::no_grad();
    for (name, t) in m.named_buffers() {
        if name.ends_with("running_mean") {
            t.copy_(&(&kiln::random::randn(t.dims(), None) * 0.1))
                .unwrap();
        } else if name.ends_with("running_var") {
            let v = &kiln::random::rand(t.dims(), None) + 0.5;
            t.copy_(&v).unwrap();
        }
    }
    m.eval();
    m
}

fn input(kind: ModelKind, batch: usize) -> Tensor {
    let dims: &[usize] = match kind {
        ModelKind::Cnn => &[batch, 1, 8, 8],
        ModelKind::Mlp => &[batch, 64],
    };
    kiln::random::randn(dims, None)
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-export-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn exported(kind: ModelKind, m: &Sequential) -> ExportedModel {
    let x = input(kind, 4);
    let e = export::export(m, &[x], &[DynamicDim::new(0, 0, "batch")]).unwrap();
    // one file per call: the tests run in parallel
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = tmp(&format!("{}-{n}.kiln", kind.name()));
    e.save(&path).unwrap();
    export::load(&path).unwrap()
}

fn round_trip(kind: ModelKind) {
    let m = model(kind);
    let loaded = exported(kind, &m);
    let _ng = kiln::autograd::no_grad();
    for batch in [3, 9] {
        let x = input(kind, batch);
        let want = m.forward(&x).unwrap();
        let got = loaded.forward(std::slice::from_ref(&x)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].dims(), want.dims());
        assert_eq!(
            got[0].to_vec::<f32>().unwrap(),
            want.to_vec::<f32>().unwrap(),
            "{} batch {batch}: loaded != eager",
            kind.name()
        );
        // the loaded model compiles like any module
        let fast = kiln::compile::compile(&loaded);
        let c = fast.forward(&x).unwrap();
        let err = c
            .to_f64_vec()
            .iter()
            .zip(want.to_f64_vec())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            err < 1e-5,
            "{} batch {batch}: compiled loaded model off by {err}",
            kind.name()
        );
    }
    println!(
        "export {}: {} round trip bit-identical at batch 3 and 9",
        kind.name(),
        loaded.signature()
    );
}

#[test]
fn cnn_round_trip_bit_identical_at_two_batch_sizes() {
    round_trip(ModelKind::Cnn);
}

#[test]
fn mlp_round_trip_bit_identical_at_two_batch_sizes() {
    round_trip(ModelKind::Mlp);
}

#[test]
fn metadata_names_dtypes_and_dynamic_dims() {
    let m = model(ModelKind::Cnn);
    let e = exported(ModelKind::Cnn, &m);
    assert_eq!(e.dynamic_dims(), &["batch".to_string()]);
    let i = &e.inputs()[0];
    assert_eq!(i.name, "input");
    assert_eq!(i.dtype, DType::F32);
    assert_eq!(
        i.dims,
        vec![
            Dim::Dynamic("batch".into()),
            Dim::Fixed(1),
            Dim::Fixed(8),
            Dim::Fixed(8)
        ]
    );
    assert_eq!(
        e.signature(),
        "(input: f32[batch,1,8,8]) -> (output: f32[batch,10])"
    );
    assert_eq!(e.weights().len(), m.state_dict().len() - 2); // num_batches_tracked unused in eval
    let renamed = e.with_names(&["image"], &["logits"]).unwrap();
    assert_eq!(
        renamed.signature(),
        "(image: f32[batch,1,8,8]) -> (logits: f32[batch,10])"
    );
}

#[test]
fn guards_name_the_input() {
    let m = model(ModelKind::Cnn);
    let e = exported(ModelKind::Cnn, &m);
    let rank = e
        .forward(&[Tensor::zeros(&[2, 8, 8], DType::F32)])
        .unwrap_err();
    assert!(
        rank.to_string().contains("input `input`: expected rank 4"),
        "{rank}"
    );
    let dtype = e
        .forward(&[Tensor::zeros(&[2, 1, 8, 8], DType::F64)])
        .unwrap_err();
    assert!(
        dtype
            .to_string()
            .contains("input `input`: expected dtype f32, got f64"),
        "{dtype}"
    );
    let fixed = e
        .forward(&[Tensor::zeros(&[2, 1, 9, 8], DType::F32)])
        .unwrap_err();
    assert!(fixed.to_string().contains("dim 2 must be 8"), "{fixed}");
    let count = e.forward(&[]).unwrap_err();
    assert!(count.to_string().contains("takes 1 inputs"), "{count}");
}

#[test]
fn training_mode_is_refused() {
    let m = ModelKind::Cnn.build().unwrap();
    m.train();
    let e = export::export(&m, &[input(ModelKind::Cnn, 4)], &[])
        .err()
        .unwrap();
    assert!(e.to_string().contains("model.eval()"), "{e}");
}

#[test]
fn damaged_files_are_clear_errors() {
    let m = model(ModelKind::Mlp);
    let e = export::export(&m, &[input(ModelKind::Mlp, 2)], &[]).unwrap();
    let bytes = e.to_bytes().unwrap();
    let path = tmp("damaged.kiln");
    let check = |b: &[u8], want: &str| {
        std::fs::write(&path, b).unwrap();
        let err = export::load(&path).err().unwrap().to_string();
        assert!(err.contains(want), "want `{want}` in: {err}");
        assert!(err.contains("damaged.kiln"), "names the file: {err}");
    };
    check(&bytes[..bytes.len() / 2], "truncated");
    let mut flipped = bytes.clone();
    let at = bytes.len() - 100;
    flipped[at] ^= 0x40;
    check(&flipped, "checksum mismatch");
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&7u32.to_le_bytes());
    check(&newer, "newer kiln (format version 7");
    check(b"not a model", "not a kiln export");
    // the undamaged bytes load
    std::fs::write(&path, &bytes).unwrap();
    assert!(export::load(&path).is_ok());
}
