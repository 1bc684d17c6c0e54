//! `torch.optim.Rprop`: per-element step sizes grown or shrunk by the sign
//! agreement of successive gradients; only the gradient's sign is used.

use super::core::{bump_step, full_like, single_tensor_optimizer, state_or, ParamState};
use super::group::{Dict, ParamGroup};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// Rprop's constructor arguments (PyTorch's defaults: `lr` 1e-2, `etas`
/// (0.5, 1.2), `step_sizes` (1e-6, 50)).
#[derive(Clone, Debug)]
pub struct RpropConfig {
    pub lr: f64,
    /// (etaminus, etaplus): the factors for a sign change / agreement.
    pub etas: (f64, f64),
    /// (min, max) step size.
    pub step_sizes: (f64, f64),
    pub maximize: bool,
}

impl Default for RpropConfig {
    fn default() -> Self {
        RpropConfig {
            lr: 1e-2,
            etas: (0.5, 1.2),
            step_sizes: (1e-6, 50.0),
            maximize: false,
        }
    }
}

impl RpropConfig {
    fn dict(&self) -> Result<Dict> {
        let (em, ep) = self.etas;
        if self.lr.is_nan() || self.lr < 0.0 {
            bail!("Rprop", "Invalid learning rate: {}", self.lr);
        }
        if !(0.0 < em && em < 1.0 && 1.0 < ep) {
            bail!("Rprop", "Invalid eta values: {em}, {ep}");
        }
        Ok(ParamGroup::new(vec![])
            .with("lr", self.lr)
            .with("etas", self.etas)
            .with("step_sizes", self.step_sizes)
            .with("maximize", self.maximize)
            .options)
    }
}

single_tensor_optimizer!(
    /// Rprop (the single-tensor path of `torch.optim.Rprop`); state `prev`,
    /// `step_size`, `step`.
    ///
    /// ```
    /// use kiln_frontend::optim::{Optimizer, Rprop, RpropConfig};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let mut opt = Rprop::with_params(vec![w.clone()], RpropConfig::default()).unwrap();
    /// w.set_grad(Some(Tensor::full(&[2], 3.0, DType::F32)));
    /// opt.step().unwrap();
    /// // first step: no previous gradient, so the step size stays lr
    /// assert!((w.to_f64_vec()[0] - (1.0 - 1e-2)).abs() < 1e-7);
    /// ```
    Rprop,
    RpropConfig,
    update
);

fn pair(g: &ParamGroup, key: &str) -> Result<(f64, f64)> {
    match g.get(key).and_then(|v| v.as_floats()) {
        Some(&[a, b]) => Ok((a, b)),
        _ => bail!("Rprop", "param group has no pair of numbers under '{key}'"),
    }
}

fn update(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<()> {
    let ((etaminus, etaplus), (lo, hi)) = (pair(g, "etas")?, pair(g, "step_sizes")?);
    let prev = state_or(st, "prev", p, 0.0)?;
    let size0 = state_or(st, "step_size", p, g.f64("lr")?)?;
    bump_step(st)?;
    let grad = if g.bool("maximize")? {
        grad.neg()?
    } else {
        grad.clone()
    };
    let agree = grad.mul(&prev)?.sign()?;
    let zero = Tensor::scalar(0.0).to_dtype(grad.dtype())?;
    let (up, down) = (agree.gt(&zero)?, agree.lt(&zero)?);
    let full = |v: f64| full_like(p, v);
    let eta = Tensor::where_(
        &up,
        &full(etaplus)?,
        &Tensor::where_(&down, &full(etaminus)?, &full(1.0)?)?,
    )?;
    let size = size0.mul(&eta)?.clamp(Some(lo), Some(hi))?;
    // after a sign change the gradient is forgotten: no step, and no memory of it
    let grad = Tensor::where_(&down, &full(0.0)?, &grad)?;
    let new_p = p.sub(&grad.sign()?.mul(&size)?)?;
    st.insert("prev".into(), grad);
    st.insert("step_size".into(), size);
    p.copy_(&new_p)
}
