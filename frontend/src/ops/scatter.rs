//! Writes at indices — `scatter` (src, value, legacy `reduce=`),
//! `scatter_reduce` (sum, prod, mean, amax, amin; `include_self` both ways),
//! `scatter_add`, `index_add`/`index_copy`/`index_fill`, `index_put`,
//! `masked_scatter` — as one windowed reduction: output position `p` along
//! `dim` reduces the `src` entries whose index is `p` (the others replaced
//! by the reduction's identity), over a view of `src` with a broadcast `p`
//! axis. `include_self` adds the input as one more candidate per position,
//! so amax/amin ties share the gradient with it as in PyTorch. Without a
//! gradient it is one generated kernel through the fusing builder (CPU and
//! CUDA C); with one, or while tracing, recorded primitives whose rules give
//! the gradients. Positions `p` times entries `j` are visited (O(P x J) per
//! line, as the device scatter-add). Duplicate indices under plain `scatter`
//! sum (PyTorch leaves their order unspecified).

use super::composite::fused_or_recorded;
use super::scan::positions;
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::shape::{fmt_dims, norm_dim};
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};
use kiln_passes::decompose::Builder;

/// How [`Tensor::scatter_reduce`] combines the values written to one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduce {
    Sum,
    Prod,
    Mean,
    Amax,
    Amin,
}

impl ScatterReduce {
    /// PyTorch's name (`"sum"`, `"prod"`, `"mean"`, `"amax"`, `"amin"`).
    pub fn parse(s: &str) -> Result<ScatterReduce> {
        Ok(match s {
            "sum" | "add" => ScatterReduce::Sum,
            "prod" | "multiply" => ScatterReduce::Prod,
            "mean" => ScatterReduce::Mean,
            "amax" => ScatterReduce::Amax,
            "amin" => ScatterReduce::Amin,
            _ => bail!(
                "scatter_reduce",
                "unknown reduce {s:?} (sum, prod, mean, amax, amin)"
            ),
        })
    }

    /// The reduction and the identity masked entries take.
    fn kind(self) -> (ReduceKind, f64) {
        match self {
            ScatterReduce::Sum | ScatterReduce::Mean => (ReduceKind::Sum, 0.0),
            ScatterReduce::Prod => (ReduceKind::Prod, 1.0),
            ScatterReduce::Amax => (ReduceKind::Max, f64::NEG_INFINITY),
            ScatterReduce::Amin => (ReduceKind::Min, f64::INFINITY),
        }
    }
}

/// Reduces `src` (its entry `j` on axis `d + 1`) into positions `pos` (axis
/// `d`) where `index == pos`; `fill` elsewhere (`count`: the hits, as `dt`).
fn windowed_scatter<B: Builder>(
    b: &mut B,
    (index, src, pos): (&B::T, &B::T, &B::T),
    d: usize,
    kind: ReduceKind,
    fill: f64,
    count: Option<DType>,
) -> Result<B::T> {
    let hit = b.binary(BinaryOp::Eq, index, pos)?;
    let v = match count {
        Some(dt) => b.cast(&hit, dt)?,
        None => b.select_scalar(&hit, src, fill)?,
    };
    b.reduce(kind, &v, &[d as i64 + 1], false)
}

/// `t` grown to `dims` off `d` (its own extent kept along `d`) with `value`.
fn pad_region(t: &Tensor, dims: &[usize], d: usize, value: f64) -> Result<Tensor> {
    // F.pad's (before, after) pairs from the last dim: nothing before
    let pads: Vec<i64> = (0..dims.len())
        .rev()
        .flat_map(|k| {
            [
                0,
                if k == d {
                    0
                } else {
                    (dims[k] - t.dims()[k]) as i64
                },
            ]
        })
        .collect();
    crate::functional::pad(t, &pads, crate::nn::PaddingMode::Zeros, value)
}

/// `index` with every value checked to lie in `0..size` (dim `d` of an
/// input of `shape`, when known), else an error naming `op`, the index and
/// the size. While tracing it records an [`Op::IndexBounds`] node (a copy of
/// the index that checks on every run), so a compiled windowed scatter
/// cannot drop an out-of-range index silently; eagerly it reads the
/// extremes back and returns `index` itself.
pub(crate) fn checked_index(
    op: &'static str,
    d: usize,
    size: usize,
    index: &Tensor,
    shape: Option<&[usize]>,
) -> Result<Tensor> {
    let node = || Op::IndexBounds { op, dim: d, size };
    crate::compile::trace::record(node, &[index], || {
        check_index_values(op, d, size, index, shape)?;
        if crate::compile::trace::is_tracing() {
            index.copy()
        } else {
            Ok(index.clone())
        }
    })
}

/// The host check of [`checked_index`] (also what the graph node runs).
pub(crate) fn check_index_values(
    op: &str,
    d: usize,
    size: usize,
    index: &Tensor,
    shape: Option<&[usize]>,
) -> Result<()> {
    if index.numel() == 0 {
        return Ok(());
    }
    let (lo, hi) = (
        index.amin(None, false)?.item()?,
        index.amax(None, false)?.item()?,
    );
    if lo < 0.0 || hi >= size as f64 {
        let bad = if lo < 0.0 { lo } else { hi };
        let input = shape.map_or(String::new(), |s| format!(" (input shape {})", fmt_dims(s)));
        bail!(
            op,
            "index {bad} is out of bounds for dimension {d} with size {size}{input}"
        );
    }
    Ok(())
}

impl Tensor {
    /// Checks `index` (i64, rank of `self`, within `src` and, off `dim`, `self`)
    /// and returns it with its values checked against the size of `dim`:
    /// read back eagerly, and while tracing through an `index_bounds` node
    /// that checks them on every run of the compiled graph.
    fn check_scatter(
        &self,
        op: &'static str,
        d: usize,
        index: &Tensor,
        src: &Tensor,
    ) -> Result<Tensor> {
        let fits = |t: &Tensor, skip: Option<usize>| {
            (0..index.rank()).all(|k| Some(k) == skip || index.dims()[k] <= t.dims()[k])
        };
        if index.dtype() != DType::I64
            || index.rank() != self.rank()
            || src.rank() != self.rank()
            || !fits(src, None)
            || !fits(self, Some(d))
        {
            bail!(
                op,
                "index must be i64 of the input's rank and no larger than src (and the input off dim {d}): input {} {}, index {} {}, src {}",
                self.dtype(),
                fmt_dims(self.dims()),
                index.dtype(),
                fmt_dims(index.dims()),
                fmt_dims(src.dims())
            );
        }
        checked_index(op, d, self.dims()[d], index, Some(self.dims()))
    }

    /// `torch.scatter_reduce(x, dim, index, src, reduce, include_self)`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// use kiln_frontend::ScatterReduce;
    /// let x = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// let i = Tensor::from_vec(vec![0i64, 0, 1], &[3])?;
    /// let s = Tensor::from_vec(vec![2.0f32, 3.0, 4.0], &[3])?;
    /// let y = x.scatter_reduce(0, &i, &s, ScatterReduce::Sum, true)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![6.0, 5.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        self.scatter_reduce_as("scatter_reduce", dim, index, src, reduce, include_self)
    }

    /// [`Tensor::scatter_reduce`] on behalf of `op` (the name its errors carry).
    fn scatter_reduce_as(
        &self,
        op: &'static str,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        let d = norm_dim(op, dim, self.rank())?;
        let index = &self.check_scatter(op, d, index, src)?;
        let mut src = src.to_dtype(self.dtype())?;
        for k in 0..index.rank() {
            src = src.narrow(k as i64, 0, index.dims()[k])?;
        }
        let (mut idx, mut src) = (
            pad_region(index, self.dims(), d, -1.0)?,
            pad_region(&src, self.dims(), d, 0.0)?,
        );
        if include_self {
            // the input as one more candidate at its own position
            let own = positions(self, self.dims()[d], self.rank(), d)?.expand_to(self.dims())?;
            idx = Tensor::cat(&[&own, &idx], d as i64)?;
            src = Tensor::cat(&[self, &src], d as i64)?;
        }
        let (iw, sw) = (idx.unsqueeze(d as i64)?, src.unsqueeze(d as i64)?);
        let pos = positions(self, self.dims()[d], self.rank() + 1, d)?;
        let (kind, fill) = reduce.kind();
        let v = fused_or_recorded!(&[&sw], |b, cv| windowed_scatter(
            b,
            (&cv(&iw), &cv(&sw), &cv(&pos)),
            d,
            kind,
            fill,
            None
        ))?;
        let dt = self.dtype();
        let count = fused_or_recorded!(&[], |b, cv| windowed_scatter(
            b,
            (&cv(&iw), &cv(&sw), &cv(&pos)),
            d,
            ReduceKind::Sum,
            0.0,
            Some(dt)
        ))?;
        let v = if reduce == ScatterReduce::Mean {
            v.div(&count.maximum(&Tensor::ones(&[], dt).to_device(self.device())?)?)?
        } else {
            v
        };
        if include_self {
            return Ok(v);
        }
        let hit = count.binary_scalar(BinaryOp::Gt, 0.0, false)?;
        Tensor::where_(&hit, &v, self)
    }

    /// `torch.scatter(x, dim, index, src)`: `src[.., j, ..]` written at
    /// `index[.., j, ..]` along `dim`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![2i64], &[1])?;
    /// let s = Tensor::from_vec(vec![5.0f32], &[1])?;
    /// assert_eq!(x.scatter(0, &i, &s)?.to_vec::<f32>()?, vec![0.0, 0.0, 5.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_reduce_as("scatter", dim, index, src, ScatterReduce::Sum, false)
    }

    /// `torch.scatter(x, dim, index, value)`: `value` written at `index`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![0i64], &[1])?;
    /// assert_eq!(x.scatter_value(0, &i, 9.0)?.to_vec::<f32>()?, vec![9.0, 0.0, 0.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn scatter_value(&self, dim: i64, index: &Tensor, value: f64) -> Result<Tensor> {
        let src = Tensor::full(index.dims(), value, self.dtype()).to_device(self.device())?;
        self.scatter(dim, index, &src)
    }

    /// `torch.scatter_add(x, dim, index, src)`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[2], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![1i64, 1], &[2])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.scatter_add(0, &i, &s)?.to_vec::<f32>()?, vec![0.0, 3.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_reduce_as("scatter_add", dim, index, src, ScatterReduce::Sum, true)
    }

    /// A 1-D `index` along `dim` as a full index of `source`'s shape.
    fn index_along(
        &self,
        op: &str,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
    ) -> Result<(usize, Tensor)> {
        let d = norm_dim(op, dim, self.rank())?;
        if index.rank() > 1 || index.dtype().is_float() || source.rank() != self.rank() {
            bail!(
                op,
                "index must be a 1-D integer tensor and source of the input's rank: input {}, index {} {}, source {}",
                fmt_dims(self.dims()),
                index.dtype(),
                fmt_dims(index.dims()),
                fmt_dims(source.dims())
            );
        }
        let mut shape = vec![1usize; self.rank()];
        shape[d] = index.numel();
        let idx = index.to_dtype(DType::I64)?.reshape_dims(&shape)?;
        Ok((d, idx.expand_to(source.dims())?))
    }

    /// `torch.index_add(x, dim, index, source, alpha)`: `alpha * source`
    /// slices added at the positions `index` along `dim`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![2i64, 2], &[2])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.index_add(0, &i, &s, 2.0)?.to_vec::<f32>()?, vec![0.0, 0.0, 6.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn index_add(
        &self,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
        alpha: f64,
    ) -> Result<Tensor> {
        let (d, idx) = self.index_along("index_add", dim, index, source)?;
        let src = if alpha == 1.0 {
            source.clone()
        } else {
            source.mul_scalar(alpha)?
        };
        self.scatter_reduce_as("index_add", d as i64, &idx, &src, ScatterReduce::Sum, true)
    }

    /// `torch.index_copy(x, dim, index, source)`: `source` slices written at `index`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![1i64], &[1])?;
    /// let s = Tensor::from_vec(vec![4.0f32], &[1])?;
    /// assert_eq!(x.index_copy(0, &i, &s)?.to_vec::<f32>()?, vec![0.0, 4.0, 0.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn index_copy(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let (d, idx) = self.index_along("index_copy", dim, index, source)?;
        self.scatter_reduce_as(
            "index_copy",
            d as i64,
            &idx,
            source,
            ScatterReduce::Sum,
            false,
        )
    }

    /// `torch.index_fill(x, dim, index, value)`: the slices `index` along `dim` set to `value`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let i = Tensor::from_vec(vec![0i64, 2], &[2])?;
    /// assert_eq!(x.index_fill(0, &i, -1.0)?.to_vec::<f32>()?, vec![-1.0, 0.0, -1.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn index_fill(&self, dim: i64, index: &Tensor, value: f64) -> Result<Tensor> {
        let d = norm_dim("index_fill", dim, self.rank())?;
        if index.rank() > 1 || index.dtype().is_float() {
            bail!(
                "index_fill",
                "index must be a 1-D integer tensor, got {} {}",
                index.dtype(),
                fmt_dims(index.dims())
            );
        }
        let n = self.dims()[d];
        let p = positions(self, n, 2, 0)?;
        let idx = index.to_dtype(DType::I64)?.reshape(&[1, -1])?;
        let hit = idx.eq(&p)?.to_dtype(DType::I64)?.amax(Some(&[1]), false)?;
        let mut shape = vec![1usize; self.rank()];
        shape[d] = n;
        let keep = hit
            .binary_scalar(BinaryOp::Eq, 0i64, false)?
            .reshape_dims(&shape)?;
        Tensor::where_scalar(&keep, self, value)
    }

    /// `torch.index_put(x, indices, values, accumulate)`: `x[i0, i1, ..] =
    /// values` (or `+=` with `accumulate`), the index tensors broadcast
    /// together over the leading dims; negative indices count from the end.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 2], kiln_frontend::DType::F32);
    /// let (i, j) = (Tensor::from_vec(vec![1i64], &[1])?, Tensor::from_vec(vec![0i64], &[1])?);
    /// let v = Tensor::from_vec(vec![3.0f32], &[1])?;
    /// assert_eq!(x.index_put(&[&i, &j], &v, false)?.to_vec::<f32>()?, vec![0.0, 0.0, 3.0, 0.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn index_put(
        &self,
        indices: &[&Tensor],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let k = indices.len();
        if k == 0 || k > self.rank() {
            bail!(
                "index_put",
                "{k} index tensors for an input of shape {}",
                fmt_dims(self.dims())
            );
        }
        // one row index into the leading k dims merged
        let mut lin: Option<Tensor> = None;
        for (a, ix) in indices.iter().enumerate() {
            let n = self.dims()[a] as i64;
            let ix = ix.to_dtype(DType::I64)?;
            let neg = ix.binary_scalar(BinaryOp::Lt, 0i64, false)?;
            let ix = Tensor::where_(&neg, &ix.add_scalar(n)?, &ix)?;
            lin = Some(match lin {
                None => ix,
                Some(l) => l.mul_scalar(n)?.add(&ix)?,
            });
        }
        let lin = lin.expect("one index").reshape(&[-1])?;
        let rest: Vec<usize> = self.dims()[k..].to_vec();
        let rows: usize = self.dims()[..k].iter().product();
        let mut flat_dims = vec![rows];
        flat_dims.extend(&rest);
        let mut vd = vec![lin.numel()];
        vd.extend(&rest);
        let vals = values.to_dtype(self.dtype())?.expand_to(&vd)?;
        let mut at = vec![1usize; vd.len()];
        at[0] = lin.numel();
        let idx = lin.reshape_dims(&at)?.expand_to(&vd)?;
        let flat = self.reshape_dims(&flat_dims)?;
        let out = if accumulate {
            flat.scatter_add(0, &idx, &vals)?
        } else {
            flat.scatter(0, &idx, &vals)?
        };
        out.reshape_dims(self.dims())
    }

    /// `torch.masked_scatter(x, mask, source)`: the positions where `mask`
    /// (broadcast to `x`) is true take `source`'s elements in order.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let m = Tensor::from_vec(vec![true, false, true], &[3])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.masked_scatter(&m, &s)?.to_vec::<f32>()?, vec![1.0, 0.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn masked_scatter(&self, mask: &Tensor, source: &Tensor) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            bail!("masked_scatter", "mask must be bool, got {}", mask.dtype());
        }
        let m = mask.expand_to(self.dims())?.reshape(&[-1])?;
        // the k-th true position takes source element k
        let k = m.to_dtype(DType::I64)?.cumsum(0, None)?.sub_scalar(1)?;
        let n = source.numel() as i64;
        if !crate::compile::trace::is_tracing() && m.numel() > 0 {
            let need = k.select(0, m.numel() as i64 - 1)?.item()? as i64 + 1;
            if need > n {
                bail!(
                    "masked_scatter",
                    "mask has {need} true elements but source has only {n} ({})",
                    fmt_dims(source.dims())
                );
            }
        }
        let k = k.clamp(Some(0.0), Some((n - 1).max(0) as f64))?;
        let vals = source
            .to_dtype(self.dtype())?
            .reshape(&[-1])?
            .gather(0, &k)?;
        let flat = self.reshape(&[-1])?;
        Tensor::where_(&m, &vals, &flat)?.reshape_dims(self.dims())
    }

    /// `torch.take(x, index)`: elements of the flattened `x` (negative
    /// indices count from the end), in `index`'s shape.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let i = Tensor::from_vec(vec![-1i64, 0], &[2])?;
    /// assert_eq!(x.take(&i)?.to_vec::<f32>()?, vec![3.0, 1.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn take(&self, index: &Tensor) -> Result<Tensor> {
        let n = self.numel() as i64;
        let i = index.to_dtype(DType::I64)?.reshape(&[-1])?;
        let neg = i.binary_scalar(BinaryOp::Lt, 0i64, false)?;
        let i = Tensor::where_(&neg, &i.add_scalar(n)?, &i)?;
        self.reshape(&[-1])?
            .gather(0, &i)?
            .reshape_dims(index.dims())
    }

    /// `torch.take_along_dim(x, indices, dim)`: gather with `x` and
    /// `indices` broadcast to each other off `dim`; `dim` None works on the
    /// flattened tensors.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let i = Tensor::from_vec(vec![1i64], &[1, 1])?;
    /// assert_eq!(x.take_along_dim(&i, Some(1))?.to_vec::<f32>()?, vec![2.0, 4.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn take_along_dim(&self, indices: &Tensor, dim: Option<i64>) -> Result<Tensor> {
        let Some(dim) = dim else {
            return self.reshape(&[-1])?.gather(0, &indices.reshape(&[-1])?);
        };
        let d = norm_dim("take_along_dim", dim, self.rank())?;
        if indices.rank() != self.rank() {
            bail!(
                "take_along_dim",
                "indices of shape {} for an input of shape {}",
                fmt_dims(indices.dims()),
                fmt_dims(self.dims())
            );
        }
        let mut xd = self.dims_vec();
        let mut id = indices.dims_vec();
        for k in (0..self.rank()).filter(|&k| k != d) {
            let b = xd[k].max(id[k]);
            if (xd[k] != b && xd[k] != 1) || (id[k] != b && id[k] != 1) {
                bail!(
                    "take_along_dim",
                    "shapes {} and {} do not broadcast off dim {d}",
                    fmt_dims(self.dims()),
                    fmt_dims(indices.dims())
                );
            }
            xd[k] = b;
            id[k] = b;
        }
        self.expand_to(&xd)?.gather(dim, &indices.expand_to(&id)?)
    }
}
