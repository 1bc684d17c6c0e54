//! `torch.optim.Adadelta`: steps scaled by the ratio of running RMS of
//! updates to running RMS of gradients.

use super::core::{
    add_scalar, bump_step, l2_grad, non_negative, scale, single_tensor_optimizer, state_or,
    ParamState,
};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// Adadelta's constructor arguments (PyTorch's defaults: `lr` 1, `rho` 0.9).
#[derive(Clone, Debug)]
pub struct AdadeltaConfig {
    pub lr: f64,
    pub rho: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub maximize: bool,
}

impl Default for AdadeltaConfig {
    fn default() -> Self {
        AdadeltaConfig {
            lr: 1.0,
            rho: 0.9,
            eps: 1e-6,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl AdadeltaConfig {
    fn dict(&self) -> Result<Dict> {
        if !(0.0..=1.0).contains(&self.rho) {
            bail!("Adadelta", "Invalid rho value: {}", self.rho);
        }
        non_negative("Adadelta", "learning rate", self.lr)?;
        non_negative("Adadelta", "epsilon value", self.eps)?;
        non_negative("Adadelta", "weight_decay value", self.weight_decay)?;
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("rho", self.rho)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("maximize", self.maximize)
            .options)
    }
}

single_tensor_optimizer!(
    /// Adadelta (the single-tensor path of `torch.optim.Adadelta`); state
    /// `square_avg`, `acc_delta`, `step`.
    ///
    /// ```
    /// use kiln_frontend::optim::{Adadelta, AdadeltaConfig, Optimizer};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = Adadelta::with_params(vec![w.clone()], AdadeltaConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    /// opt.step().unwrap();
    /// // delta = sqrt(eps) / sqrt(0.1 + eps) * grad
    /// let d = (1e-6f64).sqrt() / (0.1f64 + 1e-6).sqrt();
    /// assert!((w.to_f64_vec()[0] - (1.0 - d)).abs() < 1e-6);
    /// ```
    Adadelta,
    AdadeltaConfig,
    update
);

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, rho, eps) = (g.f64("lr")?, g.f64("rho")?, g.f64("eps")?);
    let sq0 = state_or(st, "square_avg", p, 0.0)?;
    let acc0 = state_or(st, "acc_delta", p, 0.0)?;
    bump_step(st)?;
    let grad = l2_grad(g, p, grad)?;
    let sq = scale(&sq0, rho)?.add_scaled(&grad.mul(&grad)?, 1.0 - rho, false)?;
    let std = add_scalar(&sq, eps)?.sqrt()?;
    let delta = add_scalar(&acc0, eps)?.sqrt()?.div(&std)?.mul(&grad)?;
    let acc = scale(&acc0, rho)?.add_scaled(&delta.mul(&delta)?, 1.0 - rho, false)?;
    let new_p = p.add_scaled(&delta, lr, true)?;
    st.insert("square_avg".into(), sq);
    st.insert("acc_delta".into(), acc);
    p.copy_(&new_p)
}
