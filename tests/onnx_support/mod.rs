//! What the ONNX export tests share: a scratch folder, the Python with
//! `onnx` and `onnxruntime` (absent: those checks skip), and tensors written
//! as ONNX TensorProto files for it.

use kiln::Tensor;
use prost::Message;
use std::path::{Path, PathBuf};

/// `<tmp>/kiln-<name>-<pid>`, created.
pub fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `$KILN_ONNX_PYTHON`, else the repository's `.venv-onnx`, if it imports
/// `onnx` and `onnxruntime`.
pub fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("KILN_ONNX_PYTHON").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-onnx/bin/python")),
    ];
    candidates.into_iter().flatten().find(|p| {
        p.exists()
            && std::process::Command::new(p)
                .args(["-c", "import onnx, onnxruntime"])
                .output()
                .is_ok_and(|o| o.status.success())
    })
}

/// Writes `t` to `path` as an ONNX TensorProto.
pub fn write_pb(path: &Path, t: &Tensor) {
    std::fs::write(
        path,
        kiln::onnx::tensor::to_proto("t", t)
            .unwrap()
            .encode_to_vec(),
    )
    .unwrap();
}

/// Runs `tests/onnx_check.py` on the ONNX file at `path`: onnx.checker, then
/// onnxruntime on each `inputs:outputs` pair of TensorProto files at 1e-5.
/// Prints and returns its output with whether it passed, or `None` when no
/// Python has `onnx` and `onnxruntime` (the caller prints why it skips).
pub fn onnx_check(path: &Path, pairs: &[String]) -> Option<(bool, String)> {
    let py = python()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx_check.py");
    let out = std::process::Command::new(py)
        .arg(script)
        .arg(path)
        .arg("1e-5")
        .args(pairs)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{text}");
    Some((out.status.success(), text))
}
