//! What every optimizer shares: its parameter groups, its defaults, the
//! per-parameter state (PyTorch's names), and `state_dict` / `load_state_dict`.

use super::group::{Dict, ParamGroup, Value};
use crate::{autograd, Tensor};
use kiln_ir::{bail, BinaryOp, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One parameter's optimizer state: `exp_avg`, `momentum_buffer`, `step`, ...
pub type ParamState = BTreeMap<String, Tensor>;

/// `optimizer.state_dict()`: per-parameter state keyed by the parameter's
/// index (counting through the groups in order, as PyTorch packs it), and
/// one hyper-parameter dict per group whose `params` lists those indices.
#[derive(Clone, Debug, Default)]
pub struct OptimizerStateDict {
    pub state: BTreeMap<usize, ParamState>,
    pub param_groups: Vec<Dict>,
}

/// The shared body of every optimizer (reached through [`super::Optimizer`]).
#[doc(hidden)]
pub struct OptimCore {
    name: &'static str,
    pub(crate) groups: Vec<ParamGroup>,
    pub(crate) defaults: Dict,
    state: HashMap<usize, ParamState>,
}

/// Identity of a parameter: its autograd slot (shared by clones), else its data.
fn key(p: &Tensor) -> usize {
    match &p.autograd {
        Some(m) => Arc::as_ptr(m) as *const u8 as usize,
        None => (Arc::as_ptr(&p.storage) as *const u8 as usize) ^ (p.offset() << 1),
    }
}

impl OptimCore {
    pub(crate) fn new(name: &'static str, groups: Vec<ParamGroup>, defaults: Dict) -> Result<Self> {
        if groups.is_empty() {
            bail!(name, "optimizer got an empty parameter list");
        }
        let mut core = OptimCore {
            name,
            groups: vec![],
            defaults,
            state: HashMap::new(),
        };
        for g in groups {
            core.add_group(g)?;
        }
        Ok(core)
    }

    /// `add_param_group`: fills missing hyper-parameters from the defaults.
    pub(crate) fn add_group(&mut self, mut g: ParamGroup) -> Result<()> {
        for (k, v) in &self.defaults {
            g.options.entry(k.clone()).or_insert_with(|| v.clone());
        }
        let seen: std::collections::HashSet<usize> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(key))
            .collect();
        if g.params.iter().any(|p| seen.contains(&key(p))) {
            bail!(
                self.name,
                "some parameters appear in more than one parameter group"
            );
        }
        self.groups.push(g);
        Ok(())
    }

    pub(crate) fn state_of(&self, p: &Tensor) -> Option<&ParamState> {
        self.state.get(&key(p))
    }

    /// Runs `update(group, param, grad, state)` under `no_grad` for every
    /// parameter that has a gradient.
    pub(crate) fn update(
        &mut self,
        mut update: impl FnMut(&ParamGroup, &Tensor, &Tensor, &mut ParamState) -> Result<()>,
    ) -> Result<()> {
        let _g = autograd::no_grad();
        for group in &self.groups {
            for p in &group.params {
                let Some(grad) = p.grad() else { continue };
                if grad.dims() != p.dims() {
                    bail!(
                        self.name,
                        "gradient shape {:?} does not match parameter shape {:?}",
                        grad.dims(),
                        p.dims()
                    );
                }
                let st = self.state.entry(key(p)).or_default();
                update(group, p, &grad, st)?;
            }
        }
        Ok(())
    }

    pub(crate) fn zero_grad(&mut self) {
        for g in &self.groups {
            for p in &g.params {
                p.set_grad(None);
            }
        }
    }

    pub(crate) fn state_dict(&self) -> OptimizerStateDict {
        let mut sd = OptimizerStateDict::default();
        let mut idx = 0usize;
        for g in &self.groups {
            let mut d = g.options.clone();
            let mut ids = vec![];
            for p in &g.params {
                if let Some(st) = self.state.get(&key(p)) {
                    let copy = st
                        .iter()
                        .map(|(k, t)| (k.clone(), t.copy().expect("copy of optimizer state")))
                        .collect();
                    sd.state.insert(idx, copy);
                }
                ids.push(idx as i64);
                idx += 1;
            }
            d.insert("params".into(), Value::Ints(ids));
            sd.param_groups.push(d);
        }
        sd
    }

    pub(crate) fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> Result<()> {
        let name = self.name;
        if sd.param_groups.len() != self.groups.len() {
            bail!(
                name,
                "loaded state dict has {} parameter groups, the optimizer has {}",
                sd.param_groups.len(),
                self.groups.len()
            );
        }
        let mut by_index = vec![];
        for (i, (saved, g)) in sd.param_groups.iter().zip(&self.groups).enumerate() {
            let ids = match saved.get("params") {
                Some(Value::Ints(ids)) => ids.clone(),
                _ => bail!(name, "loaded parameter group {i} has no 'params' list"),
            };
            if ids.len() != g.params.len() {
                bail!(
                    name,
                    "loaded state dict contains a parameter group ({i}) with {} parameters, \
                     the optimizer's has {}",
                    ids.len(),
                    g.params.len()
                );
            }
            by_index.extend(ids.into_iter().zip(g.params.iter().cloned()));
        }
        let mut state = HashMap::new();
        for (id, p) in &by_index {
            if let Some(st) = sd.state.get(&(*id as usize)) {
                let mut copy = ParamState::new();
                for (k, t) in st {
                    let t = if k == "step" || !p.dtype().is_float() {
                        t.copy()?
                    } else {
                        t.to_dtype(p.dtype())?.copy()?
                    };
                    if k != "step" && t.dims() != p.dims() {
                        bail!(
                            name,
                            "state '{k}' of parameter {id} has shape {:?}, the parameter {:?}",
                            t.dims(),
                            p.dims()
                        );
                    }
                    copy.insert(k.clone(), t);
                }
                state.insert(key(p), copy);
            }
        }
        for (saved, g) in sd.param_groups.iter().zip(self.groups.iter_mut()) {
            let mut opts = saved.clone();
            opts.remove("params");
            g.options = opts;
        }
        self.state = state;
        Ok(())
    }
}

// ---- small tensor helpers for the update rules (f32/f64 math as PyTorch's kernels) ----

pub(crate) fn scale(t: &Tensor, s: f64) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Mul, s, false)
}

pub(crate) fn add_scalar(t: &Tensor, s: f64) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Add, s, false)
}

/// `torch.lerp(a, b, w)` with PyTorch's two-sided formula.
pub(crate) fn lerp(a: &Tensor, b: &Tensor, w: f64) -> Result<Tensor> {
    let diff = b.sub(a)?;
    if w.abs() < 0.5 {
        a.add_scaled(&diff, w, false)
    } else {
        b.add_scaled(&diff, 1.0 - w, true)
    }
}

/// A fresh state tensor shaped like `p` filled with `v`, on `p`'s device (as
/// `torch.zeros_like` places it), so a model moved to a GPU keeps its
/// optimizer state there too.
pub(crate) fn full_like(p: &Tensor, v: f64) -> Result<Tensor> {
    let t = Tensor::full(p.dims(), v, p.dtype());
    if p.device().is_cuda() {
        t.to_device(p.device())
    } else {
        Ok(t)
    }
}

/// The `step` counter as PyTorch keeps it: a 0-dim float32 tensor.
pub(crate) fn bump_step(st: &mut ParamState) -> Result<f64> {
    let s = match st.get("step") {
        Some(t) => t.item()?,
        None => 0.0,
    } + 1.0;
    st.insert("step".into(), Tensor::scalar(s as f32));
    Ok(s)
}
