//! A model summary in the style of `torchinfo.summary`: every layer the
//! forward pass of a sample batch runs, in call order, with its output shape
//! and parameter count; and [`activation_stats`], each layer's output mean
//! and standard deviation (the seeds' check for vanishing or exploding
//! signals before training). Both listen through forward hooks
//! (`kiln::nn::hooks`), so any model works — a `Sequential`, a
//! `#[derive(Module)]` struct, a zoo model: every standard layer and
//! container it runs reports, under its `state_dict` name.
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

use crate::nn::{hooks, Entry, Module, ModuleExt};
use crate::{autograd, Result, Tensor};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// One layer's line.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The layer's name in the `state_dict` (`0`, `features.3`, ...).
    pub name: String,
    /// The layer as PyTorch prints it (`Linear(in_features=4, ...)`).
    pub layer: String,
    /// How deep it sits in the model (1: a child of the model).
    pub depth: usize,
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

/// One layer's output statistics (see [`activation_stats`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ActivationStat {
    pub name: String,
    pub layer: String,
    pub mean: f64,
    pub std: f64,
}

/// Runs `input` through `model` once, in eval mode under `no_grad` (so
/// BatchNorm's running statistics do not move and no random numbers are
/// drawn), and restores the model's mode.
pub fn summary(model: &dyn Module, input: &Tensor) -> Result<Summary> {
    let rows = record(model, input, |row, _| Ok(row))?;
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

/// Each layer's output mean and (unbiased) standard deviation on `input`,
/// in call order, as [`summary`] runs it: a std shrinking layer by layer
/// towards 0 is a vanishing signal, one growing without bound an exploding
/// one.
///
/// ```
/// use kiln::nn::{Activation, Linear, Sequential};
/// let m = Sequential::new().add(Linear::new(8, 8, true).unwrap()).add(Activation::relu());
/// let stats = kiln::summary::activation_stats(&m, &kiln::random::randn(&[64, 8], None)).unwrap();
/// assert_eq!(stats.len(), 2);
/// assert!(stats[1].mean >= 0.0, "relu outputs are non-negative");
/// ```
pub fn activation_stats(model: &dyn Module, input: &Tensor) -> Result<Vec<ActivationStat>> {
    record(model, input, |row, out| {
        let x = out.to_dtype(crate::DType::F64)?.reshape(&[-1])?;
        let mean = x.mean(None, false)?.item()?;
        let std = if x.numel() > 1 {
            x.std(&[0], 1.0, false)?.item()?
        } else {
            f64::NAN
        };
        Ok(ActivationStat {
            name: row.name,
            layer: row.layer,
            mean,
            std,
        })
    })
}

/// Every module of `model` by its hook key, with its dotted name and depth.
fn names(model: &dyn Module) -> HashMap<hooks::Key, (String, usize)> {
    fn go(
        m: &dyn Module,
        name: String,
        depth: usize,
        out: &mut HashMap<hooks::Key, (String, usize)>,
    ) {
        let mut children = vec![];
        m.visit(&mut |e| {
            if let Entry::Child(n, c) = e {
                children.push((n.to_string(), c))
            }
        });
        out.entry(hooks::key(m)).or_insert((name.clone(), depth));
        for (n, c) in children {
            let full = if name.is_empty() {
                n
            } else {
                format!("{name}.{n}")
            };
            go(c, full, depth + 1, out);
        }
    }
    let mut out = HashMap::new();
    go(model, String::new(), 0, &mut out);
    out
}

/// Runs the model with hooks that make one `T` per layer call (the model
/// itself left out), from its row and its output.
fn record<T: Send + 'static>(
    model: &dyn Module,
    input: &Tensor,
    make: impl Fn(Row, &Tensor) -> Result<T> + Send + Sync + 'static,
) -> Result<Vec<T>> {
    let names = Arc::new(names(model));
    let me = std::thread::current().id();
    // a slot per layer call, in the order the calls start (torchinfo's
    // order: a container before its layers); the stack holds the open
    // calls' slots and rows
    let open: Arc<Mutex<Vec<Option<(usize, Row)>>>> = Arc::default();
    let done: Arc<Mutex<Vec<Option<T>>>> = Arc::default();
    let (n1, o1, d1) = (names.clone(), open.clone(), done.clone());
    let _pre = hooks::register_module_forward_pre_hook(move |m, _x| {
        if std::thread::current().id() != me {
            return Ok(());
        }
        let row = match n1.get(&hooks::key(m)) {
            Some((name, depth)) if *depth > 0 => {
                let ps = m.parameters();
                Some(Row {
                    name: name.clone(),
                    layer: m.describe(),
                    depth: *depth,
                    output: vec![],
                    params: ps.iter().map(|p| p.numel()).sum(),
                    trainable: ps
                        .iter()
                        .filter(|p| p.requires_grad())
                        .map(|p| p.numel())
                        .sum(),
                })
            }
            _ => None, // the model itself, or a module outside it
        };
        let slot = row.map(|r| {
            let mut d = d1.lock().unwrap_or_else(|e| e.into_inner());
            d.push(None);
            (d.len() - 1, r)
        });
        o1.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        Ok(())
    });
    let (o2, d2) = (open.clone(), done.clone());
    let _post = hooks::register_module_forward_hook(move |_m, _x, out| {
        if std::thread::current().id() != me {
            return Ok(None);
        }
        let row = o2.lock().unwrap_or_else(|e| e.into_inner()).pop().flatten();
        if let Some((slot, mut row)) = row {
            row.output = out.dims().to_vec();
            let t = make(row, out)?;
            d2.lock().unwrap_or_else(|e| e.into_inner())[slot] = Some(t);
        }
        Ok(None)
    });
    let was_training = model.is_training();
    model.eval();
    let ran = {
        let _g = autograd::no_grad();
        model.call(input)
    };
    if was_training {
        model.train();
    }
    ran?;
    drop((_pre, _post));
    let out = std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(out.into_iter().flatten().collect())
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
            .map(|r| format!("{}({}) {}", "  ".repeat(r.depth - 1), r.name, r.layer))
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
