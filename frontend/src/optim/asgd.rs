//! `torch.optim.ASGD`: SGD with a decaying step `eta` and a running
//! average `ax` of the iterates (from step `t0` on).

use super::core::{
    bump_step, l2_grad, non_negative, scalar_state, scale, single_tensor_optimizer, state_or,
    ParamState,
};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::Result;

/// ASGD's constructor arguments (PyTorch's defaults: `lr` 1e-2, `lambd`
/// 1e-4, `alpha` 0.75, `t0` 1e6).
#[derive(Clone, Debug)]
pub struct AsgdConfig {
    pub lr: f64,
    /// Decay term.
    pub lambd: f64,
    /// Power of the `eta` update.
    pub alpha: f64,
    /// The step at which averaging starts.
    pub t0: f64,
    pub weight_decay: f64,
    pub maximize: bool,
}

impl Default for AsgdConfig {
    fn default() -> Self {
        AsgdConfig {
            lr: 1e-2,
            lambd: 1e-4,
            alpha: 0.75,
            t0: 1e6,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl AsgdConfig {
    fn dict(&self) -> Result<Dict> {
        non_negative("ASGD", "learning rate", self.lr)?;
        non_negative("ASGD", "weight_decay value", self.weight_decay)?;
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("lambd", self.lambd)
            .with("alpha", self.alpha)
            .with("t0", self.t0)
            .with("weight_decay", self.weight_decay)
            .with("maximize", self.maximize)
            .options)
    }
}

single_tensor_optimizer!(
    /// ASGD (the single-tensor path of `torch.optim.ASGD`); state `eta`,
    /// `mu`, `ax`, `step` (the scalars as float32 0-dim tensors).
    ///
    /// ```
    /// use kiln_frontend::optim::{AsgdConfig, Optimizer, ASGD};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = ASGD::with_params(vec![w.clone()], AsgdConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::ones(&[2], DType::F32)));
    /// opt.step().unwrap();
    /// // p = p * (1 - lambd * lr) - lr * grad; before t0 the average is the iterate
    /// let want = 1.0 - 1e-4 * 1e-2 - 1e-2;
    /// assert!((w.to_f64_vec()[0] - want).abs() < 1e-6);
    /// assert_eq!(opt.state(&w).unwrap()["ax"].to_f64_vec(), w.to_f64_vec());
    /// ```
    ASGD,
    AsgdConfig,
    update
);

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let (lr, lambd, alpha, t0) = (g.f64("lr")?, g.f64("lambd")?, g.f64("alpha")?, g.f64("t0")?);
    // eta and mu are float32 tensors in PyTorch: read back rounded
    let eta = scalar_state(st, "eta", lr as f32 as f64)?;
    let mu = scalar_state(st, "mu", 1.0)?;
    let ax0 = state_or(st, "ax", p, 0.0)?;
    let step = bump_step(st)?;
    let grad = l2_grad(g, p, grad)?;
    let new_p = scale(p, 1.0 - lambd * eta)?.add_scaled(&grad, eta, true)?;
    let ax = if mu != 1.0 {
        ax0.add(&scale(&new_p.sub(&ax0)?, mu)?)?
    } else {
        new_p.copy()?
    };
    st.insert("ax".into(), ax);
    let new_eta = lr / (1.0 + lambd * lr * step).powf(alpha);
    st.insert("eta".into(), Tensor::scalar(new_eta as f32));
    st.insert(
        "mu".into(),
        Tensor::scalar((1.0 / (step - t0).max(1.0)) as f32),
    );
    p.copy_(&new_p)
}
