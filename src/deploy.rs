//! `kiln export` and `kiln run`: write a digits model as `.kiln` or `.onnx`,
//! and run either format on tensors from files.
//!
//! ```sh
//! kiln export --model cnn -o cnn.kiln            # dynamic batch, eval mode
//! kiln export --model mlp --checkpoint ck.safetensors -o mlp.onnx
//! kiln run cnn.kiln --input input=x.npy --output y.npy --compile
//! ```

use crate::export::{self, DynamicDim, ExportedModel};
use crate::nn::ModuleExt;
use crate::onnx::{self, OnnxModel};
use crate::train::ModelKind;
use crate::{Result, Tensor};
use kiln_ir::{bail, Error};
use std::path::{Path, PathBuf};

/// The options of `kiln export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// cnn or mlp (the digits models of `kiln train`), or a zoo model:
    /// resnet18/34/50, mobilenet_v3_small/large, efficientnet_b0, vit_tiny,
    /// gpt2_tiny, bert_tiny, unet_tiny, lstm (`kiln::models::catalog`).
    #[arg(long, default_value = "cnn")]
    pub model: String,
    /// Where to write: `.kiln` (kiln's format) or `.onnx`.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// A checkpoint of `kiln train --checkpoint` to take the weights from,
    /// or for a zoo model a safetensors state_dict loaded strictly
    /// (default: a fresh model from --seed).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// The example batch size traced (the batch dim stays dynamic unless --static).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Fix the batch size instead of exporting it as the dynamic dim `batch`.
    #[arg(long = "static")]
    pub static_batch: bool,
    /// ONNX opset (with a `.onnx` output).
    #[arg(long, default_value_t = onnx::DEFAULT_OPSET)]
    pub opset: i64,
    /// manual_seed for a fresh model.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `kiln export`: returns the line to print.
pub fn export_cli(a: &ExportArgs) -> Result<String> {
    let Some(kind) = ModelKind::parse(&a.model) else {
        return export_zoo(a);
    };
    crate::manual_seed(a.seed);
    let model = kind.build()?;
    if let Some(ck) = &a.checkpoint {
        crate::checkpoint::Checkpoint::load(ck)?.restore_model(ck, &model)?;
    }
    model.eval();
    let dims: &[usize] = match kind {
        ModelKind::Cnn => &[a.batch, 1, 8, 8],
        ModelKind::Mlp => &[a.batch, 64],
    };
    let x = crate::random::randn(dims, None);
    let dynamic = if a.static_batch {
        vec![]
    } else {
        vec![DynamicDim::new(0, 0, "batch")]
    };
    let e = export::export(&model, std::slice::from_ref(&x), &dynamic)?;
    let onnx_out = a.output.extension().is_some_and(|x| x == "onnx");
    if onnx_out {
        onnx::from_exported(&e, &a.output, a.opset)?;
    } else {
        e.save(&a.output)?;
        // check what was written: the loaded file must reproduce eager bit for bit
        let back = export::load(&a.output)?;
        let _ng = crate::autograd::no_grad();
        let (want, got) = (
            crate::nn::Module::forward(&model, &x)?,
            back.forward(std::slice::from_ref(&x))?,
        );
        if want.to_f64_vec() != got[0].to_f64_vec() {
            bail!(
                "export",
                "{}: the reloaded model disagrees with eager",
                a.output.display()
            );
        }
    }
    Ok(format!(
        "exported {} {} to {} ({})",
        kind.name(),
        e.signature(),
        a.output.display(),
        if onnx_out {
            format!("ONNX opset {}", a.opset)
        } else {
            "kiln export format 1, reload checked".into()
        }
    ))
}

/// `kiln export --model ZOO_MODEL`: the model's `forward_many`, every
/// input's dim 0 the dynamic `batch`, checked as the digits models are.
fn export_zoo(a: &ExportArgs) -> Result<String> {
    crate::manual_seed(a.seed);
    let zoo = crate::models::catalog::build(&a.model).map_err(|e| {
        Error::op(
            "export",
            format!("unknown model `{}`: cnn, mlp or a zoo model ({e})", a.model),
        )
    })?;
    let model = zoo.model.as_ref();
    if let Some(ck) = &a.checkpoint {
        let sd: Vec<(String, Tensor)> = crate::serialize::load_map(ck)?.into_iter().collect();
        model.load_state_dict(&sd, true)?;
    }
    model.eval();
    let xs = (zoo.example)(a.batch);
    let dynamic: Vec<DynamicDim> = if a.static_batch {
        vec![]
    } else {
        (0..xs.len())
            .map(|i| DynamicDim::new(i, 0, "batch"))
            .collect()
    };
    let mut names = model.named_parameters();
    names.extend(model.named_buffers());
    let first_output = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let args: Vec<Option<&Tensor>> = xs.iter().map(Some).collect();
        Ok(model.forward_many(&args)?.into_iter().take(1).collect())
    };
    let onnx_out = a.output.extension().is_some_and(|x| x == "onnx");
    // for ONNX, LSTM/GRU layers are traced as scopes (written as ONNX LSTM/GRU nodes)
    let e = export::export_traced("forward", first_output, &names, &xs, &dynamic, onnx_out)?;
    if onnx_out {
        onnx::from_exported(&e, &a.output, a.opset)?;
    } else {
        e.save(&a.output)?;
        let back = export::load(&a.output)?;
        let _ng = crate::autograd::no_grad();
        let (want, got) = (first_output(&xs)?, back.forward(&xs)?);
        if want[0].to_f64_vec() != got[0].to_f64_vec() {
            bail!(
                "export",
                "{}: the reloaded model disagrees with eager",
                a.output.display()
            );
        }
    }
    Ok(format!(
        "exported {} {} to {} ({})",
        a.model,
        e.signature(),
        a.output.display(),
        if onnx_out {
            format!("ONNX opset {}", a.opset)
        } else {
            "kiln export format 1, reload checked".into()
        }
    ))
}

/// The options of `kiln run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// A `.kiln` (kiln export) or `.onnx` model.
    pub model: PathBuf,
    /// NAME=FILE (`.npy`, ONNX TensorProto `.pb`, or `.safetensors` holding key NAME);
    /// a bare FILE for a one-input model. Repeat for several inputs.
    #[arg(long = "input", short = 'i')]
    pub inputs: Vec<String>,
    /// Write the outputs: `.npy` (one output) or `.safetensors` (all, by name).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Run through `compile()` instead of eagerly.
    #[arg(long)]
    pub compile: bool,
}

enum Loaded {
    Kiln(ExportedModel),
    Onnx(OnnxModel),
}

impl Loaded {
    fn open(p: &Path) -> Result<Loaded> {
        if p.extension().is_some_and(|x| x == "onnx") {
            Ok(Loaded::Onnx(onnx::load(p)?))
        } else {
            Ok(Loaded::Kiln(export::load(p)?))
        }
    }
    fn input_names(&self) -> Vec<String> {
        let specs = match self {
            Loaded::Kiln(m) => m.inputs(),
            Loaded::Onnx(m) => m.inputs(),
        };
        specs.iter().map(|s| s.name.clone()).collect()
    }
    fn output_names(&self) -> Vec<String> {
        let specs = match self {
            Loaded::Kiln(m) => m.outputs(),
            Loaded::Onnx(m) => m.outputs(),
        };
        specs.iter().map(|s| s.name.clone()).collect()
    }
    fn signature(&self) -> String {
        match self {
            Loaded::Kiln(m) => m.signature(),
            Loaded::Onnx(m) => m.signature(),
        }
    }
    fn run(&self, xs: &[Tensor], compiled: bool) -> Result<Vec<Tensor>> {
        let _ng = crate::autograd::no_grad();
        match (self, compiled) {
            (Loaded::Kiln(m), false) => m.forward(xs),
            (Loaded::Onnx(m), false) => m.forward(xs),
            (Loaded::Kiln(m), true) => {
                crate::compile::compile_fn("kiln-run", |a| m.forward(a)).call(xs)
            }
            (Loaded::Onnx(m), true) => {
                crate::compile::compile_fn("kiln-run", |a| m.forward(a)).call(xs)
            }
        }
    }
}

/// Reads one tensor: `.npy`, `.pb` (TensorProto) or `.safetensors` (key `name`, or its only tensor).
pub fn read_tensor(path: &Path, name: &str) -> Result<Tensor> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let shown = path.display().to_string();
    match ext {
        "npy" => crate::npy::load(path),
        "pb" => {
            use prost::Message;
            let b = std::fs::read(path)
                .map_err(|e| Error::op("run", format!("{shown}: cannot read: {e}")))?;
            let p = onnx::proto::TensorProto::decode(b.as_slice())
                .map_err(|e| Error::op("run", format!("{shown}: not an ONNX TensorProto: {e}")))?;
            onnx::tensor::from_proto(&p).map_err(|e| Error::op("run", format!("{shown}: {e}")))
        }
        "safetensors" => {
            let l = crate::serialize::open(path)?;
            if l.contains(name) {
                return Ok(l.get(name)?.clone());
            }
            let keys: Vec<&str> = l.keys().collect();
            match keys.as_slice() {
                [k] => Ok(l.get(k)?.clone()),
                _ => bail!(
                    "run",
                    "{shown}: no tensor `{name}` (keys: {})",
                    keys.join(", ")
                ),
            }
        }
        _ => bail!(
            "run",
            "{shown}: unknown input format `.{ext}` (.npy, .pb or .safetensors)"
        ),
    }
}

/// `shape [2,10] f32, first values: 0.1, ...`
fn describe(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let first: Vec<String> = v.iter().take(8).map(|x| format!("{x:.6}")).collect();
    format!(
        "{}{:?}, first values: [{}{}]",
        t.dtype(),
        t.dims(),
        first.join(", "),
        if v.len() > 8 { ", ..." } else { "" }
    )
}

/// `kiln run`: returns the lines to print.
pub fn run_cli(a: &RunArgs) -> Result<String> {
    let m = Loaded::open(&a.model)?;
    let names = m.input_names();
    let mut given: Vec<Option<Tensor>> = vec![None; names.len()];
    for spec in &a.inputs {
        let (name, file) = match spec.split_once('=') {
            Some((n, f)) => (n.to_string(), f),
            None if names.len() == 1 => (names[0].clone(), spec.as_str()),
            None => bail!(
                "run",
                "`{spec}`: say which input it is (NAME=FILE); the model takes {}",
                m.signature()
            ),
        };
        let Some(k) = names.iter().position(|n| *n == name) else {
            bail!(
                "run",
                "the model has no input `{name}`; it takes {}",
                m.signature()
            );
        };
        given[k] = Some(read_tensor(Path::new(file), &name)?);
    }
    let xs = given
        .into_iter()
        .zip(&names)
        .map(|(t, n)| {
            t.ok_or_else(|| Error::op("run", format!("input `{n}` is missing (--input {n}=FILE)")))
        })
        .collect::<Result<Vec<_>>>()?;
    let outs = m.run(&xs, a.compile)?;
    let onames = m.output_names();
    let mut lines = vec![];
    match &a.output {
        Some(p) if p.extension().is_some_and(|e| e == "npy") => {
            if outs.len() != 1 {
                bail!(
                    "run",
                    "{} outputs do not fit one .npy file; write .safetensors",
                    outs.len()
                );
            }
            crate::npy::save(p, &outs[0])?;
            lines.push(format!("wrote {} to {}", onames[0], p.display()));
        }
        Some(p) => {
            let named: Vec<(String, Tensor)> =
                onames.iter().cloned().zip(outs.iter().cloned()).collect();
            crate::serialize::save(p, &named)?;
            lines.push(format!("wrote {} outputs to {}", named.len(), p.display()));
        }
        None => {
            for (n, t) in onames.iter().zip(&outs) {
                lines.push(format!("{n}: {}", describe(t)));
            }
        }
    }
    Ok(lines.join("\n"))
}
