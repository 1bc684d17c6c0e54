//! Eager reductions. Reduced dims are moved last and merged into one loop
//! axis (a view when the layout allows), so every reduction is one kernel
//! reducing along the innermost loop dim.

use super::kernel::KernelCall;
use crate::autograd::rules::reduce as rules;
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::infer::{self, reduced_shape};
use kiln_ir::op::{Meta, Op};
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};

/// Lays `t` (of `x`'s shape) out as `kept ++ [product of reduced]`.
pub(super) fn to_reduce_layout(t: &Tensor, kept: &[usize], reduced: &[usize]) -> Result<Tensor> {
    let perm: Vec<i64> = kept.iter().chain(reduced).map(|&d| d as i64).collect();
    let p = t.permute(&perm)?;
    let mut shape: Vec<i64> = kept.iter().map(|&d| t.dims()[d] as i64).collect();
    shape.push(reduced.iter().map(|&d| t.dims()[d]).product::<usize>() as i64);
    p.reshape(&shape)
}

/// For an associative `kind` whose reduced dims `rd` some leaf cannot merge
/// into one loop axis without copying, the longest run of innermost reduced
/// dims every leaf can merge (reduced first, in a kernel of its own).
fn split_reduced(
    kind: ReduceKind,
    value: &Meta,
    leaves: &[Tensor],
    rd: &[usize],
) -> Result<Option<Vec<usize>>> {
    use ReduceKind::*;
    if !matches!(kind, Sum | Prod | Max | Min) || rd.len() < 2 {
        return Ok(None);
    }
    let expanded: Vec<Tensor> = leaves
        .iter()
        .map(|t| t.expand_to(&value.dims))
        .collect::<Result<_>>()?;
    // dims a (outer) and b (inner) merge when a steps over exactly all of b
    let merges = |a: usize, b: usize| {
        expanded.iter().all(|t| {
            let (d, s) = (t.dims(), t.strides());
            d[a] == 1 || d[b] == 1 || s[a] == s[b] * d[b] as isize
        })
    };
    let mut start = rd.len() - 1;
    while start > 0 && merges(rd[start - 1], rd[start]) {
        start -= 1;
    }
    Ok((start > 0).then(|| rd[start..].to_vec()))
}

/// The general eager reduction. `leaves` (each broadcastable to `value.dims`)
/// are loaded in the kernel; `body(k, loaded)` computes the value to reduce
/// (of dtype `value.dtype`) per element; it is reduced with `kind` over `dims`
/// (None = all), then `epilogue(k, acc, n)` runs with `n` the number of reduced
/// elements and gives the value(s) stored per output element (several: the
/// result gets a trailing dim holding them). The leaves are laid out so the
/// reduced dims form the innermost loop axis (a view when strides allow).
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_expr(
    name: &str,
    kind: ReduceKind,
    value: &Meta,
    leaves: &[Tensor],
    dims: Option<&[i64]>,
    keepdim: bool,
    out_dtype: DType,
    body: impl FnMut(&mut KernelCall, &[usize]) -> usize,
    epilogue: impl FnOnce(&mut KernelCall, usize, usize) -> Vec<usize>,
) -> Result<Tensor> {
    let rd = infer::reduce_dims(name, value.dims.len(), dims)?;
    let n: usize = rd.iter().map(|&d| value.dims[d]).product();
    if let Some(inner) = split_reduced(kind, value, leaves, &rd)? {
        // the reduced dims do not merge into one loop axis without a copy
        // (a per-channel sum of NCHW): reduce the inner group that does,
        // then the partial result, which is small
        let acc = out_dtype.compute();
        let inner: Vec<i64> = inner.iter().map(|&d| d as i64).collect();
        let partial = reduce_kernel(
            name,
            kind,
            value,
            leaves,
            Some(&inner),
            true,
            acc,
            body,
            |_, a, _| vec![a],
        )?;
        let all: Vec<i64> = rd.iter().map(|&d| d as i64).collect();
        let pm = partial.meta();
        return reduce_kernel(
            name,
            kind,
            &pm,
            std::slice::from_ref(&partial),
            Some(&all),
            keepdim,
            out_dtype,
            |_, v| v[0],
            |k, a, _| epilogue(k, a, n),
        );
    }
    reduce_kernel(
        name, kind, value, leaves, dims, keepdim, out_dtype, body, epilogue,
    )
}

/// [`reduce_expr`] as one kernel, or for a long float sum, the cascade of
/// [`super::reduce_cascade`].
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_kernel(
    name: &str,
    kind: ReduceKind,
    value: &Meta,
    leaves: &[Tensor],
    dims: Option<&[i64]>,
    keepdim: bool,
    out_dtype: DType,
    mut body: impl FnMut(&mut KernelCall, &[usize]) -> usize,
    epilogue: impl FnOnce(&mut KernelCall, usize, usize) -> Vec<usize>,
) -> Result<Tensor> {
    let rank = value.dims.len();
    let rd = infer::reduce_dims(name, rank, dims)?;
    infer::reduce(kind, value, &rd, keepdim).map_err(|e| match e {
        kiln_ir::Error::Op { msg, .. } => kiln_ir::Error::op(name, msg),
        e => e,
    })?;
    let kept: Vec<usize> = (0..rank).filter(|d| !rd.contains(d)).collect();
    let n: usize = rd.iter().map(|&d| value.dims[d]).product();
    if rank > 0 && super::reduce_cascade::applies(kind, out_dtype, n) {
        let mut tuple = 1;
        let out = super::reduce_cascade::cascade_sum(
            name,
            value,
            leaves,
            &kept,
            &rd,
            out_dtype,
            &mut body,
            |k, a, n| {
                let r = epilogue(k, a, n);
                tuple = r.len();
                r
            },
        )?;
        let mut shape = reduced_shape(&value.dims, &rd, keepdim);
        if tuple > 1 {
            shape.push(tuple);
        }
        return out.reshape_dims(&shape);
    }
    reduce_one(
        name, kind, value, leaves, dims, keepdim, out_dtype, body, epilogue,
    )
}

/// One reduction kernel, whatever the row length (the cascade's building block).
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_one(
    name: &str,
    kind: ReduceKind,
    value: &Meta,
    leaves: &[Tensor],
    dims: Option<&[i64]>,
    keepdim: bool,
    out_dtype: DType,
    mut body: impl FnMut(&mut KernelCall, &[usize]) -> usize,
    epilogue: impl FnOnce(&mut KernelCall, usize, usize) -> Vec<usize>,
) -> Result<Tensor> {
    let rank = value.dims.len();
    let rd = infer::reduce_dims(name, rank, dims)?;
    let kept: Vec<usize> = (0..rank).filter(|d| !rd.contains(d)).collect();
    let n: usize = rd.iter().map(|&d| value.dims[d]).product();
    let mut k = KernelCall::new();
    let mut loop_dims = vec![];
    let mut vals = vec![];
    for t in leaves {
        let e = t.expand_to(&value.dims)?;
        let e = if rank == 0 {
            e.reshape(&[1, 1])?
        } else {
            to_reduce_layout(&e, &kept, &rd)?
        };
        loop_dims = e.dims().to_vec();
        vals.push(k.load(&e));
    }
    let v = body(&mut k, &vals);
    let mut tuple = 1;
    let out = k.reduce(name, kind, v, &loop_dims, out_dtype, |k, acc| {
        let r = epilogue(k, acc, n);
        tuple = r.len();
        r
    })?;
    let mut shape = reduced_shape(&value.dims, &rd, keepdim);
    if tuple > 1 {
        shape.push(tuple);
    }
    out.reshape_dims(&shape)
}

impl Tensor {
    /// A reduction of `kind` as one kernel, with its backward rule.
    pub(crate) fn simple_reduce(
        &self,
        kind: ReduceKind,
        dims: Option<&[i64]>,
        keepdim: bool,
    ) -> Result<Tensor> {
        let node = || Op::Reduce {
            kind,
            dims: dims.map(<[i64]>::to_vec).unwrap_or_default(),
            keepdim,
        };
        trace::record(node, &[self], || {
            self.simple_reduce_eager(kind, dims, keepdim)
        })
    }

    fn simple_reduce_eager(
        &self,
        kind: ReduceKind,
        dims: Option<&[i64]>,
        keepdim: bool,
    ) -> Result<Tensor> {
        let rd = infer::reduce_dims(kind.name(), self.rank(), dims)?;
        let m = infer::reduce(kind, &self.meta(), &rd, keepdim)?;
        let compute = match kind {
            ReduceKind::ArgMax | ReduceKind::ArgMin => self.dtype().compute(),
            _ => m.dtype.compute(),
        };
        let body = |k: &mut KernelCall, v: &[usize]| k.cast(v[0], compute);
        let y = reduce_expr(
            kind.name(),
            kind,
            &self.meta(),
            &[self.detach()],
            dims,
            keepdim,
            m.dtype,
            body,
            |_, acc, _| vec![acc],
        )?;
        rules::reduction(kind.name(), kind, false, self, dims, y)
    }

    /// `sum(dims, keepdim)`; `None` sums everything. Integers accumulate in i64.
    pub fn sum(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.sum(dims, keepdim);
        }
        self.simple_reduce(ReduceKind::Sum, dims, keepdim)
    }

    pub fn prod(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        self.simple_reduce(ReduceKind::Prod, dims, keepdim)
    }

    /// `amax(dims, keepdim)`: NaN-propagating maximum.
    pub fn amax(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        self.simple_reduce(ReduceKind::Max, dims, keepdim)
    }

    pub fn amin(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        self.simple_reduce(ReduceKind::Min, dims, keepdim)
    }

    /// `argmax(dim, keepdim)`; `None` indexes the flattened tensor.
    pub fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceKind::ArgMax, dim, keepdim)
    }

    pub fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceKind::ArgMin, dim, keepdim)
    }

    fn arg_reduce(&self, kind: ReduceKind, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        let node = || Op::Reduce {
            kind,
            dims: dim.into_iter().collect(),
            keepdim,
        };
        trace::record(node, &[self], || match dim {
            Some(d) => self.simple_reduce(kind, Some(&[d]), keepdim),
            None => {
                let flat = self.reshape(&[-1])?;
                let r = flat.simple_reduce(kind, Some(&[0]), false)?;
                if keepdim {
                    r.reshape(&vec![1; self.rank()])
                } else {
                    Ok(r)
                }
            }
        })
    }

    /// `max(dim, keepdim)` -> (values, indices), as `torch.max(x, dim)`.
    /// Traced as two nodes (amax and argmax).
    /// The gradient of the values goes to the returned index (as PyTorch's `max.dim`).
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let x = self.detach();
        let (v, i) = (
            x.amax(Some(&[dim]), keepdim)?,
            x.argmax(Some(dim), keepdim)?,
        );
        Ok((rules::indexed("max", self, dim, &i, v)?, i))
    }

    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let x = self.detach();
        let (v, i) = (
            x.amin(Some(&[dim]), keepdim)?,
            x.argmin(Some(dim), keepdim)?,
        );
        Ok((rules::indexed("min", self, dim, &i, v)?, i))
    }

    /// `mean(dims, keepdim)` (floating inputs only, like PyTorch).
    pub fn mean(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.mean(dims, keepdim);
        }
        let node = || Op::Mean {
            dims: dims.map(<[i64]>::to_vec).unwrap_or_default(),
            keepdim,
        };
        trace::record(node, &[self], || self.mean_eager(dims, keepdim))
    }

    fn mean_eager(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!(
                "mean",
                "could not infer output dtype: input dtype must be floating point, got {}",
                self.dtype()
            );
        }
        let c = self.dtype().compute();
        let body = |k: &mut KernelCall, v: &[usize]| k.cast(v[0], c);
        let y = reduce_expr(
            "mean",
            ReduceKind::Sum,
            &self.meta(),
            &[self.detach()],
            dims,
            keepdim,
            self.dtype(),
            body,
            |k, acc, n| vec![mean_epilogue(k, acc, n, c)],
        )?;
        rules::reduction("mean", ReduceKind::Sum, true, self, dims, y)
    }
}

/// acc * (1/n), with 1/n a runtime scalar so every size shares the kernel.
pub(crate) fn mean_epilogue(k: &mut KernelCall, acc: usize, n: usize, dt: DType) -> usize {
    let inv = k.scalar(1.0 / n as f64, dt);
    k.binary(BinaryOp::Mul, acc, inv, dt)
}
