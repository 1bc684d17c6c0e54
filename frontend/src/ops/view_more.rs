//! Layout ops and copies built from the primitive views: `tril`/`triu`,
//! `flip`, `roll`, `repeat`/`tile`, `repeat_interleave`, `unflatten`,
//! `movedim`, `diag_embed`, `unbind`, `tensor_split`, `narrow_copy`,
//! `expand_as`/`broadcast_to`, `meshgrid`. Views stay views (same storage,
//! PyTorch's strides); the copying ones (flip, roll, repeat) are one gather,
//! cat or expand-and-copy each, so their gradients and traces are those of
//! the primitives. Index vectors depend only on shapes, never on values.

use super::scan::positions;
use crate::Tensor;
use kiln_ir::shape::{fmt_dims, norm_dim};
use kiln_ir::{bail, BinaryOp, DType, Result};

/// `v` as an i64 index tensor on `x`'s device.
pub(crate) fn index_on(x: &Tensor, v: Vec<i64>) -> Result<Tensor> {
    let n = v.len();
    Tensor::from_vec(v, &[n])?.to_device(x.device())
}

impl Tensor {
    /// The lower (`upper`: upper) triangle of the last two dims: entries with
    /// `j - i <= diagonal` (`>=`) kept, the others 0.
    fn triangle(&self, op: &str, diagonal: i64, upper: bool) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            bail!(
                op,
                "input must have at least 2 dims, got shape {}",
                fmt_dims(self.dims())
            );
        }
        let (n, m) = (self.dims()[r - 2], self.dims()[r - 1]);
        let i = positions(self, n, r, r - 2)?;
        let j = positions(self, m, r, r - 1)?;
        let off = j.sub(&i)?;
        let keep = if upper {
            off.binary_scalar(BinaryOp::Ge, diagonal, false)?
        } else {
            off.binary_scalar(BinaryOp::Le, diagonal, false)?
        };
        Tensor::where_scalar(&keep, self, 0)
    }

    /// `torch.tril(x, diagonal)`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.tril(0)?.to_vec::<f32>()?, vec![1.0, 0.0, 3.0, 4.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("tril", diagonal, false)
    }

    /// `torch.triu(x, diagonal)`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.triu(0)?.to_vec::<f32>()?, vec![1.0, 2.0, 0.0, 4.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("triu", diagonal, true)
    }

    /// Runs `f` on `self` permuted so its strides decrease (its memory
    /// order) with `dims` renumbered to match, and permutes the result back:
    /// a copy made by `f` then keeps the input's layout, as PyTorch's
    /// `empty_like` does (a flipped transpose is still transposed).
    fn in_memory_order(
        &self,
        dims: &[usize],
        f: impl FnOnce(&Tensor, &[usize]) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let r = self.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.sort_by_key(|&k| std::cmp::Reverse(self.strides()[k]));
        let mut inv = vec![0i64; r];
        for (at, &k) in perm.iter().enumerate() {
            inv[k] = at as i64;
        }
        let mapped: Vec<usize> = dims.iter().map(|&d| inv[d] as usize).collect();
        let p: Vec<i64> = perm.iter().map(|&k| k as i64).collect();
        f(&self.permute(&p)?, &mapped)?.permute(&inv)
    }

    /// `torch.flip(x, dims)`: a copy with the order of `dims` reversed.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.flip(&[0])?.to_vec::<f32>()?, vec![3.0, 2.0, 1.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        let ds = dims
            .iter()
            .map(|&d| norm_dim("flip", d, self.rank()))
            .collect::<Result<Vec<_>>>()?;
        self.in_memory_order(&ds, |x, ds| {
            let mut y = x.clone();
            for &d in ds {
                let n = x.dims()[d] as i64;
                y = y.index_select(d as i64, &index_on(x, (0..n).rev().collect())?)?;
            }
            if ds.is_empty() {
                y = y.copy()?;
            }
            Ok(y)
        })
    }

    /// `torch.roll(x, shifts, dims)`: elements shifted along `dims` (each
    /// shift wrapping around); without dims, over the flattened tensor.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.roll(&[1], &[])?.to_vec::<f32>()?, vec![3.0, 1.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        if dims.is_empty() {
            if shifts.len() != 1 {
                bail!(
                    "roll",
                    "{} shifts without dims (expected one)",
                    shifts.len()
                );
            }
            let flat = self.reshape(&[-1])?.roll(shifts, &[0])?;
            return flat.reshape_dims(self.dims());
        }
        if shifts.len() != dims.len() {
            bail!("roll", "{} shifts for {} dims", shifts.len(), dims.len());
        }
        let mut y = self.clone();
        for (&s, &d) in shifts.iter().zip(dims) {
            let d = norm_dim("roll", d, self.rank())?;
            let n = self.dims()[d] as i64;
            if n == 0 {
                continue;
            }
            let s = s.rem_euclid(n);
            let idx = index_on(self, (0..n).map(|k| (k - s).rem_euclid(n)).collect())?;
            y = y.index_select(d as i64, &idx)?;
        }
        Ok(y)
    }

    /// `x.repeat(repeats)`: `x` tiled `repeats[k]` times along dim k (extra
    /// leading repeats add dims); a contiguous copy.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.repeat(&[2])?.to_vec::<f32>()?, vec![1.0, 2.0, 1.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        if repeats.len() < self.rank() {
            bail!(
                "repeat",
                "{} repeats for a tensor of shape {} (need at least one per dim)",
                repeats.len(),
                fmt_dims(self.dims())
            );
        }
        let lead = repeats.len() - self.rank();
        let mut dims = vec![1usize; lead];
        dims.extend_from_slice(self.dims());
        // [.., 1, d_k, ..] expanded to [.., r_k, d_k, ..], then merged
        let (mut split, mut wide, mut out) = (vec![], vec![], vec![]);
        for (&r, &d) in repeats.iter().zip(&dims) {
            split.extend([1, d as i64]);
            wide.extend([r as i64, d as i64]);
            out.push((r * d) as i64);
        }
        self.reshape(&split)?
            .expand(&wide)?
            .contiguous()?
            .reshape(&out)
    }

    /// `torch.tile(x, dims)`: [`Tensor::repeat`] with missing leading repeats taken as 1.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
    /// assert_eq!(x.tile(&[2])?.dims(), &[1, 4]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn tile(&self, dims: &[usize]) -> Result<Tensor> {
        let mut reps = vec![1usize; self.rank().saturating_sub(dims.len())];
        reps.extend_from_slice(dims);
        self.repeat(&reps)
    }

    /// `torch.repeat_interleave(x, repeats, dim)` with one repeat count for
    /// every element: each element repeated in place; `dim` None flattens.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.repeat_interleave(2, None)?.to_vec::<f32>()?, vec![1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn repeat_interleave(&self, repeats: usize, dim: Option<i64>) -> Result<Tensor> {
        let Some(dim) = dim else {
            return self.reshape(&[-1])?.repeat_interleave(repeats, Some(0));
        };
        let d = norm_dim("repeat_interleave", dim, self.rank())?;
        let mut wide: Vec<i64> = self.dims().iter().map(|&s| s as i64).collect();
        let mut out = wide.clone();
        wide.insert(d + 1, repeats as i64);
        out[d] *= repeats as i64;
        self.unsqueeze(d as i64 + 1)?
            .expand(&wide)?
            .contiguous()?
            .reshape(&out)
    }

    /// `torch.repeat_interleave(x, repeats, dim, output_size)` with a count
    /// per slice along `dim`. Output position `q` takes slice `#{k: cum[k] <=
    /// q}` (`cum` the running total of `repeats`), one comparison reduction
    /// on the device; without `output_size` the total is read back first,
    /// which a trace cannot do (its shape depends on the values).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let r = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// assert_eq!(x.repeat_interleave_tensor(&r, 0, None)?.to_vec::<f32>()?, vec![1.0, 2.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn repeat_interleave_tensor(
        &self,
        repeats: &Tensor,
        dim: i64,
        output_size: Option<usize>,
    ) -> Result<Tensor> {
        let d = norm_dim("repeat_interleave", dim, self.rank())?;
        let n = self.dims()[d];
        if repeats.rank() != 1 || repeats.dims()[0] != n || repeats.dtype().is_float() {
            bail!(
                "repeat_interleave",
                "repeats must be a 1-D integer tensor of {n} counts (dim {d} of shape {}), got {} {}",
                fmt_dims(self.dims()),
                repeats.dtype(),
                fmt_dims(repeats.dims())
            );
        }
        let cum = repeats.to_dtype(DType::I64)?.cumsum(0, None)?;
        let total = match output_size {
            Some(t) => t,
            None => {
                let why = super::nonzero::DATA_DEPENDENT;
                crate::compile::trace::unsupported("repeat_interleave", why)?;
                if n == 0 {
                    0
                } else {
                    cum.select(0, n as i64 - 1)?.item()? as usize
                }
            }
        };
        let q = positions(self, total, 2, 0)?;
        let src = cum.reshape(&[1, n as i64])?.le(&q)?.to_dtype(DType::I64)?;
        let src = src.sum(Some(&[1]), false)?;
        self.index_select(d as i64, &src)
    }

    /// `torch.unflatten(x, dim, sizes)`: dim `dim` split into `sizes` (one may be -1); a view.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 12], kiln_frontend::DType::F32);
    /// assert_eq!(x.unflatten(1, &[3, -1])?.dims(), &[2, 3, 4]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn unflatten(&self, dim: i64, sizes: &[i64]) -> Result<Tensor> {
        let d = norm_dim("unflatten", dim, self.rank())?;
        let inner = kiln_ir::op::view::infer_size("unflatten", sizes, self.dims()[d], &[])?;
        let mut shape: Vec<i64> = self.dims()[..d].iter().map(|&s| s as i64).collect();
        shape.extend(inner.iter().map(|&s| s as i64));
        shape.extend(self.dims()[d + 1..].iter().map(|&s| s as i64));
        self.reshape(&shape)
    }

    /// `torch.movedim(x, source, destination)`: a permutation view.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3, 4], kiln_frontend::DType::F32);
    /// assert_eq!(x.movedim(&[0], &[2])?.dims(), &[3, 4, 2]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn movedim(&self, source: &[i64], destination: &[i64]) -> Result<Tensor> {
        let r = self.rank();
        if source.len() != destination.len() {
            bail!(
                "movedim",
                "{} source dims for {} destinations",
                source.len(),
                destination.len()
            );
        }
        let src = source
            .iter()
            .map(|&d| norm_dim("movedim", d, r))
            .collect::<Result<Vec<_>>>()?;
        let dst = destination
            .iter()
            .map(|&d| norm_dim("movedim", d, r))
            .collect::<Result<Vec<_>>>()?;
        if (1..src.len()).any(|k| src[..k].contains(&src[k])) {
            bail!("movedim", "source dims {source:?} repeat a dim");
        }
        let mut perm: Vec<Option<usize>> = vec![None; r];
        for (&s, &t) in src.iter().zip(&dst) {
            if perm[t].replace(s).is_some() {
                bail!("movedim", "destination dim {t} repeated");
            }
        }
        let mut rest = (0..r).filter(|k| !src.contains(k));
        let p: Vec<i64> = perm
            .into_iter()
            .map(|p| p.or_else(|| rest.next()).unwrap() as i64)
            .collect();
        self.permute(&p)
    }

    /// `torch.unbind(x, dim)`: the slices along `dim`, each a view.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3], kiln_frontend::DType::F32);
    /// assert_eq!(x.unbind(1)?.len(), 3);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("unbind", dim, self.rank())?;
        (0..self.dims()[d] as i64)
            .map(|i| self.select(d as i64, i))
            .collect()
    }

    /// `torch.tensor_split(x, sections, dim)`: `sections` views, the first
    /// `n % sections` one element longer (7 in 3: 3, 2, 2).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[7], kiln_frontend::DType::F32);
    /// let parts = x.tensor_split(3, 0)?;
    /// assert_eq!(parts.iter().map(|p| p.dims()[0]).collect::<Vec<_>>(), vec![3, 2, 2]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn tensor_split(&self, sections: usize, dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("tensor_split", dim, self.rank())?;
        if sections == 0 {
            bail!("tensor_split", "number of sections must be larger than 0");
        }
        let n = self.dims()[d];
        let (q, r) = (n / sections, n % sections);
        let mut at = vec![];
        let mut start = 0;
        for k in 0..sections - 1 {
            start += q + usize::from(k < r);
            at.push(start as i64);
        }
        self.tensor_split_at(&at, dim)
    }

    /// `torch.tensor_split(x, indices, dim)`: views cut before each index
    /// (indices clamp to the dim; a later index before an earlier gives an empty piece).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[7], kiln_frontend::DType::F32);
    /// let parts = x.tensor_split_at(&[1, 4], 0)?;
    /// assert_eq!(parts.iter().map(|p| p.dims()[0]).collect::<Vec<_>>(), vec![1, 3, 3]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn tensor_split_at(&self, indices: &[i64], dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("tensor_split", dim, self.rank())?;
        let n = self.dims()[d] as i64;
        let clamp = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let mut bounds = vec![0];
        bounds.extend(indices.iter().map(|&i| clamp(i)));
        bounds.push(n);
        bounds
            .windows(2)
            .map(|w| {
                let len = (w[1] - w[0]).max(0) as usize;
                self.narrow(d as i64, w[0].min(n), len)
            })
            .collect()
    }

    /// `torch.narrow_copy(x, dim, start, length)`: a contiguous copy of the narrowed view.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[4, 5], kiln_frontend::DType::F32);
    /// let y = x.narrow_copy(1, 1, 3)?;
    /// assert!(y.is_contiguous() && !y.shares_storage(&x));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn narrow_copy(&self, dim: i64, start: i64, length: usize) -> Result<Tensor> {
        self.narrow(dim, start, length)?.copy()
    }

    /// `x.expand_as(other)`: a broadcast view of `other`'s shape.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3, 1], kiln_frontend::DType::F32);
    /// let o = Tensor::zeros(&[2, 3, 4], kiln_frontend::DType::F32);
    /// assert_eq!(x.expand_as(&o)?.strides(), &[0, 1, 0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        self.broadcast_to(other.dims())
    }

    /// `torch.broadcast_to(x, size)`: a broadcast view.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::zeros(&[3, 1], kiln_frontend::DType::F32);
    /// assert_eq!(x.broadcast_to(&[2, 3, 4])?.dims(), &[2, 3, 4]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn broadcast_to(&self, size: &[usize]) -> Result<Tensor> {
        let s: Vec<i64> = size.iter().map(|&d| d as i64).collect();
        self.expand(&s)
    }

    /// `torch.meshgrid(tensors, indexing)`: 1-D tensors broadcast to the
    /// grid, each a view; `xy` swaps the first two grid dims.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let a = Tensor::zeros(&[3], kiln_frontend::DType::F32);
    /// let b = Tensor::zeros(&[4], kiln_frontend::DType::F32);
    /// let g = Tensor::meshgrid(&[&a, &b], false)?;
    /// assert_eq!(g[0].dims(), &[3, 4]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn meshgrid(tensors: &[&Tensor], xy: bool) -> Result<Vec<Tensor>> {
        let mut sizes = vec![];
        for t in tensors {
            if t.rank() > 1 {
                bail!(
                    "meshgrid",
                    "expects 0-D or 1-D tensors, got shape {}",
                    fmt_dims(t.dims())
                );
            }
            sizes.push(t.numel());
        }
        // the grid dim of tensor k (xy: the first two swap)
        let axis = |k: usize| match k {
            0 | 1 if xy && tensors.len() > 1 => 1 - k,
            k => k,
        };
        let grid: Vec<usize> = (0..sizes.len()).map(|a| sizes[axis(a)]).collect();
        tensors
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let mut shape = vec![1usize; sizes.len()];
                shape[axis(k)] = sizes[k];
                t.reshape_dims(&shape)?.broadcast_to(&grid)
            })
            .collect()
    }
}
