//! `nn.SyncBatchNorm`: BatchNorm whose training statistics are those of
//! the global batch (every rank's samples), forward and backward.
//!
//! The statistics are sums over the local batch combined by a
//! *differentiable* all-reduce: its backward all-reduces the incoming
//! gradient, so each rank's gradient is that of the sum of all ranks'
//! losses — exactly what BatchNorm on the concatenated batch gives once
//! DDP averages the parameter gradients. Two passes (global mean, then the
//! global sum of squared deviations) keep the variance as precise as
//! BatchNorm's own. The running stats use the global count (unbiased
//! variance), so they stay identical on every rank.

use super::{default_group, ProcessGroup, ReduceOp};
use crate::autograd::{no_grad, record};
use crate::nn::{BatchNorm, Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::{bail, DType, Result};

/// `y = sum over ranks of x`, with the gradient all-reduced the same way.
fn all_reduce_sum_differentiable(group: &ProcessGroup, x: &Tensor) -> Result<Tensor> {
    let out = {
        let _g = no_grad();
        let out = x.contiguous()?.copy()?;
        group.all_reduce(&out, ReduceOp::Sum)?;
        out
    };
    if !crate::autograd::needs_grad(&[x]) {
        return Ok(out);
    }
    let g2 = group.clone();
    record("all_reduce", out, &[x], move |g| {
        let g = g.contiguous()?.copy()?;
        g2.all_reduce(&g, ReduceOp::Sum)?;
        Ok(vec![Some(g)])
    })
}

/// BatchNorm `bn`'s training forward over the global batch of `group`.
pub(crate) fn forward(bn: &BatchNorm, group: &ProcessGroup, x: &Tensor) -> Result<Tensor> {
    if x.rank() < 2 {
        bail!(
            "SyncBatchNorm",
            "expected an input of rank 2 or more, got {}",
            x.rank()
        );
    }
    let c = x.dims()[1];
    let red: Vec<i64> = (0..x.rank() as i64).filter(|&d| d != 1).collect();
    let mut bshape = vec![1usize; x.rank()];
    bshape[1] = c;
    let local_n = (x.numel() / c.max(1)) as f64;
    let xf = if x.dtype() == DType::F32 || x.dtype() == DType::F64 {
        x.clone()
    } else {
        x.to_dtype(DType::F32)?
    };
    // pass 1: global sum and count -> mean
    let count = Tensor::full(&[1], local_n, xf.dtype());
    let s = Tensor::cat(&[&xf.sum(Some(&red), false)?, &count], 0)?;
    let s = all_reduce_sum_differentiable(group, &s)?;
    let n_t = s.narrow(0, c as i64, 1)?;
    let n = {
        let _g = no_grad();
        n_t.item()?
    };
    if n <= 1.0 && bn.is_training() {
        bail!(
            "SyncBatchNorm",
            "expected more than 1 value per channel when training over the global batch, got input size {:?} on this rank and {n} in all",
            x.dims()
        );
    }
    let mean = s
        .narrow(0, 0, c)?
        .div(&Tensor::scalar(n).to_dtype(xf.dtype())?)?;
    let centered = xf.sub(&mean.reshape_dims(&bshape)?)?;
    // pass 2: global sum of squared deviations -> biased variance
    let ss =
        all_reduce_sum_differentiable(group, &centered.mul(&centered)?.sum(Some(&red), false)?)?;
    let var = ss.div(&Tensor::scalar(n).to_dtype(xf.dtype())?)?;
    let inv_std = var
        .add(&Tensor::scalar(bn.eps).to_dtype(xf.dtype())?)?
        .rsqrt()?;
    let mut y = centered.mul(&inv_std.reshape_dims(&bshape)?)?;
    if let Some(w) = &bn.weight {
        y = y.mul(&w.to_dtype(xf.dtype())?.reshape_dims(&bshape)?)?;
    }
    if let Some(b) = &bn.bias {
        y = y.add(&b.to_dtype(xf.dtype())?.reshape_dims(&bshape)?)?;
    }
    update_running_stats(bn, &mean, &var, n)?;
    if y.dtype() != x.dtype() {
        y = y.to_dtype(x.dtype())?;
    }
    Ok(y)
}

fn update_running_stats(bn: &BatchNorm, mean: &Tensor, var: &Tensor, n: f64) -> Result<()> {
    let _g = no_grad();
    let mut momentum = bn.momentum.unwrap_or(0.0);
    if let Some(t) = &bn.num_batches_tracked {
        let next = t.binary_scalar(kiln_ir::BinaryOp::Add, 1i64, false)?;
        t.copy_(&next)?;
        if bn.momentum.is_none() {
            momentum = 1.0 / t.item()?;
        }
    }
    let (Some(rm), Some(rv)) = (&bn.running_mean, &bn.running_var) else {
        return Ok(());
    };
    let m =
        |t: &Tensor, v: f64| -> Result<Tensor> { t.mul(&Tensor::scalar(v).to_dtype(t.dtype())?) };
    let unbiased = m(&var.detach(), n / (n - 1.0))?;
    let new_mean =
        m(rm, 1.0 - momentum)?.add(&m(&mean.detach().to_dtype(rm.dtype())?, momentum)?)?;
    let new_var = m(rv, 1.0 - momentum)?.add(&m(&unbiased.to_dtype(rv.dtype())?, momentum)?)?;
    rm.copy_(&new_mean)?;
    rv.copy_(&new_var)
}

/// `nn.SyncBatchNorm(num_features)`: a [`BatchNorm`] whose training
/// statistics are the global batch's (over the default group, or the one
/// given). In eval mode, and outside a process group of more than one
/// rank, it is the plain BatchNorm.
///
/// ```
/// use kiln_frontend::distributed::SyncBatchNorm;
/// use kiln_frontend::nn::Module;
/// let bn = SyncBatchNorm::new_2d(8);
/// assert!(bn.describe().starts_with("SyncBatchNorm(8"));
/// ```
pub struct SyncBatchNorm {
    pub inner: BatchNorm,
}

impl SyncBatchNorm {
    pub fn new_1d(features: usize) -> SyncBatchNorm {
        SyncBatchNorm::from_batch_norm(BatchNorm::new_1d(features))
    }
    pub fn new_2d(features: usize) -> SyncBatchNorm {
        SyncBatchNorm::from_batch_norm(BatchNorm::new_2d(features))
    }
    /// Makes `bn` synchronise its statistics over the default group.
    pub fn from_batch_norm(bn: BatchNorm) -> SyncBatchNorm {
        bn.set_sync(true);
        SyncBatchNorm { inner: bn }
    }
}

impl Module for SyncBatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        self.inner.visit(f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        self.inner.visit_mut(f)
    }
    fn set_own_training(&self, on: bool) {
        self.inner.set_own_training(on)
    }
    fn is_training(&self) -> bool {
        self.inner.is_training()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The group a synchronised BatchNorm reduces over right now: the default
/// group when it has more than one rank.
pub(crate) fn active_group() -> Option<ProcessGroup> {
    default_group().ok().filter(|g| g.world_size() > 1)
}

/// `nn.SyncBatchNorm.convert_sync_batchnorm(model)`: every BatchNorm in the
/// module tree synchronises its statistics from now on (in place, so the
/// parameters, buffers, optimizer and checkpoints are untouched). Returns
/// how many layers it converted.
///
/// ```
/// use kiln_frontend::distributed::convert_sync_batchnorm;
/// use kiln_frontend::nn::{BatchNorm, Linear, Module, Sequential};
/// let m = Sequential::new().add(Linear::new(4, 4, true).unwrap()).add(BatchNorm::new_1d(4));
/// assert_eq!(convert_sync_batchnorm(&m), 1);
/// assert!(m.get(1).unwrap().describe().starts_with("SyncBatchNorm"));
/// ```
pub fn convert_sync_batchnorm(model: &dyn Module) -> usize {
    let mut n = 0;
    if let Some(bn) = model.as_batch_norm() {
        bn.set_sync(true);
        n += 1;
    }
    model.visit(&mut |e| {
        if let Entry::Child(_, c) = e {
            n += convert_sync_batchnorm(c);
        }
    });
    n
}
