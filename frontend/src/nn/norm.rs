//! Normalisation layers: BatchNorm1d/2d, LayerNorm, GroupNorm.

use super::layers::{param, py_bool};
use super::{Entry, EntryMut, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// The optional affine parameters of a norm layer, with write access.
fn visit_affine_mut(
    w: &mut Option<Tensor>,
    b: &mut Option<Tensor>,
    f: &mut dyn FnMut(EntryMut<'_>),
) {
    for (n, t) in [("weight", w), ("bias", b)] {
        if let Some(t) = t {
            f(EntryMut::Param(n, t))
        }
    }
}

/// `nn.BatchNorm1d` / `nn.BatchNorm2d`: batch statistics in training (and the
/// running stats updated with the unbiased variance), running stats in eval.
pub struct BatchNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub running_mean: Option<Tensor>,
    pub running_var: Option<Tensor>,
    pub num_batches_tracked: Option<Tensor>,
    /// None = cumulative moving average (PyTorch's `momentum=None`).
    pub momentum: Option<f64>,
    pub eps: f64,
    /// 2 for BatchNorm1d, 4 for BatchNorm2d (the input rank it expects; 1d also takes rank 3).
    rank: usize,
    training: AtomicBool,
    /// Training statistics over the global batch (`SyncBatchNorm`, see `distributed/sync_bn.rs`).
    sync: AtomicBool,
}

/// BatchNorm's keyword arguments, PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    pub eps: f64,
    /// `None`: a cumulative moving average (PyTorch's `momentum=None`).
    pub momentum: Option<f64>,
    pub affine: bool,
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

impl BatchNorm {
    /// Makes the training statistics those of the global batch of the
    /// default process group (`distributed::convert_sync_batchnorm`).
    pub fn set_sync(&self, on: bool) {
        self.sync.store(on, Ordering::Relaxed)
    }
    /// Whether this is a `SyncBatchNorm`.
    pub fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Relaxed)
    }

    pub fn new_1d(features: usize) -> BatchNorm {
        BatchNorm::with_options(features, 2, 1e-5, Some(0.1), true, true)
    }
    pub fn new_2d(features: usize) -> BatchNorm {
        BatchNorm::with_options(features, 4, 1e-5, Some(0.1), true, true)
    }
    /// `nn.BatchNorm{1,2}d(features, **opts)` for a `rank`-d input (2 or
    /// 3 for 1d, 4 for 2d), with PyTorch's argument names.
    ///
    /// ```
    /// use kiln_frontend::nn::{BatchNorm, BatchNormOptions, ModuleExt};
    /// let bn = BatchNorm::with(8, 4, BatchNormOptions { affine: false, ..Default::default() });
    /// assert_eq!(bn.parameters().len(), 0);
    /// ```
    pub fn with(features: usize, rank: usize, o: BatchNormOptions) -> BatchNorm {
        BatchNorm::with_options(
            features,
            rank,
            o.eps,
            o.momentum,
            o.affine,
            o.track_running_stats,
        )
    }
    /// All of PyTorch's arguments, positionally: eps, momentum, affine,
    /// track_running_stats (see [`BatchNorm::with`] for named ones).
    pub fn with_options(
        c: usize,
        rank: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track: bool,
    ) -> BatchNorm {
        let ones = || Tensor::ones(&[c], DType::F32);
        BatchNorm {
            weight: affine.then(|| ones().requires_grad_(true)),
            bias: affine.then(|| param(&[c])),
            running_mean: track.then(|| Tensor::zeros(&[c], DType::F32)),
            running_var: track.then(ones),
            num_batches_tracked: track.then(|| Tensor::zeros(&[], DType::I64)),
            momentum,
            eps,
            rank,
            training: AtomicBool::new(true),
            sync: AtomicBool::new(false),
        }
    }
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let name = if self.rank == 2 {
                "BatchNorm1d"
            } else {
                "BatchNorm2d"
            };
            let ok = if self.rank == 2 {
                matches!(x.rank(), 2 | 3)
            } else {
                x.rank() == 4
            };
            if !ok {
                bail!(
                    name,
                    "expected {} input, got {}",
                    if self.rank == 2 { "2D or 3D" } else { "4D" },
                    fmt_dims(x.dims())
                );
            }
            let training = self.training.load(Ordering::Relaxed);
            if training && self.is_sync() {
                if let Some(g) = crate::distributed::sync_bn_group() {
                    return crate::distributed::sync_bn_forward(self, &g, x);
                }
            }
            let use_batch_stats = training || self.running_mean.is_none();
            let mut momentum = self.momentum.unwrap_or(0.0);
            if training {
                if let Some(n) = &self.num_batches_tracked {
                    let _g = crate::autograd::no_grad();
                    let next = n.binary_scalar(kiln_ir::BinaryOp::Add, 1i64, false)?;
                    crate::compile::trace::record_mutation(n, &next, || n.copy_(&next))?;
                    if self.momentum.is_none() {
                        momentum = 1.0 / n.item()?;
                    }
                }
            }
            let (rm, rv) = if training || !use_batch_stats {
                (self.running_mean.as_ref(), self.running_var.as_ref())
            } else {
                (None, None)
            };
            F::batch_norm(
                x,
                rm,
                rv,
                self.weight.as_ref(),
                self.bias.as_ref(),
                use_batch_stats,
                momentum,
                self.eps,
            )
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
        visit_affine_mut(&mut self.weight, &mut self.bias, f);
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
        self.training.store(on, Ordering::Relaxed)
    }
    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }
    fn as_batch_norm(&self) -> Option<&BatchNorm> {
        Some(self)
    }
    fn describe(&self) -> String {
        let c = self
            .running_mean
            .as_ref()
            .or(self.weight.as_ref())
            .map(|t| t.dims()[0])
            .unwrap_or(0);
        let d = if self.rank == 2 { 1 } else { 2 };
        let m = self
            .momentum
            .map(|m| format!("{m}"))
            .unwrap_or("None".into());
        let kind = match self.is_sync() {
            true => "SyncBatchNorm".to_string(),
            false => format!("BatchNorm{d}d"),
        };
        format!(
            "{kind}({c}, eps={:e}, momentum={m}, affine={}, track_running_stats={})",
            self.eps,
            py_bool(self.weight.is_some()),
            py_bool(self.running_mean.is_some())
        )
    }
}

/// `nn.LayerNorm(normalized_shape, eps, elementwise_affine)`.
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(normalized_shape: &[usize], eps: f64, affine: bool) -> LayerNorm {
        LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight: affine.then(|| Tensor::ones(normalized_shape, DType::F32).requires_grad_(true)),
            bias: affine.then(|| param(normalized_shape)),
            eps,
        }
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            F::layer_norm(
                x,
                &self.normalized_shape,
                self.weight.as_ref(),
                self.bias.as_ref(),
                self.eps,
            )
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, t) in [("weight", &self.weight), ("bias", &self.bias)] {
            if let Some(t) = t {
                f(Entry::Param(n, t))
            }
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        visit_affine_mut(&mut self.weight, &mut self.bias, f)
    }
    fn describe(&self) -> String {
        format!(
            "LayerNorm({:?}, eps={:e}, elementwise_affine={})",
            self.normalized_shape,
            self.eps,
            py_bool(self.weight.is_some())
        )
    }
}

/// `nn.GroupNorm(num_groups, num_channels, eps, affine)`.
pub struct GroupNorm {
    pub groups: usize,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub eps: f64,
    channels: usize,
}

impl GroupNorm {
    pub fn new(groups: usize, channels: usize, eps: f64, affine: bool) -> GroupNorm {
        GroupNorm {
            groups,
            weight: affine.then(|| Tensor::ones(&[channels], DType::F32).requires_grad_(true)),
            bias: affine.then(|| param(&[channels])),
            eps,
            channels,
        }
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            F::group_norm(
                x,
                self.groups,
                self.weight.as_ref(),
                self.bias.as_ref(),
                self.eps,
            )
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, t) in [("weight", &self.weight), ("bias", &self.bias)] {
            if let Some(t) = t {
                f(Entry::Param(n, t))
            }
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        visit_affine_mut(&mut self.weight, &mut self.bias, f)
    }
    fn describe(&self) -> String {
        format!(
            "GroupNorm({}, {}, eps={:e}, affine={})",
            self.groups,
            self.channels,
            self.eps,
            py_bool(self.weight.is_some())
        )
    }
}
