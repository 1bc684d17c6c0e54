//! `torch.optim.NAdam`: Adam with Nesterov momentum (the momentum-decay
//! schedule `mu_t`), L2 or decoupled weight decay.

use super::adamax::check_betas;
use super::core::{
    add_scalar, bump_step, decayed, lerp, non_negative, scalar_state, scale,
    single_tensor_optimizer, state_or, ParamState,
};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::{BinaryOp, Result};

/// NAdam's constructor arguments (PyTorch's defaults: `lr` 2e-3,
/// `momentum_decay` 4e-3).
#[derive(Clone, Debug)]
pub struct NadamConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum_decay: f64,
    /// AdamW-style decay (`p *= 1 - lr * weight_decay`) instead of L2.
    pub decoupled_weight_decay: bool,
    pub maximize: bool,
}

impl Default for NadamConfig {
    fn default() -> Self {
        NadamConfig {
            lr: 2e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            momentum_decay: 4e-3,
            decoupled_weight_decay: false,
            maximize: false,
        }
    }
}

impl NadamConfig {
    fn dict(&self) -> Result<Dict> {
        check_betas("NAdam", self.betas)?;
        non_negative("NAdam", "learning rate", self.lr)?;
        non_negative("NAdam", "epsilon value", self.eps)?;
        non_negative("NAdam", "weight_decay value", self.weight_decay)?;
        non_negative("NAdam", "momentum_decay value", self.momentum_decay)?;
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("betas", self.betas)
            .with("eps", self.eps)
            .with("weight_decay", self.weight_decay)
            .with("momentum_decay", self.momentum_decay)
            .with("decoupled_weight_decay", self.decoupled_weight_decay)
            .with("maximize", self.maximize)
            .options)
    }
}

single_tensor_optimizer!(
    /// NAdam (the single-tensor path of `torch.optim.NAdam`); state
    /// `exp_avg`, `exp_avg_sq`, `mu_product`, `step`.
    ///
    /// ```
    /// use kiln_frontend::optim::{NAdam, NadamConfig, Optimizer};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = NAdam::with_params(vec![w.clone()], NadamConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    /// opt.step().unwrap();
    /// assert!(w.to_f64_vec()[0] < 1.0);
    /// assert!(opt.state(&w).unwrap().contains_key("mu_product"));
    /// ```
    NAdam,
    NadamConfig,
    update
);

/// `beta1 * (1 - 0.5 * 0.96^(step * momentum_decay))`.
fn mu(b1: f64, step: f64, decay: f64) -> f64 {
    b1 * (1.0 - 0.5 * 0.96f64.powf(step * decay))
}

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, eps, decay) = (g.f64("lr")?, g.f64("eps")?, g.f64("momentum_decay")?);
    let (b1, b2) = g.betas()?;
    let m0 = state_or(st, "exp_avg", p, 0.0)?;
    let v0 = state_or(st, "exp_avg_sq", p, 0.0)?;
    let step = bump_step(st)?;
    let (param, grad) = decayed(g, p, grad, g.bool("decoupled_weight_decay")?)?;
    let (mu_t, mu_next) = (mu(b1, step, decay), mu(b1, step + 1.0, decay));
    // kept as PyTorch keeps it: a float32 scalar tensor
    let mu_product = (scalar_state(st, "mu_product", 1.0)? * mu_t) as f32 as f64;
    st.insert("mu_product".into(), Tensor::scalar(mu_product as f32));
    let m = lerp(&m0, &grad, 1.0 - b1)?;
    let v = scale(&v0, b2)?.add_scaled(&grad.mul(&grad)?, 1.0 - b2, false)?;
    let bc2 = 1.0 - b2.powf(step);
    let denom = add_scalar(&v.binary_scalar(BinaryOp::Div, bc2, false)?.sqrt()?, eps)?;
    let new_p = param
        .add_scaled(
            &grad.div(&denom)?,
            lr * (1.0 - mu_t) / (1.0 - mu_product),
            true,
        )?
        .add_scaled(
            &m.div(&denom)?,
            lr * mu_next / (1.0 - mu_product * mu_next),
            true,
        )?;
    st.insert("exp_avg".into(), m);
    st.insert("exp_avg_sq".into(), v);
    p.copy_(&new_p)
}
