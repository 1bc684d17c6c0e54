//! `torch.optim.Adam` (L2 weight decay, amsgrad) and `torch.optim.AdamW`
//! (decoupled weight decay): the single-tensor formulas.

use super::core::{add_scalar, bump_step, full_like, lerp, scale, OptimCore, ParamState};
use super::fused;
use super::group::{Dict, ParamGroup};
use super::Optimizer;
use crate::Tensor;
use kiln_ir::{bail, BinaryOp, Result};

/// Adam's / AdamW's constructor arguments. `Default` is Adam's
/// (`weight_decay` 0); [`AdamConfig::adamw`] gives AdamW's (`weight_decay` 1e-2).
#[derive(Clone, Debug)]
pub struct AdamConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub amsgrad: bool,
    pub maximize: bool,
    /// One multi-output kernel per parameter, compiled once per dtype
    /// (see `fused.rs`; amsgrad and what else it does not cover run the
    /// eager formula).
    pub fused: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            fused: false,
        }
    }
}

impl AdamConfig {
    /// AdamW's defaults (`weight_decay` 1e-2).
    pub fn adamw() -> Self {
        AdamConfig {
            weight_decay: 1e-2,
            ..Default::default()
        }
    }

    fn dict(&self, name: &str) -> Result<Dict> {
        let (b1, b2) = self.betas;
        if !(0.0..1.0).contains(&b1) || !(0.0..1.0).contains(&b2) {
            bail!(name, "invalid betas ({b1}, {b2}): each must be in [0, 1)");
        }
        if self.lr < 0.0 || self.eps < 0.0 || self.weight_decay < 0.0 {
            bail!(
                name,
                "invalid lr {}, eps {} or weight_decay {}",
                self.lr,
                self.eps,
                self.weight_decay
            );
        }
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("betas", self.betas)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("amsgrad", self.amsgrad)
            .with("maximize", self.maximize)
            .with("fused", self.fused)
            .options)
    }
}

/// Adam with L2 weight decay (added to the gradient).
pub struct Adam {
    core: OptimCore,
}

/// Adam with decoupled weight decay (`p *= 1 - lr * weight_decay`).
pub struct AdamW {
    core: OptimCore,
}

impl Adam {
    pub fn new(groups: Vec<ParamGroup>, defaults: AdamConfig) -> Result<Adam> {
        let d = defaults.dict("Adam")?;
        Ok(Adam {
            core: OptimCore::new("Adam", groups, d)?,
        })
    }
    pub fn with_params(params: Vec<Tensor>, cfg: AdamConfig) -> Result<Adam> {
        Adam::new(vec![ParamGroup::new(params)], cfg)
    }
}

impl AdamW {
    pub fn new(groups: Vec<ParamGroup>, defaults: AdamConfig) -> Result<AdamW> {
        let d = defaults.dict("AdamW")?;
        Ok(AdamW {
            core: OptimCore::new("AdamW", groups, d)?,
        })
    }
    pub fn with_params(params: Vec<Tensor>, cfg: AdamConfig) -> Result<AdamW> {
        AdamW::new(vec![ParamGroup::new(params)], cfg)
    }
}

fn update(
    decoupled: bool,
    g: &ParamGroup,
    p: &Tensor,
    grad: &Tensor,
    st: &mut ParamState,
) -> Result<()> {
    let (lr, eps, wd) = (g.f64("lr")?, g.f64("eps")?, g.f64("weight_decay")?);
    let (b1, b2) = g.betas()?;
    let amsgrad = g.bool("amsgrad")?;
    if !st.contains_key("exp_avg") {
        st.insert("exp_avg".into(), full_like(p, 0.0)?);
        st.insert("exp_avg_sq".into(), full_like(p, 0.0)?);
        if amsgrad {
            st.insert("max_exp_avg_sq".into(), full_like(p, 0.0)?);
        }
    }
    let step = bump_step(st)?;
    let mut grad = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    let mut param = p.clone();
    if wd != 0.0 {
        if decoupled {
            param = scale(&param, 1.0 - lr * wd)?;
        } else {
            grad = grad.add_scaled(&param, wd, false)?;
        }
    }
    let m = lerp(&st["exp_avg"], &grad, 1.0 - b1)?;
    let v = scale(&st["exp_avg_sq"], b2)?.add_scaled(&grad.mul(&grad)?, 1.0 - b2, false)?;
    let bc1 = 1.0 - b1.powf(step);
    let bc2 = 1.0 - b2.powf(step);
    let step_size = lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    let v_hat = if amsgrad {
        let prev = st
            .get("max_exp_avg_sq")
            .cloned()
            .map_or_else(|| full_like(p, 0.0), Ok)?;
        let mx = prev.maximum(&v)?;
        st.insert("max_exp_avg_sq".into(), mx.clone());
        mx
    } else {
        v.clone()
    };
    let sqrt = v_hat.sqrt()?;
    let denom = add_scalar(&sqrt.binary_scalar(BinaryOp::Div, bc2_sqrt, false)?, eps)?;
    let new_p = param.add_scaled(&m.div(&denom)?, step_size, true)?;
    st.insert("exp_avg".into(), m);
    st.insert("exp_avg_sq".into(), v);
    p.copy_(&new_p)
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        self.core.update(|g, p, grad, st| {
            if fused::wanted(g) && fused::adam(false, g, p, grad, st)? {
                return Ok(());
            }
            update(false, g, p, grad, st)
        })
    }
    fn core(&self) -> &OptimCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut OptimCore {
        &mut self.core
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) -> Result<()> {
        self.core.update(|g, p, grad, st| {
            if fused::wanted(g) && fused::adam(true, g, p, grad, st)? {
                return Ok(());
            }
            update(true, g, p, grad, st)
        })
    }
    fn core(&self) -> &OptimCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut OptimCore {
        &mut self.core
    }
}
