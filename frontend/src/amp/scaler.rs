//! `torch.amp.GradScaler`: loss scaling with dynamic growth and backoff.

use crate::autograd::no_grad;
use crate::optim::{Dict, Optimizer, Value};
use crate::Tensor;
use kiln_ir::{bail, BinaryOp, DType, Result};
use std::collections::HashMap;

/// The constructor arguments of [`GradScaler`] (PyTorch's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
    pub enabled: bool,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Unscaled,
    Stepped,
}

#[derive(Debug, Clone, Copy)]
struct OptState {
    stage: Stage,
    found_inf: bool,
}

/// Scales the loss so low-precision gradients do not underflow, unscales the
/// gradients before the optimizer step, skips steps whose gradients hold
/// inf/NaN and adapts the scale (backoff on inf, growth after
/// `growth_interval` clean steps).
///
/// ```
/// use kiln_frontend::amp::GradScaler;
/// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
/// use kiln_frontend::{DType, Tensor};
/// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
/// let mut opt = SGD::with_params(vec![w.clone()], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
/// let mut scaler = GradScaler::new();
/// let loss = w.sum(None, false).unwrap();
/// scaler.scale(&loss).unwrap().backward().unwrap();
/// assert!(scaler.step(&mut opt).unwrap());
/// scaler.update().unwrap();
/// assert!((w.to_f64_vec()[0] - 0.9).abs() < 1e-6);
/// ```
#[derive(Debug, Clone)]
pub struct GradScaler {
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
    growth_tracker: u64,
    enabled: bool,
    /// Per optimizer (by address, as PyTorch keys by `id(optimizer)`), this step.
    per_opt: HashMap<usize, OptState>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new()
    }
}

fn opt_key(opt: &dyn Optimizer) -> usize {
    opt as *const dyn Optimizer as *const () as usize
}

impl GradScaler {
    /// `GradScaler()` with PyTorch's defaults (init_scale 2^16, growth 2,
    /// backoff 0.5, growth_interval 2000, enabled).
    pub fn new() -> GradScaler {
        GradScaler::with_config(GradScalerConfig::default()).expect("valid defaults")
    }

    pub fn with_config(c: GradScalerConfig) -> Result<GradScaler> {
        if c.growth_factor <= 1.0 {
            bail!(
                "GradScaler",
                "growth_factor should be > 1, got {}",
                c.growth_factor
            );
        }
        if !(c.backoff_factor > 0.0 && c.backoff_factor < 1.0) {
            bail!(
                "GradScaler",
                "backoff_factor should be in (0, 1), got {}",
                c.backoff_factor
            );
        }
        if c.growth_interval == 0 || !(c.init_scale > 0.0 && c.init_scale.is_finite()) {
            bail!(
                "GradScaler",
                "growth_interval must be positive and init_scale positive and finite, got {} and {}",
                c.growth_interval,
                c.init_scale
            );
        }
        Ok(GradScaler {
            scale: c.init_scale as f32 as f64,
            growth_factor: c.growth_factor,
            backoff_factor: c.backoff_factor,
            growth_interval: c.growth_interval,
            growth_tracker: 0,
            enabled: c.enabled,
            per_opt: HashMap::new(),
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The current scale (`get_scale()`; 1.0 when disabled, as PyTorch returns).
    pub fn get_scale(&self) -> f64 {
        if self.enabled {
            self.scale
        } else {
            1.0
        }
    }

    pub fn get_growth_tracker(&self) -> u64 {
        self.growth_tracker
    }

    /// `scaler.scale(loss)`: `loss * scale`, recorded for backward (the loss
    /// itself when disabled).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        loss.binary_scalar(BinaryOp::Mul, self.scale, false)
    }

    /// `scaler.unscale_(optimizer)`: divides the gradients of the optimizer's
    /// parameters by the scale and records whether any of them holds inf or
    /// NaN. At most once per optimizer between two `update()` calls.
    pub fn unscale_(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let key = opt_key(opt);
        if let Some(s) = self.per_opt.get(&key) {
            let why = match s.stage {
                Stage::Unscaled => {
                    "unscale_() has already been called on this optimizer since the last update()"
                }
                Stage::Stepped => "unscale_() is being called after step()",
            };
            bail!("GradScaler.unscale_", "{why}");
        }
        let inv = (1.0 / self.scale) as f32 as f64;
        let _ng = no_grad();
        let mut found_inf = false;
        for g in opt.param_groups() {
            for p in &g.params {
                let Some(grad) = p.grad() else { continue };
                if grad.dtype() == DType::F16 {
                    bail!(
                        "GradScaler.unscale_",
                        "attempting to unscale FP16 gradients (keep the parameters in f32 and let autocast cast them)"
                    );
                }
                let u = grad.binary_scalar(BinaryOp::Mul, inv, false)?;
                if !u.abs()?.amax(None, false)?.item()?.is_finite() {
                    found_inf = true;
                }
                p.set_grad(Some(u));
            }
        }
        self.per_opt.insert(
            key,
            OptState {
                stage: Stage::Unscaled,
                found_inf,
            },
        );
        Ok(())
    }

    /// `scaler.step(optimizer)`: unscales the gradients unless `unscale_` was
    /// already called this step, then runs `optimizer.step()` only when no
    /// gradient holds inf/NaN. Returns whether the step ran.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<bool> {
        if !self.enabled {
            opt.step()?;
            return Ok(true);
        }
        let key = opt_key(opt);
        match self.per_opt.get(&key).map(|s| s.stage) {
            Some(Stage::Stepped) => bail!(
                "GradScaler.step",
                "step() has already been called since the last update()"
            ),
            Some(Stage::Unscaled) => {}
            None => self.unscale_(opt)?,
        }
        let s = self.per_opt.get_mut(&key).expect("unscaled above");
        s.stage = Stage::Stepped;
        if s.found_inf {
            return Ok(false);
        }
        opt.step()?;
        Ok(true)
    }

    /// Whether any optimizer found inf/NaN gradients since the last `update()`.
    pub fn found_inf(&self) -> bool {
        self.per_opt.values().any(|s| s.found_inf)
    }

    /// `scaler.update()`: multiplies the scale by `backoff_factor` when this
    /// step found inf/NaN (and restarts the growth count), else counts a
    /// clean step and multiplies it by `growth_factor` after
    /// `growth_interval` clean steps in a row.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.per_opt.is_empty() {
            bail!(
                "GradScaler.update",
                "no inf checks were recorded prior to update() (call unscale_() or step() first)"
            );
        }
        if self.found_inf() {
            self.scale = (self.scale * self.backoff_factor) as f32 as f64;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                let grown = (self.scale * self.growth_factor) as f32 as f64;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            }
        }
        self.per_opt.clear();
        Ok(())
    }

    /// `scaler.update(new_scale)`: sets the scale directly.
    pub fn update_to(&mut self, new_scale: f64) -> Result<()> {
        if !(new_scale > 0.0 && new_scale.is_finite()) {
            bail!(
                "GradScaler.update",
                "new_scale must be positive and finite, got {new_scale}"
            );
        }
        self.scale = new_scale as f32 as f64;
        self.per_opt.clear();
        Ok(())
    }

    /// PyTorch's keys: `scale`, `growth_factor`, `backoff_factor`,
    /// `growth_interval`, `_growth_tracker` (empty when disabled, as PyTorch).
    pub fn state_dict(&self) -> Dict {
        let mut d = Dict::new();
        if self.enabled {
            d.insert("scale".into(), Value::Float(self.scale));
            d.insert("growth_factor".into(), Value::Float(self.growth_factor));
            d.insert("backoff_factor".into(), Value::Float(self.backoff_factor));
            d.insert(
                "growth_interval".into(),
                Value::Int(self.growth_interval as i64),
            );
            d.insert(
                "_growth_tracker".into(),
                Value::Int(self.growth_tracker as i64),
            );
        }
        d
    }

    /// Restores a [`GradScaler::state_dict`]; every key must be present.
    pub fn load_state_dict(&mut self, d: &Dict) -> Result<()> {
        if !self.enabled {
            bail!(
                "GradScaler.load_state_dict",
                "cannot load a state dict into a disabled GradScaler"
            );
        }
        if d.is_empty() {
            bail!(
                "GradScaler.load_state_dict",
                "the state dict is empty: it was saved from a disabled GradScaler"
            );
        }
        let num = |k: &str| -> Result<f64> {
            match d.get(k).and_then(Value::as_f64) {
                Some(v) => Ok(v),
                None => bail!(
                    "GradScaler.load_state_dict",
                    "missing or non-numeric key '{k}'"
                ),
            }
        };
        let (scale, gf, bf) = (num("scale")?, num("growth_factor")?, num("backoff_factor")?);
        let (gi, gt) = (num("growth_interval")?, num("_growth_tracker")?);
        if !(scale > 0.0 && scale.is_finite()) || gi < 1.0 || gt < 0.0 {
            bail!(
                "GradScaler.load_state_dict",
                "invalid state: scale {scale}, growth_interval {gi}, _growth_tracker {gt}"
            );
        }
        self.scale = scale;
        self.growth_factor = gf;
        self.backoff_factor = bf;
        self.growth_interval = gi as u64;
        self.growth_tracker = gt as u64;
        self.per_opt.clear();
        Ok(())
    }
}
