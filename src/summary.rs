//! A model summary in the style of `torchinfo.summary`: each layer of a
//! [`Sequential`] with its output shape and parameter count, from one
//! forward pass of a sample batch.
//!
//! ```
//! use kiln::nn::{Activation, Linear, Sequential};
//! use kiln::{DType, Tensor};
//! let m = Sequential::new().add(Linear::new(4, 3, true).unwrap()).add(Activation::relu());
//! let s = kiln::summary::summary(&m, &Tensor::zeros(&[2, 4], DType::F32)).unwrap();
//! assert_eq!(s.rows[0].output, vec![2, 3]);
//! assert_eq!(s.total_params, 15);
//! assert!(s.to_string().contains("Total params: 15"));
//! ```

use crate::nn::{Entry, Module, ModuleExt, Sequential};
use crate::{autograd, Result, Tensor};
use std::fmt;

/// One layer's line.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `0`, `1`, ... (the layer's name in the `state_dict`).
    pub name: String,
    /// The layer as PyTorch prints it (`Linear(in_features=4, ...)`).
    pub layer: String,
    pub output: Vec<usize>,
    pub params: usize,
    /// Parameters that require grad.
    pub trainable: usize,
}

/// The summary of a model on one input.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub input: Vec<usize>,
    pub rows: Vec<Row>,
    pub total_params: usize,
    pub trainable_params: usize,
}

/// Runs `input` through `model` layer by layer, in eval mode under
/// `no_grad` (so BatchNorm's running statistics do not move and no random
/// numbers are drawn), and restores the model's mode.
pub fn summary(model: &Sequential, input: &Tensor) -> Result<Summary> {
    let was_training = model.is_training();
    model.eval();
    let rows = {
        let _g = autograd::no_grad();
        layer_rows(model, input)
    };
    if was_training {
        model.train();
    }
    let rows = rows?;
    let params = model.parameters();
    Ok(Summary {
        input: input.dims().to_vec(),
        total_params: params.iter().map(|p| p.numel()).sum(),
        trainable_params: params
            .iter()
            .filter(|p| p.requires_grad())
            .map(|p| p.numel())
            .sum(),
        rows,
    })
}

fn layer_rows(model: &Sequential, input: &Tensor) -> Result<Vec<Row>> {
    let mut x = input.clone();
    let mut rows = vec![];
    for i in 0..model.len() {
        let layer = model.get(i).expect("index below len");
        x = layer.forward(&x)?;
        let ps = params_of(layer);
        rows.push(Row {
            name: i.to_string(),
            layer: layer.describe(),
            output: x.dims().to_vec(),
            params: ps.iter().map(|p| p.numel()).sum(),
            trainable: ps
                .iter()
                .filter(|p| p.requires_grad())
                .map(|p| p.numel())
                .sum(),
        });
    }
    Ok(rows)
}

/// Every parameter of `m` and its descendants.
fn params_of(m: &dyn Module) -> Vec<Tensor> {
    let mut out = vec![];
    m.visit(&mut |e| match e {
        Entry::Param(_, t) => out.push(t.clone()),
        Entry::Child(_, c) => out.extend(params_of(c)),
        Entry::Buffer(..) => {}
    });
    out
}

fn dims(d: &[usize]) -> String {
    let inner: Vec<String> = d.iter().map(usize::to_string).collect();
    format!("[{}]", inner.join(", "))
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layers: Vec<String> = self
            .rows
            .iter()
            .map(|r| format!("({}) {}", r.name, r.layer))
            .collect();
        let w = layers.iter().map(String::len).max().unwrap_or(0).max(5);
        let rule = "-".repeat(w + 32);
        writeln!(f, "{rule}")?;
        writeln!(
            f,
            "{:<w$}  {:>18}  {:>10}",
            "Layer", "Output shape", "Params"
        )?;
        writeln!(f, "{rule}")?;
        writeln!(f, "{:<w$}  {:>18}  {:>10}", "input", dims(&self.input), "")?;
        for (r, name) in self.rows.iter().zip(&layers) {
            writeln!(f, "{name:<w$}  {:>18}  {:>10}", dims(&r.output), r.params)?;
        }
        writeln!(f, "{rule}")?;
        writeln!(f, "Total params: {}", self.total_params)?;
        writeln!(f, "Trainable params: {}", self.trainable_params)?;
        writeln!(
            f,
            "Non-trainable params: {}",
            self.total_params - self.trainable_params
        )?;
        write!(f, "{rule}")
    }
}
