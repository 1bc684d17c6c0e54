//! `nn.InstanceNorm2d`: each (sample, channel) plane normalised by its own
//! statistics, optionally affine and optionally tracking running stats.

use super::layers::{param, py_bool};
use super::{Entry, EntryMut, Module, Training};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};

/// InstanceNorm's keyword arguments, PyTorch's defaults (`affine` and
/// `track_running_stats` off, unlike BatchNorm).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceNormOptions {
    pub eps: f64,
    /// None: no running-stat update (PyTorch passes momentum 0.0).
    pub momentum: Option<f64>,
    pub affine: bool,
    pub track_running_stats: bool,
    /// With `affine`, whether there is a bias.
    pub bias: bool,
}

impl Default for InstanceNormOptions {
    fn default() -> Self {
        InstanceNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: false,
            track_running_stats: false,
            bias: true,
        }
    }
}

/// `nn.InstanceNorm2d(num_features, **o)` on (N, C, H, W) or (C, H, W).
///
/// In training (or without running stats) each plane uses its own mean and
/// biased variance; with `track_running_stats` training also moves
/// `running_mean`/`running_var` toward the planes' mean statistics
/// (unbiased variance), and eval normalises with them.
///
/// ```
/// use kiln_frontend::nn::{InstanceNorm2d, InstanceNormOptions, Module};
/// use kiln_frontend::{DType, Tensor};
/// let n = InstanceNorm2d::new(3, InstanceNormOptions::default());
/// assert_eq!(n.forward(&Tensor::ones(&[2, 3, 4, 4], DType::F32)).unwrap().dims(), &[2, 3, 4, 4]);
/// ```
pub struct InstanceNorm2d {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub running_mean: Option<Tensor>,
    pub running_var: Option<Tensor>,
    pub num_batches_tracked: Option<Tensor>,
    pub num_features: usize,
    pub eps: f64,
    pub momentum: Option<f64>,
    training: Training,
}

impl InstanceNorm2d {
    pub fn new(num_features: usize, o: InstanceNormOptions) -> InstanceNorm2d {
        let c = num_features;
        let track = o.track_running_stats;
        InstanceNorm2d {
            weight: o
                .affine
                .then(|| Tensor::ones(&[c], DType::F32).requires_grad_(true)),
            bias: (o.affine && o.bias).then(|| param(&[c])),
            running_mean: track.then(|| Tensor::zeros(&[c], DType::F32)),
            running_var: track.then(|| Tensor::ones(&[c], DType::F32)),
            num_batches_tracked: track.then(|| Tensor::zeros(&[], DType::I64)),
            num_features,
            eps: o.eps,
            momentum: o.momentum,
            training: Training::default(),
        }
    }

    fn normalize(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.weight.as_ref(), self.bias.as_ref());
        let stats = self.running_mean.as_ref().zip(self.running_var.as_ref());
        match stats {
            Some((rm, rv)) if !self.training.get() => {
                F::batch_norm(x, Some(rm), Some(rv), w, b, false, 0.0, self.eps)
            }
            _ => {
                if let Some((rm, rv)) = stats {
                    self.update_running_stats(x, rm, rv)?;
                }
                // one group per channel: group_norm's per-channel affine is InstanceNorm's
                F::group_norm(x, self.num_features, w, b, self.eps)
            }
        }
    }

    /// running = (1 - m) running + m mean over the batch of each plane's
    /// statistic (unbiased variance), as PyTorch's instance_norm does by
    /// running batch_norm on (1, N C, H, W) and averaging back over N.
    fn update_running_stats(&self, x: &Tensor, rm: &Tensor, rv: &Tensor) -> Result<()> {
        let Some(m) = self.momentum else {
            return Ok(());
        };
        let _g = crate::autograd::no_grad();
        let xd = x.detach();
        let mean = xd.mean(Some(&[2, 3]), false)?.mean(Some(&[0]), false)?;
        let var = xd.var(&[2, 3], 1.0, false)?.mean(Some(&[0]), false)?;
        use kiln_ir::BinaryOp::Mul;
        for (buf, stat) in [(rm, mean), (rv, var)] {
            let next = buf
                .binary_scalar(Mul, 1.0 - m, false)?
                .add(&stat.binary_scalar(Mul, m, false)?)?;
            crate::compile::trace::record_mutation(buf, &next, || buf.copy_(&next))?;
        }
        Ok(())
    }
}

impl Module for InstanceNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let unbatched = x.rank() == 3;
            if !matches!(x.rank(), 3 | 4) || x.dims()[x.rank() - 3] != self.num_features {
                bail!(
                    "InstanceNorm2d",
                    "expected (N, {c}, H, W) or ({c}, H, W), got {}",
                    fmt_dims(x.dims()),
                    c = self.num_features
                );
            }
            if unbatched {
                self.normalize(&x.unsqueeze(0)?)?.squeeze(Some(&[0]))
            } else {
                self.normalize(x)
            }
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, t) in [("weight", &self.weight), ("bias", &self.bias)] {
            if let Some(t) = t {
                f(Entry::Param(n, t))
            }
        }
        for (n, t) in [
            ("running_mean", &self.running_mean),
            ("running_var", &self.running_var),
            ("num_batches_tracked", &self.num_batches_tracked),
        ] {
            if let Some(t) = t {
                f(Entry::Buffer(n, t))
            }
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        for (n, t) in [("weight", &mut self.weight), ("bias", &mut self.bias)] {
            if let Some(t) = t {
                f(EntryMut::Param(n, t))
            }
        }
        for (n, t) in [
            ("running_mean", &mut self.running_mean),
            ("running_var", &mut self.running_var),
            ("num_batches_tracked", &mut self.num_batches_tracked),
        ] {
            if let Some(t) = t {
                f(EntryMut::Buffer(n, t))
            }
        }
    }
    fn set_own_training(&self, on: bool) {
        self.training.set(on)
    }
    fn is_training(&self) -> bool {
        self.training.get()
    }
    fn describe(&self) -> String {
        let m = self
            .momentum
            .map(|m| format!("{m}"))
            .unwrap_or("None".into());
        format!(
            "InstanceNorm2d({}, eps={:e}, momentum={m}, affine={}, bias={}, track_running_stats={})",
            self.num_features,
            self.eps,
            py_bool(self.weight.is_some()),
            py_bool(self.bias.is_some()),
            py_bool(self.running_mean.is_some())
        )
    }
}
