//! `kiln export` and `kiln run` end to end: export the digits MLP as `.kiln`
//! and `.onnx`, run both on the same `.npy` input, eagerly and compiled, and
//! check every route gives the model's eager output.

use std::path::PathBuf;
use std::process::Command;

fn kiln(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kiln {}: {text}", args.join(" "));
    text
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-deploy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn export_then_run_both_formats() {
    let d = dir();
    let (k, o) = (d.join("mlp.kiln"), d.join("mlp.onnx"));
    let line = kiln(&["export", "--model", "mlp", "-o", k.to_str().unwrap()]);
    assert!(
        line.contains("(input: f32[batch,64]) -> (output: f32[batch,10])"),
        "{line}"
    );
    kiln(&["export", "--model", "mlp", "-o", o.to_str().unwrap()]);
    let x = kiln::random::randn(&[3, 64], None);
    let xp = d.join("x.npy");
    kiln::npy::save(&xp, &x).unwrap();
    // the same seed as `kiln export` (0): the eager reference
    kiln::manual_seed(0);
    let m = kiln::train::ModelKind::Mlp.build().unwrap();
    kiln::nn::ModuleExt::eval(&m);
    let want = {
        let _ng = kiln::autograd::no_grad();
        kiln::nn::Module::forward(&m, &x)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    for (model, extra) in [
        (&k, None),
        (&k, Some("--compile")),
        (&o, None),
        (&o, Some("--compile")),
    ] {
        let yp = d.join("y.npy");
        let input = format!("input={}", xp.display());
        let mut args = vec![
            "run",
            model.to_str().unwrap(),
            "--input",
            &input,
            "--output",
            yp.to_str().unwrap(),
        ];
        args.extend(extra);
        kiln(&args);
        let got = kiln::npy::load(&yp).unwrap().to_vec::<f32>().unwrap();
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let tol = if extra.is_some() { 1e-5 } else { 0.0 };
        assert!(err <= tol, "{} {extra:?}: max error {err}", model.display());
    }
    let shown = kiln(&["run", k.to_str().unwrap(), "--input", xp.to_str().unwrap()]);
    assert!(
        shown.starts_with("output: f32[3, 10], first values: ["),
        "{shown}"
    );
    println!("kiln run: {shown}");
}

#[test]
fn run_errors_name_the_input() {
    let d = dir();
    let k = d.join("cnn.kiln");
    kiln(&["export", "--model", "cnn", "-o", k.to_str().unwrap()]);
    let xp = d.join("bad.npy");
    kiln::npy::save(&xp, &kiln::Tensor::zeros(&[2, 64], kiln::DType::F32)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            k.to_str().unwrap(),
            "--input",
            &format!("input={}", xp.display()),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("input `input`: expected rank 4"), "{err}");
}

#[test]
fn zoo_model_exports_and_runs_in_both_formats() {
    let d = dir();
    let (k, o) = (d.join("lstm.kiln"), d.join("lstm.onnx"));
    let line = kiln(&["export", "--model", "lstm", "-o", k.to_str().unwrap()]);
    assert!(
        line.contains("(input: f32[batch,7,16]) -> (output: f32[batch,5])"),
        "{line}"
    );
    kiln(&["export", "--model", "lstm", "-o", o.to_str().unwrap()]);
    let x = kiln::random::randn(&[4, 7, 16], None);
    let xp = d.join("seq.npy");
    kiln::npy::save(&xp, &x).unwrap();
    let mut outs = vec![];
    for model in [&k, &o] {
        let yp = d.join("lstm_y.npy");
        let input = format!("input={}", xp.display());
        kiln(&[
            "run",
            model.to_str().unwrap(),
            "--input",
            &input,
            "--output",
            yp.to_str().unwrap(),
        ]);
        outs.push(kiln::npy::load(&yp).unwrap().to_vec::<f32>().unwrap());
    }
    assert_eq!(outs[0].len(), 4 * 5);
    let err = outs[0]
        .iter()
        .zip(&outs[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-5, ".kiln and .onnx disagree by {err}");
    let bad = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["export", "--model", "alexnet", "-o", k.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(err.contains("unknown model `alexnet`"), "{err}");
}
