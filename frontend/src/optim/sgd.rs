//! `torch.optim.SGD`: momentum, dampening, nesterov, weight decay, maximize,
//! and the fused step.

use super::core::{scale, OptimCore, ParamState};
use super::fused;
use super::group::{Dict, ParamGroup};
use super::Optimizer;
use crate::Tensor;
use kiln_ir::{bail, Result};

/// SGD's constructor arguments (PyTorch's defaults; `lr` 1e-3).
#[derive(Clone, Debug)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
    /// One multi-output kernel per parameter, compiled once per dtype
    /// (see `fused.rs`; what it does not cover runs the eager formula).
    pub fused: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            fused: false,
        }
    }
}

impl SgdConfig {
    fn dict(&self) -> Dict {
        ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("momentum", self.momentum)
            .with("dampening", self.dampening)
            .with("weight_decay", self.weight_decay)
            .with("nesterov", self.nesterov)
            .with("maximize", self.maximize)
            .with("fused", self.fused)
            .options
    }
}

/// Stochastic gradient descent (the single-tensor path of `torch.optim.SGD`).
///
/// ```
/// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
/// use kiln_frontend::{DType, Tensor};
/// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
/// let mut opt = SGD::with_params(vec![w.clone()], SgdConfig { lr: 0.5, ..Default::default() }).unwrap();
/// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
/// opt.step().unwrap();
/// assert_eq!(w.to_f64_vec(), vec![0.5, 0.5]);
/// ```
pub struct SGD {
    core: OptimCore,
}

impl SGD {
    /// `SGD(param_groups, **defaults)`: each group may override any default.
    pub fn new(groups: Vec<ParamGroup>, defaults: SgdConfig) -> Result<SGD> {
        let d = &defaults;
        if d.lr < 0.0 || d.momentum < 0.0 || d.weight_decay < 0.0 {
            bail!(
                "SGD",
                "invalid lr {}, momentum {} or weight_decay {}",
                d.lr,
                d.momentum,
                d.weight_decay
            );
        }
        if d.nesterov && (d.momentum <= 0.0 || d.dampening != 0.0) {
            bail!(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening"
            );
        }
        Ok(SGD {
            core: OptimCore::new("SGD", groups, defaults.dict())?,
        })
    }

    /// `SGD(params, ...)`: one group holding every parameter.
    pub fn with_params(params: Vec<Tensor>, cfg: SgdConfig) -> Result<SGD> {
        SGD::new(vec![ParamGroup::new(params)], cfg)
    }
}

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, momentum, dampening) = (g.f64("lr")?, g.f64("momentum")?, g.f64("dampening")?);
    let wd = g.f64("weight_decay")?;
    let mut d = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    if wd != 0.0 {
        d = d.add_scaled(p, wd, false)?;
    }
    if momentum != 0.0 {
        let buf = match st.get("momentum_buffer") {
            None => d.copy()?,
            Some(b) => scale(b, momentum)?.add_scaled(&d, 1.0 - dampening, false)?,
        };
        st.insert("momentum_buffer".into(), buf.clone());
        d = if g.bool("nesterov")? {
            d.add_scaled(&buf, momentum, false)?
        } else {
            buf
        };
    }
    p.copy_(&p.add_scaled(&d, lr, true)?)
}

impl Optimizer for SGD {
    fn step(&mut self) -> Result<()> {
        self.core.update(|g, p, grad, st| {
            if fused::wanted(g) && fused::sgd(g, p, grad, st)? {
                return Ok(());
            }
            update(g, p, grad, st)
        })
    }
    fn core(&self) -> &OptimCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut OptimCore {
        &mut self.core
    }
}
