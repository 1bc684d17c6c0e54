//! `torch.optim.Adamax`: Adam with the infinity norm of past gradients.

use super::core::{
    bump_step, l2_grad, lerp, non_negative, scale, single_tensor_optimizer, state_or, ParamState,
};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// Adamax's constructor arguments (PyTorch's defaults: `lr` 2e-3).
#[derive(Clone, Debug)]
pub struct AdamaxConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub maximize: bool,
}

impl Default for AdamaxConfig {
    fn default() -> Self {
        AdamaxConfig {
            lr: 2e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl AdamaxConfig {
    fn dict(&self) -> Result<Dict> {
        check_betas("Adamax", self.betas)?;
        for (what, v) in [("learning rate", self.lr), ("epsilon value", self.eps)] {
            non_negative("Adamax", what, v)?;
        }
        non_negative("Adamax", "weight_decay value", self.weight_decay)?;
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("betas", self.betas)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("maximize", self.maximize)
            .options)
    }
}

/// PyTorch's check of Adam-style `betas`: each in [0, 1).
pub(crate) fn check_betas(op: &str, (b1, b2): (f64, f64)) -> Result<()> {
    for (i, b) in [(0, b1), (1, b2)] {
        if !(0.0..1.0).contains(&b) {
            bail!(op, "Invalid beta parameter at index {i}: {b}");
        }
    }
    Ok(())
}

single_tensor_optimizer!(
    /// Adamax (the single-tensor path of `torch.optim.Adamax`); state
    /// `exp_avg`, `exp_inf`, `step`.
    ///
    /// ```
    /// use kiln_frontend::optim::{Adamax, AdamaxConfig, Optimizer};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = Adamax::with_params(vec![w.clone()], AdamaxConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    /// opt.step().unwrap();
    /// // first step: exp_avg / (1 - beta1) = grad, exp_inf = |grad| + eps
    /// assert!((w.to_f64_vec()[0] - (1.0 - 2e-3)).abs() < 1e-6);
    /// ```
    Adamax,
    AdamaxConfig,
    update
);

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, eps) = (g.f64("lr")?, g.f64("eps")?);
    let (b1, b2) = g.betas()?;
    let m0 = state_or(st, "exp_avg", p, 0.0)?;
    let u0 = state_or(st, "exp_inf", p, 0.0)?;
    let step = bump_step(st)?;
    let grad = l2_grad(g, p, grad)?;
    let m = lerp(&m0, &grad, 1.0 - b1)?;
    let u = scale(&u0, b2)?.maximum(&super::core::add_scalar(&grad.abs()?, eps)?)?;
    let clr = lr / (1.0 - b1.powf(step));
    let new_p = p.add_scaled(&m.div(&u)?, clr, true)?;
    st.insert("exp_avg".into(), m);
    st.insert("exp_inf".into(), u);
    p.copy_(&new_p)
}
