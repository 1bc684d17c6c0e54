//! `torch.optim.RMSprop`: alpha, eps, weight decay, momentum, centered.

use super::core::{add_scalar, bump_step, full_like, lerp, scale, OptimCore, ParamState};
use super::group::{Dict, ParamGroup};
use super::Optimizer;
use crate::Tensor;
use kiln_ir::{bail, Result};

/// RMSprop's constructor arguments (PyTorch's defaults; `lr` 1e-2).
#[derive(Clone, Debug)]
pub struct RmspropConfig {
    pub lr: f64,
    pub alpha: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub centered: bool,
    pub maximize: bool,
}

impl Default for RmspropConfig {
    fn default() -> Self {
        RmspropConfig {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

impl RmspropConfig {
    fn dict(&self) -> Result<Dict> {
        if self.lr < 0.0 || self.eps < 0.0 || self.momentum < 0.0 || self.alpha < 0.0 {
            bail!(
                "RMSprop",
                "invalid lr {}, eps {}, momentum {} or alpha {}",
                self.lr,
                self.eps,
                self.momentum,
                self.alpha
            );
        }
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("alpha", self.alpha)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("momentum", self.momentum)
            .with("centered", self.centered)
            .with("maximize", self.maximize)
            .options)
    }
}

/// RMSprop (the single-tensor path of `torch.optim.RMSprop`).
pub struct RMSprop {
    core: OptimCore,
}

impl RMSprop {
    pub fn new(groups: Vec<ParamGroup>, defaults: RmspropConfig) -> Result<RMSprop> {
        let d = defaults.dict()?;
        Ok(RMSprop {
            core: OptimCore::new("RMSprop", groups, d)?,
        })
    }
    pub fn with_params(params: Vec<Tensor>, cfg: RmspropConfig) -> Result<RMSprop> {
        RMSprop::new(vec![ParamGroup::new(params)], cfg)
    }
}

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, alpha, eps) = (g.f64("lr")?, g.f64("alpha")?, g.f64("eps")?);
    let (wd, momentum, centered) = (
        g.f64("weight_decay")?,
        g.f64("momentum")?,
        g.bool("centered")?,
    );
    if !st.contains_key("square_avg") {
        st.insert("square_avg".into(), full_like(p, 0.0)?);
        if momentum > 0.0 {
            st.insert("momentum_buffer".into(), full_like(p, 0.0)?);
        }
        if centered {
            st.insert("grad_avg".into(), full_like(p, 0.0)?);
        }
    }
    bump_step(st)?;
    let mut grad = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    if wd != 0.0 {
        grad = grad.add_scaled(p, wd, false)?;
    }
    let sq = scale(&st["square_avg"], alpha)?.add_scaled(&grad.mul(&grad)?, 1.0 - alpha, false)?;
    let avg = if centered {
        let prev = st
            .get("grad_avg")
            .cloned()
            .map_or_else(|| full_like(p, 0.0), Ok)?;
        let ga = lerp(&prev, &grad, 1.0 - alpha)?;
        let a = sq.sub(&ga.mul(&ga)?)?.sqrt()?;
        st.insert("grad_avg".into(), ga);
        a
    } else {
        sq.sqrt()?
    };
    let avg = add_scalar(&avg, eps)?;
    st.insert("square_avg".into(), sq);
    let new_p = if momentum > 0.0 {
        let prev = st
            .get("momentum_buffer")
            .cloned()
            .map_or_else(|| full_like(p, 0.0), Ok)?;
        let buf = scale(&prev, momentum)?.add(&grad.div(&avg)?)?;
        st.insert("momentum_buffer".into(), buf.clone());
        p.add_scaled(&buf, lr, true)?
    } else {
        p.add_scaled(&grad.div(&avg)?, lr, true)?
    };
    p.copy_(&new_p)
}

impl Optimizer for RMSprop {
    fn step(&mut self) -> Result<()> {
        self.core.update(update)
    }
    fn core(&self) -> &OptimCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut OptimCore {
        &mut self.core
    }
}
