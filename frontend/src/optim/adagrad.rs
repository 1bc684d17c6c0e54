//! `torch.optim.Adagrad`: lr decay, weight decay, initial accumulator, eps.

use super::core::{add_scalar, bump_step, full_like, OptimCore, ParamState};
use super::group::{Dict, ParamGroup};
use super::Optimizer;
use crate::Tensor;
use kiln_ir::{bail, Result};

/// Adagrad's constructor arguments (PyTorch's defaults; `lr` 1e-2).
#[derive(Clone, Debug)]
pub struct AdagradConfig {
    pub lr: f64,
    pub lr_decay: f64,
    pub weight_decay: f64,
    pub initial_accumulator_value: f64,
    pub eps: f64,
    pub maximize: bool,
}

impl Default for AdagradConfig {
    fn default() -> Self {
        AdagradConfig {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

impl AdagradConfig {
    fn dict(&self) -> Result<Dict> {
        if self.lr < 0.0 || self.lr_decay < 0.0 || self.weight_decay < 0.0 || self.eps < 0.0 {
            bail!(
                "Adagrad",
                "invalid lr {}, lr_decay {}, weight_decay {} or eps {}",
                self.lr,
                self.lr_decay,
                self.weight_decay,
                self.eps
            );
        }
        if self.initial_accumulator_value < 0.0 {
            bail!(
                "Adagrad",
                "invalid initial_accumulator_value {}",
                self.initial_accumulator_value
            );
        }
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("lr_decay", self.lr_decay)
            .with("weight_decay", self.weight_decay)
            .with("initial_accumulator_value", self.initial_accumulator_value)
            .with("eps", self.eps)
            .with("maximize", self.maximize)
            .options)
    }
}

/// Adagrad (the single-tensor path of `torch.optim.Adagrad`).
pub struct Adagrad {
    core: OptimCore,
}

impl Adagrad {
    pub fn new(groups: Vec<ParamGroup>, defaults: AdagradConfig) -> Result<Adagrad> {
        let d = defaults.dict()?;
        Ok(Adagrad {
            core: OptimCore::new("Adagrad", groups, d)?,
        })
    }
    pub fn with_params(params: Vec<Tensor>, cfg: AdagradConfig) -> Result<Adagrad> {
        Adagrad::new(vec![ParamGroup::new(params)], cfg)
    }
}

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, lr_decay, wd, eps) = (
        g.f64("lr")?,
        g.f64("lr_decay")?,
        g.f64("weight_decay")?,
        g.f64("eps")?,
    );
    if !st.contains_key("sum") {
        let init = g.f64("initial_accumulator_value")?;
        st.insert("sum".into(), full_like(p, init)?);
    }
    let step = bump_step(st)?;
    let mut grad = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    if wd != 0.0 {
        grad = grad.add_scaled(p, wd, false)?;
    }
    let clr = lr / (1.0 + (step - 1.0) * lr_decay);
    let sum = st["sum"].add(&grad.mul(&grad)?)?;
    let std = add_scalar(&sum.sqrt()?, eps)?;
    st.insert("sum".into(), sum);
    p.copy_(&p.add_scaled(&grad.div(&std)?, clr, true)?)
}

impl Optimizer for Adagrad {
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
