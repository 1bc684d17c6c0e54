//! Parameter groups and the loosely typed values optimizers and schedulers
//! keep by PyTorch's names (`param_groups[i]["lr"]`, a scheduler's `last_epoch`).

use crate::Tensor;
use kiln_ir::{bail, Result};
use std::collections::BTreeMap;

/// One hyper-parameter or state entry, as a Python value would be.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A tuple or list of numbers (`betas`, `base_lrs`).
    Floats(Vec<f64>),
    Ints(Vec<i64>),
    Str(String),
    /// Nested states (SequentialLR's sub-schedulers).
    List(Vec<Dict>),
}

/// A name -> value map, like a Python dict of hyper-parameters or state.
pub type Dict = BTreeMap<String, Value>;

impl Value {
    /// The number (an `Int` converts, as Python would).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_floats(&self) -> Option<&[f64]> {
        match self {
            Value::Floats(v) => Some(v),
            _ => None,
        }
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<(f64, f64)> for Value {
    fn from(v: (f64, f64)) -> Self {
        Value::Floats(vec![v.0, v.1])
    }
}
impl From<Vec<f64>> for Value {
    fn from(v: Vec<f64>) -> Self {
        Value::Floats(v)
    }
}
impl From<Vec<i64>> for Value {
    fn from(v: Vec<i64>) -> Self {
        Value::Ints(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}

/// Reads a typed entry of a state dict, with an error naming the key.
pub(crate) fn get_f64(d: &Dict, owner: &str, key: &str) -> Result<f64> {
    match d.get(key).and_then(Value::as_f64) {
        Some(v) => Ok(v),
        None => bail!(owner, "state has no number under key '{key}'"),
    }
}
pub(crate) fn get_i64(d: &Dict, owner: &str, key: &str) -> Result<i64> {
    match d.get(key).and_then(Value::as_i64) {
        Some(v) => Ok(v),
        None => bail!(owner, "state has no integer under key '{key}'"),
    }
}
pub(crate) fn get_floats(d: &Dict, owner: &str, key: &str) -> Result<Vec<f64>> {
    match d.get(key).and_then(Value::as_floats) {
        Some(v) => Ok(v.to_vec()),
        None => bail!(owner, "state has no list of numbers under key '{key}'"),
    }
}

/// `{"params": [...], "lr": ..., ...}`: parameters sharing hyper-parameters.
///
/// Keys not given here are filled from the optimizer's defaults when the
/// group is added, as `torch.optim` does.
///
/// ```
/// use kiln_frontend::{optim::ParamGroup, DType, Tensor};
/// let w = Tensor::zeros(&[3], DType::F32).requires_grad_(true);
/// let g = ParamGroup::new(vec![w]).with("lr", 0.01);
/// assert_eq!(g.lr(), 0.01);
/// ```
#[derive(Clone, Debug)]
pub struct ParamGroup {
    pub params: Vec<Tensor>,
    /// Hyper-parameters under PyTorch's names (`lr`, `momentum`, `betas`, ...).
    pub options: Dict,
}

impl ParamGroup {
    pub fn new(params: Vec<Tensor>) -> ParamGroup {
        ParamGroup {
            params,
            options: Dict::new(),
        }
    }

    /// Sets one hyper-parameter (builder style).
    pub fn with(mut self, key: &str, v: impl Into<Value>) -> ParamGroup {
        self.options.insert(key.to_string(), v.into());
        self
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.options.get(key)
    }

    pub fn set(&mut self, key: &str, v: impl Into<Value>) {
        self.options.insert(key.to_string(), v.into());
    }

    /// The group's learning rate (NaN if it has none yet).
    pub fn lr(&self) -> f64 {
        self.get("lr").and_then(Value::as_f64).unwrap_or(f64::NAN)
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.set("lr", lr);
    }

    /// A number hyper-parameter; an error naming the key when absent.
    pub fn f64(&self, key: &str) -> Result<f64> {
        get_f64(&self.options, "param_group", key)
    }

    /// A flag hyper-parameter; an error naming the key when absent.
    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.get(key).and_then(Value::as_bool) {
            Some(b) => Ok(b),
            None => bail!("param_group", "no flag under key '{key}'"),
        }
    }

    /// `betas` as a pair; an error when absent.
    pub fn betas(&self) -> Result<(f64, f64)> {
        match self.get("betas").and_then(Value::as_floats) {
            Some([b1, b2]) => Ok((*b1, *b2)),
            _ => bail!("param_group", "no pair under key 'betas'"),
        }
    }

    /// The momentum a scheduler cycles: `betas[0]` for Adam-like optimizers,
    /// else `momentum`.
    pub fn momentum(&self) -> Option<f64> {
        match self.get("betas").and_then(Value::as_floats) {
            Some(b) if !b.is_empty() => Some(b[0]),
            _ => self.get("momentum").and_then(Value::as_f64),
        }
    }

    /// Sets `betas[0]` when the group has betas, else `momentum`.
    pub fn set_momentum(&mut self, m: f64) {
        if let Some(Value::Floats(b)) = self.options.get_mut("betas") {
            if !b.is_empty() {
                b[0] = m;
                return;
            }
        }
        self.set("momentum", m);
    }
}
