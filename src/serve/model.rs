//! [`ServableModel`]: what the server needs of a model — named, typed inputs
//! and outputs with a dynamic batch dim, and a forward on a whole batch.

use crate::nn::{Module, ModuleExt, Sequential};
use crate::train::ModelKind;
use crate::{DType, Result, Tensor};
use kiln_ir::bail;
use std::path::Path;

/// One input or output: its name, dtype and shape, `None` for a dynamic dim.
/// Dim 0 is the batch dim the server merges requests along.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<Option<usize>>,
}

impl TensorSpec {
    /// `TensorSpec::batched("input", DType::F32, &[1, 8, 8])`: `[-1, 1, 8, 8]`.
    pub fn batched(name: &str, dtype: DType, rest: &[usize]) -> TensorSpec {
        let mut dims = vec![None];
        dims.extend(rest.iter().map(|&d| Some(d)));
        TensorSpec {
            name: name.into(),
            dtype,
            dims,
        }
    }

    /// The shape as KServe prints it: `-1` for a dynamic dim.
    pub fn shape(&self) -> Vec<i64> {
        self.dims
            .iter()
            .map(|d| d.map_or(-1, |n| n as i64))
            .collect()
    }
}

/// A model the server can run.
///
/// Every input and output has a dynamic dim 0 (the batch); the server
/// concatenates requests along it, calls [`ServableModel::forward`] once on
/// an inference thread, and splits the outputs back by each request's rows.
/// An exported `.kiln` model plugs in with an adapter from its own specs.
///
/// ```
/// use kiln::serve::{DigitsModel, ServableModel};
/// let m = DigitsModel::fresh(kiln::train::ModelKind::Mlp).unwrap();
/// assert_eq!(m.inputs()[0].shape(), vec![-1, 1, 8, 8]);
/// let y = m.forward(&[kiln::Tensor::zeros(&[3, 1, 8, 8], kiln::DType::F32)]).unwrap();
/// assert_eq!(y[0].dims(), &[3, 10]);
/// ```
pub trait ServableModel: Send + Sync {
    fn inputs(&self) -> &[TensorSpec];
    fn outputs(&self) -> &[TensorSpec];
    /// Whether NaN/Inf inputs are accepted (the server rejects them otherwise).
    fn allows_non_finite(&self) -> bool {
        false
    }
    /// Runs one batch: `inputs[i]` has shape `[batch, ..inputs()[i].dims[1..]]`.
    fn forward(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
}

/// A digits CNN or MLP (`kiln train --model cnn|mlp`), in eval mode:
/// input `input` f32 `[-1, 1, 8, 8]` (standardised pixels, as training
/// feeds them), output `logits` f32 `[-1, 10]`.
pub struct DigitsModel {
    kind: ModelKind,
    model: Sequential,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl DigitsModel {
    /// A freshly initialised model (for tests and load tests).
    pub fn fresh(kind: ModelKind) -> Result<DigitsModel> {
        let model = kind.build()?;
        model.eval();
        Ok(DigitsModel {
            kind,
            model,
            inputs: vec![TensorSpec::batched("input", DType::F32, &[1, 8, 8])],
            outputs: vec![TensorSpec::batched("logits", DType::F32, &[10])],
        })
    }

    /// Loads `path`: a `kiln train --checkpoint` file (keys `model/*`) or a
    /// plain state dict of the model (`serialize::save(path, &model.state_dict())`).
    pub fn load(kind: ModelKind, path: &Path) -> Result<DigitsModel> {
        let m = DigitsModel::fresh(kind)?;
        let loaded = crate::serialize::load(path)?;
        let from_checkpoint = loaded.iter().any(|(k, _)| k.starts_with("model/"));
        let sd: Vec<(String, Tensor)> = if from_checkpoint {
            loaded
                .into_iter()
                .filter_map(|(k, t)| k.strip_prefix("model/").map(|s| (s.to_string(), t)))
                .collect()
        } else {
            loaded
        };
        if sd.is_empty() {
            bail!(
                "serve",
                "{}: no tensors for a {} model",
                path.display(),
                kind.name()
            );
        }
        m.model
            .load_state_dict(&sd, true)
            .map_err(|e| kiln_ir::Error::op("serve", format!("{}: {e}", path.display())))?;
        m.model.eval();
        Ok(m)
    }

    pub fn kind(&self) -> ModelKind {
        self.kind
    }
}

impl ServableModel for DigitsModel {
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn forward(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _g = crate::autograd::no_grad();
        Ok(vec![self.model.forward(&inputs[0])?])
    }
}

/// An exported `.kiln` model as a [`ServableModel`]: a fixed dim keeps its
/// size, a named dynamic dim (`batch`) becomes `None` (-1 in metadata).
pub struct ExportedServable {
    model: crate::export::ExportedModel,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl ExportedServable {
    /// Wraps a loaded model; the server checks its specs (FP32, dynamic dim 0).
    pub fn new(model: crate::export::ExportedModel) -> ExportedServable {
        let convert = |specs: &[crate::export::TensorSpec]| -> Vec<TensorSpec> {
            specs
                .iter()
                .map(|s| TensorSpec {
                    name: s.name.clone(),
                    dtype: s.dtype,
                    dims: s
                        .dims
                        .iter()
                        .map(|d| match d {
                            crate::export::Dim::Fixed(n) => Some(*n),
                            crate::export::Dim::Dynamic(_) => None,
                        })
                        .collect(),
                })
                .collect()
        };
        let inputs = convert(model.inputs());
        let outputs = convert(model.outputs());
        ExportedServable {
            model,
            inputs,
            outputs,
        }
    }
}

impl ServableModel for ExportedServable {
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn forward(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _ng = crate::autograd::no_grad();
        self.model.forward(inputs)
    }
}
