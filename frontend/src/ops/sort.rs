//! Sorting along one dim — `sort`, `argsort`, `topk`, `kthvalue`, `median`,
//! `nanmedian`, `mode` — by counting: the rank of element `i` is how many
//! `j` sort before it (smaller, or equal with a smaller index: a stable
//! sort; NaN sorts above +inf, as in PyTorch), one windowed reduction over
//! the scan view of [`super::scan::Window`]; the permutation is a second
//! one (`out[p]` = the `i` whose rank is `p`). Each is one generated kernel
//! (CPU and CUDA C), O(n^2) per row and free of data-dependent control flow;
//! while tracing they are recorded primitives that `compile` fuses the same
//! way. Sorted values are `x.gather(dim, indices)`, so every gradient here
//! is gather's (scatter-add to the chosen positions).

use super::composite::fused_or_recorded;
use super::scan::{positions, Window};
use crate::Tensor;
use kiln_ir::shape::{fmt_dims, norm_dim};
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};
use kiln_passes::decompose::Builder;

/// `a` sorts strictly before `b` in ascending order, NaN last.
fn before<B: Builder>(b: &mut B, a: &B::T, c: &B::T) -> Result<B::T> {
    let lt = b.binary(BinaryOp::Lt, a, c)?;
    let a_num = b.binary(BinaryOp::Eq, a, a)?;
    let c_nan = b.binary(BinaryOp::Ne, c, c)?;
    let nan_last = b.binary(BinaryOp::And, &a_num, &c_nan)?;
    b.binary(BinaryOp::Or, &lt, &nan_last)
}

/// `a` and `c` are equal keys (NaN equals NaN).
fn same_key<B: Builder>(b: &mut B, a: &B::T, c: &B::T) -> Result<B::T> {
    let eq = b.binary(BinaryOp::Eq, a, c)?;
    let a_nan = b.binary(BinaryOp::Ne, a, a)?;
    let c_nan = b.binary(BinaryOp::Ne, c, c)?;
    let both = b.binary(BinaryOp::And, &a_nan, &c_nan)?;
    b.binary(BinaryOp::Or, &eq, &both)
}

/// The stable sorting permutation along axis `d` of `xi` (`x` with a size-1
/// axis at `d + 1`) given the window `(xj, pi, pj)` of the same `x`.
fn permutation<B: Builder>(
    b: &mut B,
    (xi, xj, pi, pj): (&B::T, &B::T, &B::T, &B::T),
    d: usize,
    descending: bool,
) -> Result<B::T> {
    let axis = [d as i64 + 1];
    // rank[i] = #{j: x_j sorts before x_i, or ties it with j < i}
    let earlier = if descending {
        before(b, xi, xj)?
    } else {
        before(b, xj, xi)?
    };
    let tie = same_key(b, xj, xi)?;
    let lower = b.binary(BinaryOp::Lt, pj, pi)?;
    let tie_first = b.binary(BinaryOp::And, &tie, &lower)?;
    let counts = b.binary(BinaryOp::Or, &earlier, &tie_first)?;
    let counts = b.cast(&counts, DType::I64)?;
    let rank = b.reduce(ReduceKind::Sum, &counts, &axis, false)?;
    // out[p] = the i with rank[i] == p: rank's i moves to axis d + 1
    let mut at: Vec<i64> = b.dims(&rank).iter().map(|&s| s as i64).collect();
    at.insert(d, 1);
    let ranks = b.reshape(&rank, &at)?;
    let hit = b.binary(BinaryOp::Eq, &ranks, pi)?;
    let i = b.select_scalar(&hit, pj, 0.0)?;
    b.reduce(ReduceKind::Sum, &i, &axis, false)
}

impl Tensor {
    /// `torch.argsort(x, dim, descending, stable)`: always stable (ties keep
    /// their order, which an unstable sort may also give); NaN sorts last
    /// ascending, first descending.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0], &[3])?;
    /// assert_eq!(x.argsort(0, false)?.to_vec::<i64>()?, vec![1, 2, 0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        let d = norm_dim("argsort", dim, self.rank())?;
        if self.rank() == 0 {
            return Tensor::zeros(&[], DType::I64).to_device(self.device());
        }
        let x = self.detach();
        let w = Window::new(&x, d)?;
        let xi = x.unsqueeze(d as i64 + 1)?;
        fused_or_recorded!(&[], |b, cv| permutation(
            b,
            (&cv(&xi), &cv(&w.xj), &cv(&w.pi), &cv(&w.pj)),
            d,
            descending
        ))
    }

    /// `torch.sort(x, dim, descending, stable)`: the sorted values and
    /// their indices (see [`Tensor::argsort`]).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0], &[3])?;
    /// let (v, i) = x.sort(0, true)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![3.0, 2.0, 1.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 2, 1]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.argsort(dim, descending)?;
        Ok((self.take_sorted(dim, &idx)?, idx))
    }

    /// `x.gather(dim, idx)`, for a 0-dim `x` too.
    fn take_sorted(&self, dim: i64, idx: &Tensor) -> Result<Tensor> {
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        self.gather(dim, idx)
    }

    /// `torch.topk(x, k, dim, largest, sorted)`: the `k` largest (or
    /// smallest) values along `dim`, in order, and their indices.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[4])?;
    /// let (v, i) = x.topk(2, 0, true)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![5.0, 4.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![1, 3]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn topk(&self, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim("topk", dim, self.rank())?;
        let n = self.dims().get(d).copied().unwrap_or(1);
        if k > n {
            bail!(
                "topk",
                "k ({k}) is out of range for dimension {d} of size {n} (shape {})",
                fmt_dims(self.dims())
            );
        }
        let idx = self.argsort(dim, largest)?.narrow_any(d, 0, k)?;
        Ok((self.take_sorted(dim, &idx)?, idx))
    }

    /// `narrow`, also of a 0-dim tensor (k = 0 or 1).
    fn narrow_any(&self, d: usize, start: usize, len: usize) -> Result<Tensor> {
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        self.narrow(d as i64, start as i64, len)
    }

    /// `torch.kthvalue(x, k, dim, keepdim)`: the k-th smallest value (k
    /// from 1) along `dim` and its index.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![4.0f32, 1.0, 3.0], &[3])?;
    /// let (v, i) = x.kthvalue(2, 0, false)?;
    /// assert_eq!((v.item()?, i.item()?), (3.0, 2.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn kthvalue(&self, k: usize, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim("kthvalue", dim, self.rank())?;
        let n = self.dims().get(d).copied().unwrap_or(1);
        if k == 0 || k > n {
            bail!(
                "kthvalue",
                "k ({k}) is out of range for dimension {d} of size {n} (shape {})",
                fmt_dims(self.dims())
            );
        }
        let idx = self.argsort(dim, false)?.narrow_any(d, k - 1, 1)?;
        let v = self.take_sorted(dim, &idx)?;
        if self.rank() == 0 {
            return Ok((v, idx));
        }
        squeezed((v, idx), d, keepdim)
    }

    /// `torch.median(x, dim, keepdim)`: the lower middle value along `dim`
    /// (of an even count, the smaller of the two) and its index.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 4.0, 2.0, 3.0], &[4])?;
    /// assert_eq!(x.median_dim(0, false)?.0.item()?, 2.0);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn median_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim("median", dim, self.rank())?;
        let n = self.dims().get(d).copied().unwrap_or(1);
        if n == 0 {
            bail!(
                "median",
                "cannot compute the median of an empty dim {d} (shape {})",
                fmt_dims(self.dims())
            );
        }
        self.kthvalue((n - 1) / 2 + 1, dim, keepdim)
    }

    /// `torch.median(x)`: the lower middle value of all elements (0-dim).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0], &[3])?;
    /// assert_eq!(x.median()?.item()?, 2.0);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn median(&self) -> Result<Tensor> {
        Ok(self.reshape(&[-1])?.median_dim(0, false)?.0)
    }

    /// `torch.nanmedian(x, dim, keepdim)`: the median of the non-NaN values
    /// (NaN when a row has none) and its index.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 2.0], &[4])?;
    /// let (v, i) = x.nanmedian_dim(0, false)?;
    /// assert_eq!((v.item()?, i.item()?), (2.0, 3.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn nanmedian_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim("nanmedian", dim, self.rank())?;
        if self.rank() == 0 {
            return self.with_index_zero();
        }
        let n = self.dims()[d] as i64;
        let order = self.argsort(dim, false)?;
        // the lower middle of the c non-NaN values (sorted first); a row of
        // only NaN picks position n / 2 for n > 3 (else 0): the element
        // PyTorch's nth_element (libstdc++'s median-of-three pivot) leaves there
        let numbers = self.detach().eq(&self.detach())?.to_dtype(DType::I64)?;
        let c = numbers.sum(Some(&[dim]), true)?;
        let mid = c
            .sub_scalar(1)?
            .binary_scalar(BinaryOp::FloorDiv, 2i64, false)?;
        let all_nan = if n > 3 { n / 2 } else { 0 };
        let some = c.binary_scalar(BinaryOp::Ne, 0i64, false)?;
        let k = Tensor::where_scalar(&some, &mid, all_nan)?;
        let idx = order.gather(dim, &k)?;
        squeezed((self.gather(dim, &idx)?, idx), d, keepdim)
    }

    /// `torch.mode(x, dim, keepdim)`: the most frequent value along `dim`
    /// (the smallest of equally frequent ones) and the last index holding it.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 2.0, 3.0, 2.0], &[5])?;
    /// let (v, i) = x.mode(0, false)?;
    /// assert_eq!((v.item()?, i.item()?), (2.0, 4.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn mode(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim("mode", dim, self.rank())?;
        if self.rank() == 0 {
            return self.with_index_zero();
        }
        let x = self.detach();
        let w = Window::new(&x, d)?;
        let xi = x.unsqueeze(d as i64 + 1)?;
        let pos = positions(&x, x.dims()[d], x.rank(), d)?;
        let idx = fused_or_recorded!(&[], |b, cv| mode_index(
            b,
            (&cv(&x), &cv(&xi), &cv(&w.xj), &cv(&pos)),
            d
        ))?;
        let idx = idx.unsqueeze(dim)?;
        squeezed((self.gather(dim, &idx)?, idx), d, keepdim)
    }
}

/// `(values, indices)` with dim `d` dropped unless `keepdim`.
fn squeezed((v, i): (Tensor, Tensor), d: usize, keepdim: bool) -> Result<(Tensor, Tensor)> {
    if keepdim {
        return Ok((v, i));
    }
    let dd = [d as i64];
    Ok((v.squeeze(Some(&dd[..]))?, i.squeeze(Some(&dd[..]))?))
}

impl Tensor {
    /// A 0-dim tensor's value-and-index result: itself and index 0.
    pub(crate) fn with_index_zero(&self) -> Result<(Tensor, Tensor)> {
        let i = Tensor::zeros(&[], DType::I64).to_device(self.device())?;
        Ok((self.clone(), i))
    }
}

/// [`Tensor::mode`]'s index along axis `d` of `x`: count each value's
/// occurrences (`xi` against `xj`), keep the most frequent, take the
/// smallest of those, and its last position (`pos`, arange along `d`).
fn mode_index<B: Builder>(
    b: &mut B,
    (x, xi, xj, pos): (&B::T, &B::T, &B::T, &B::T),
    d: usize,
) -> Result<B::T> {
    let axis = [d as i64];
    let same = same_key(b, xi, xj)?;
    let same = b.cast(&same, DType::I64)?;
    let counts = b.reduce(ReduceKind::Sum, &same, &[d as i64 + 1], false)?;
    let most = b.reduce(ReduceKind::Max, &counts, &axis, true)?;
    let is_most = b.binary(BinaryOp::Eq, &counts, &most)?;
    let cand = b.select_scalar(&is_most, x, f64::INFINITY)?;
    let value = b.reduce(ReduceKind::Min, &cand, &axis, true)?;
    let at = same_key(b, x, &value)?;
    let p = b.select_scalar(&at, pos, -1.0)?;
    b.reduce(ReduceKind::Max, &p, &axis, false)
}
