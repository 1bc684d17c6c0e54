//! `torch.optim.RAdam`: Adam whose adaptive step is rectified once the
//! variance estimate is tractable (rho_t > 5), plain momentum SGD before.

use super::adamax::check_betas;
use super::core::{
    add_scalar, bump_step, decayed, lerp, non_negative, scale, single_tensor_optimizer, state_or,
    ParamState,
};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::Result;

/// RAdam's constructor arguments (PyTorch's defaults: `lr` 1e-3).
#[derive(Clone, Debug)]
pub struct RadamConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW-style decay (`p *= 1 - lr * weight_decay`) instead of L2.
    pub decoupled_weight_decay: bool,
    pub maximize: bool,
}

impl Default for RadamConfig {
    fn default() -> Self {
        RadamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
            maximize: false,
        }
    }
}

impl RadamConfig {
    fn dict(&self) -> Result<Dict> {
        check_betas("RAdam", self.betas)?;
        non_negative("RAdam", "learning rate", self.lr)?;
        non_negative("RAdam", "epsilon value", self.eps)?;
        non_negative("RAdam", "weight_decay value", self.weight_decay)?;
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("betas", self.betas)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("decoupled_weight_decay", self.decoupled_weight_decay)
            .with("maximize", self.maximize)
            .options)
    }
}

single_tensor_optimizer!(
    /// RAdam (the single-tensor path of `torch.optim.RAdam`); state
    /// `exp_avg`, `exp_avg_sq`, `step`.
    ///
    /// ```
    /// use kiln_frontend::optim::{Optimizer, RAdam, RadamConfig};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = RAdam::with_params(vec![w.clone()], RadamConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    /// opt.step().unwrap();
    /// // step 1 is not rectified: p -= lr * exp_avg / (1 - beta1) = lr * grad
    /// assert!((w.to_f64_vec()[0] - (1.0 - 1e-3)).abs() < 1e-6);
    /// ```
    RAdam,
    RadamConfig,
    update
);

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, eps) = (g.f64("lr")?, g.f64("eps")?);
    let (b1, b2) = g.betas()?;
    let m0 = state_or(st, "exp_avg", p, 0.0)?;
    let v0 = state_or(st, "exp_avg_sq", p, 0.0)?;
    let step = bump_step(st)?;
    let (param, grad) = decayed(g, p, grad, g.bool("decoupled_weight_decay")?)?;
    let m = lerp(&m0, &grad, 1.0 - b1)?;
    let v = scale(&v0, b2)?.add_scaled(&grad.mul(&grad)?, 1.0 - b2, false)?;
    let (bc1, bc2) = (1.0 - b1.powf(step), 1.0 - b2.powf(step));
    let m_hat = scale(&m, 1.0 / bc1)?;
    let rho_inf = 2.0 / (1.0 - b2) - 1.0;
    let rho_t = rho_inf - 2.0 * step * b2.powf(step) / bc2;
    let update = if rho_t > 5.0 {
        let rect = ((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
            / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
            .sqrt();
        let adaptive = add_scalar(&v.sqrt()?, eps)?.reciprocal()?;
        scale(&m_hat.mul(&adaptive)?, lr * bc2.sqrt() * rect)?
    } else {
        scale(&m_hat, lr)?
    };
    let new_p = param.sub(&update)?;
    st.insert("exp_avg".into(), m);
    st.insert("exp_avg_sq".into(), v);
    p.copy_(&new_p)
}
