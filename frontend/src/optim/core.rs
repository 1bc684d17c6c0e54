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
                    // a 0-dim entry is a counter (`step`, NAdam's `mu_product`,
                    // ASGD's `eta`): kept as saved, like PyTorch's float32 scalars
                    let counter = k == "step" || (t.rank() == 0 && !p.dims().is_empty());
                    let t = if counter || !p.dtype().is_float() {
                        t.copy()?
                    } else {
                        t.to_dtype(p.dtype())?.copy()?
                    };
                    if !counter && t.dims() != p.dims() {
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

/// `-grad` under `maximize`, plus `weight_decay * p` (L2 decay, added to the
/// gradient) when the group has a nonzero `weight_decay`: how every
/// single-tensor rule starts.
pub(crate) fn l2_grad(g: &ParamGroup, p: &Tensor, grad: &Tensor) -> Result<Tensor> {
    Ok(decayed(g, p, grad, false)?.1)
}

/// The parameter and gradient a rule steps from: `-grad` under `maximize`,
/// then a nonzero `weight_decay` as L2 (`grad + wd * p`) or, `decoupled`,
/// AdamW's `p * (1 - lr * wd)` (NAdam's and RAdam's `decoupled_weight_decay`).
pub(crate) fn decayed(
    g: &ParamGroup,
    p: &Tensor,
    grad: &Tensor,
    decoupled: bool,
) -> Result<(Tensor, Tensor)> {
    let grad = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    Ok(match g.f64("weight_decay")? {
        0.0 => (p.clone(), grad),
        wd if decoupled => (scale(p, 1.0 - g.f64("lr")? * wd)?, grad),
        wd => (p.clone(), grad.add_scaled(p, wd, false)?),
    })
}

/// The state tensor `key`, created as `full_like(p, v)` on the first step.
pub(crate) fn state_or(st: &mut ParamState, key: &str, p: &Tensor, v: f64) -> Result<Tensor> {
    if !st.contains_key(key) {
        st.insert(key.into(), full_like(p, v)?);
    }
    Ok(st[key].clone())
}

/// A 0-dim float32 state value (`step`, NAdam's `mu_product`, ASGD's `eta`),
/// as PyTorch keeps them; `init` on the first step.
pub(crate) fn scalar_state(st: &ParamState, key: &str, init: f64) -> Result<f64> {
    st.get(key).map_or(Ok(init), |t| t.item())
}

/// Declares an optimizer over [`OptimCore`]: the struct, `new(groups,
/// defaults)`, `with_params(params, cfg)` and an [`super::Optimizer`] whose
/// step runs `update(group, param, grad, state)` on every parameter with a
/// gradient. `$cfg` must have `fn dict(&self) -> Result<Dict>` (its
/// validated defaults).
macro_rules! single_tensor_optimizer {
    ($(#[$doc:meta])* $name:ident, $cfg:ty, $update:path) => {
        $(#[$doc])*
        pub struct $name {
            core: $crate::optim::OptimCore,
        }

        impl $name {
            /// The optimizer over `groups`, missing hyper-parameters from `defaults`.
            pub fn new(
                groups: Vec<$crate::optim::ParamGroup>,
                defaults: $cfg,
            ) -> kiln_ir::Result<$name> {
                let d = defaults.dict()?;
                Ok($name {
                    core: $crate::optim::OptimCore::new(stringify!($name), groups, d)?,
                })
            }
            /// One group of `params` with the hyper-parameters of `cfg`.
            pub fn with_params(params: Vec<$crate::Tensor>, cfg: $cfg) -> kiln_ir::Result<$name> {
                $name::new(vec![$crate::optim::ParamGroup::new(params)], cfg)
            }
        }

        impl $crate::optim::Optimizer for $name {
            fn step(&mut self) -> kiln_ir::Result<()> {
                self.core.update($update)
            }
            fn core(&self) -> &$crate::optim::OptimCore {
                &self.core
            }
            fn core_mut(&mut self) -> &mut $crate::optim::OptimCore {
                &mut self.core
            }
        }
    };
}
pub(crate) use single_tensor_optimizer;

/// PyTorch's argument check: `value` must be at least 0.
pub(crate) fn non_negative(op: &str, what: &str, value: f64) -> Result<()> {
    if value.is_nan() || value < 0.0 {
        bail!(op, "Invalid {what}: {value}");
    }
    Ok(())
}
