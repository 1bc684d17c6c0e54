//! kiln's side of `scripts/torch-checkpoint-check.sh`: loads the full-size
//! PyTorch checkpoints of `scripts/torch_checkpoint_check.py` (torchvision
//! resnet18, mobilenet_v3_small, efficientnet_b0, vit_b_16 and transformers
//! GPT-2 small, each in f32, f16 and bf16) into `kiln::models` with a strict
//! report, runs the saved input and compares with PyTorch's output.
//!
//! ```sh
//! cargo run --release --example checkpoint_check -- DIR [TOL] [MODEL ...]
//! ```
//!
//! What is compared: kiln's f32 model holding the file's weights (an f16 or
//! bf16 file is upcast exactly while loading) against PyTorch's f32 model
//! holding the same weights (`out/DTYPE` of `MODEL.io.safetensors`), so every
//! dtype is held to the same f32 tolerance: max |kiln - torch| <= TOL x
//! max |torch|, TOL 1e-4 by default (an output whose max |torch| is
//! under 1e-3 fails: it would compare nothing). Each line also gives the
//! distance to the f32 checkpoint's output (`vs_f32=`), what rounding the
//! weights to f16 or bf16 costs, for information only. Prints
//! `ckpt MODEL DTYPE: ok max_abs=...` per model and dtype; exits 1 when any
//! check fails.

use kiln::models::efficientnet::{efficientnet_b0, EfficientNetOptions};
use kiln::models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use kiln::models::mobilenetv3::{mobilenet_v3_small, MobileNetV3Options};
use kiln::models::resnet::resnet18;
use kiln::models::vit::vit_b_16;
use kiln::nn::{LoadReport, Module, ModuleExt};
use kiln::{serialize, DType, Result, Tensor};
use std::path::Path;

const MODELS: [&str; 5] = [
    "resnet18",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "vit_b_16",
    "gpt2",
];
const DTYPES: [(&str, DType); 3] = [
    ("f32", DType::F32),
    ("f16", DType::F16),
    ("bf16", DType::BF16),
];

/// A zoo model; GPT-2 loads through `load_hf_state_dict` (its file leaves
/// out the tied head, as `save_pretrained` writes it).
enum Loaded {
    Strict(Box<dyn Module>),
    Gpt2(Gpt2LMHeadModel),
}

impl Loaded {
    fn model(&self) -> &dyn Module {
        match self {
            Loaded::Strict(m) => &**m,
            Loaded::Gpt2(m) => m,
        }
    }

    fn load(&self, sd: &[(String, Tensor)]) -> Result<LoadReport> {
        match self {
            Loaded::Strict(m) => m.load_state_dict(sd, true),
            Loaded::Gpt2(m) => m.load_hf_state_dict(sd, true),
        }
    }
}

fn build(name: &str) -> Result<Loaded> {
    Ok(Loaded::Strict(match name {
        "resnet18" => Box::new(resnet18(1000)?),
        "mobilenet_v3_small" => Box::new(mobilenet_v3_small(&MobileNetV3Options::default())?),
        "efficientnet_b0" => Box::new(efficientnet_b0(&EfficientNetOptions::default())?),
        "vit_b_16" => Box::new(vit_b_16()?),
        "gpt2" => return Ok(Loaded::Gpt2(Gpt2LMHeadModel::new(&Gpt2Config::default())?)),
        other => kiln::ir::bail!("checkpoint_check", "unknown model {other}"),
    }))
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| if d.is_nan() || d > m { d } else { m })
}

/// One model and dtype: `Ok(line)` or `Err(line)`.
fn check(dir: &Path, name: &str, tag: &str, dtype: DType, tol: f64, m: &Loaded) -> Result<String> {
    let sd = serialize::load(dir.join(format!("{name}.{tag}.safetensors")))?;
    let floats: Vec<&Tensor> = sd
        .iter()
        .map(|(_, t)| t)
        .filter(|t| t.dtype().is_float())
        .collect();
    if floats.iter().any(|t| t.dtype() != dtype) {
        kiln::ir::bail!(
            "checkpoint_check",
            "{name}.{tag}: a floating tensor is not {dtype:?}"
        );
    }
    let report = m.load(&sd)?;
    if report != LoadReport::default() {
        kiln::ir::bail!("checkpoint_check", "{name}.{tag}: {report:?}");
    }
    let io = serialize::load_map(dir.join(format!("{name}.io.safetensors")))?;
    let get = |k: &str| {
        io.get(k)
            .cloned()
            .ok_or_else(|| kiln::Error::op("checkpoint_check", format!("{name}.io: no {k}")))
    };
    let y = m.model().forward(&get("input")?)?;
    let (want, f32_out) = (get(&format!("out/{tag}"))?, get("out/f32")?);
    if y.dims() != want.dims() {
        kiln::ir::bail!(
            "checkpoint_check",
            "{name} {tag}: shape {:?} vs torch {:?}",
            y.dims(),
            want.dims()
        );
    }
    let scale = want.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
    // an all-zero (or vanishing) output would pass any comparison
    if !(scale >= 1e-3) {
        kiln::ir::bail!(
            "checkpoint_check",
            "{name} {tag}: torch's output is degenerate (max |y| = {scale:e}), nothing to compare"
        );
    }
    let d = max_abs(&y, &want);
    let verdict = if d <= tol * scale { "ok" } else { "FAIL" };
    Ok(format!(
        "ckpt {name} {tag}: {verdict} max_abs={d:.3e} (limit {:.1e}, max|torch|={scale:.3}, vs_f32={:.3e}, {} keys strict)",
        tol * scale,
        max_abs(&y, &f32_out),
        sd.len()
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(Path::new) else {
        eprintln!("usage: checkpoint_check DIR [TOL] [MODEL ...]");
        std::process::exit(2);
    };
    let tol: f64 = args.get(1).and_then(|t| t.parse().ok()).unwrap_or(1e-4);
    let names: Vec<&str> = match args.get(2..) {
        Some(n) if !n.is_empty() => n.iter().map(String::as_str).collect(),
        _ => MODELS.to_vec(),
    };
    let _ng = kiln::autograd::no_grad();
    let mut failed = 0;
    for name in names {
        let m = match build(name) {
            Ok(m) => m,
            Err(e) => {
                println!("ckpt {name}: FAIL {e}");
                failed += 1;
                continue;
            }
        };
        m.model().eval();
        for (tag, dtype) in DTYPES {
            match check(dir, name, tag, dtype, tol, &m) {
                Ok(line) => {
                    failed += usize::from(!line.contains(": ok "));
                    println!("{line}");
                }
                Err(e) => {
                    failed += 1;
                    println!("ckpt {name} {tag}: FAIL {e}");
                }
            }
        }
    }
    std::process::exit(i32::from(failed > 0));
}
