//! Scans along one dim — `cumsum`, `cumprod`, `logcumsumexp`, `cummax`,
//! `cummin` — as windowed reductions: output `i` reduces the inputs `j <= i`
//! (`j >= i` for a reverse scan), the others replaced by the reduction's
//! identity under a triangular mask made from two aranges. The input is read
//! through a view with a broadcast `i` axis, so nothing of size n x n is
//! stored: without a gradient the scan is ONE generated reduction kernel
//! (mask and select are its prologue, through the fusing builder), on the
//! CPU (Cranelift) and as CUDA C alike. With a gradient, or while tracing,
//! the same formula runs as recorded primitive ops, so the backward comes
//! from the reductions' rules (prod's handles zeros as PyTorch does,
//! logsumexp's is the stable softmax) and `compile` fuses it back into one
//! kernel. Each row is read n times (O(n^2) per row, as the device gather).

use super::composite::fused_or_recorded;
use crate::Tensor;
use kiln_ir::shape::norm_dim;
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};
use kiln_passes::decompose::Builder;

/// `x` with a size-1 axis inserted at `at`.
fn insert_axis(x: &Tensor, at: usize) -> Result<Tensor> {
    x.unsqueeze(at as i64)
}

/// `arange(n)` along axis `axis` of a rank-`rank` tensor (size 1 elsewhere), on `x`'s device.
pub(crate) fn positions(x: &Tensor, n: usize, rank: usize, axis: usize) -> Result<Tensor> {
    let mut shape = vec![1usize; rank];
    shape[axis] = n;
    // filled as i64 on the host (no cast: a traced op a device copy could not follow)
    Tensor::from_vec((0..n as i64).collect::<Vec<i64>>(), &shape)?.to_device(x.device())
}

/// The window of a scan along `d` of `x`: `x` with its element `j` on axis
/// `d + 1` (axis `d`, the output's `i`, broadcast), and the positions `i`
/// (on axis `d`) and `j` (on axis `d + 1`).
pub(crate) struct Window {
    pub xj: Tensor,
    pub pi: Tensor,
    pub pj: Tensor,
    pub d: usize,
}

impl Window {
    pub fn new(x: &Tensor, d: usize) -> Result<Window> {
        let (n, r) = (x.dims()[d], x.rank() + 1);
        Ok(Window {
            xj: insert_axis(x, d)?,
            pi: positions(x, n, r, d)?,
            pj: positions(x, n, r, d + 1)?,
            d,
        })
    }
}

/// Reduces `xj` with `kind` over the window `j <= i` (`j >= i` when
/// `reverse`) along axis `d + 1`; entries outside the window are `fill`.
pub(crate) fn windowed<B: Builder>(
    b: &mut B,
    (xj, pi, pj): (&B::T, &B::T, &B::T),
    d: usize,
    kind: ReduceKind,
    fill: f64,
    reverse: bool,
) -> Result<B::T> {
    let inside = b.binary(if reverse { BinaryOp::Ge } else { BinaryOp::Le }, pj, pi)?;
    let v = b.select_scalar(&inside, xj, fill)?;
    b.reduce(kind, &v, &[d as i64 + 1], false)
}

/// The index of the running maximum (`max`) or minimum along the window:
/// the LAST `j <= i` holding the running value, a NaN once one was seen (so
/// the last NaN), as PyTorch's cummax/cummin.
fn running_arg<B: Builder>(
    b: &mut B,
    (xj, pi, pj): (&B::T, &B::T, &B::T),
    d: usize,
    max: bool,
) -> Result<B::T> {
    let (kind, fill) = if max {
        (ReduceKind::Max, f64::NEG_INFINITY)
    } else {
        (ReduceKind::Min, f64::INFINITY)
    };
    let v = windowed(b, (xj, pi, pj), d, kind, fill, false)?;
    let mut at = b.dims(&v).to_vec();
    at.insert(d + 1, 1);
    let vi = b.reshape(&v, &at.iter().map(|&s| s as i64).collect::<Vec<_>>())?;
    let same = b.binary(BinaryOp::Eq, xj, &vi)?;
    let x_nan = b.binary(BinaryOp::Ne, xj, xj)?;
    let v_nan = b.binary(BinaryOp::Ne, &vi, &vi)?;
    let both_nan = b.binary(BinaryOp::And, &x_nan, &v_nan)?;
    let hit = b.binary(BinaryOp::Or, &same, &both_nan)?;
    let inside = b.binary(BinaryOp::Le, pj, pi)?;
    let hit = b.binary(BinaryOp::And, &hit, &inside)?;
    let j = b.select_scalar(&hit, pj, -1.0)?;
    b.reduce(ReduceKind::Max, &j, &[d as i64 + 1], false)
}

/// The scans' result dtype for `x` (integers and bools accumulate in i64).
fn scan_dtype(x: &Tensor, dtype: Option<DType>) -> DType {
    dtype.unwrap_or(if x.dtype().is_float() {
        x.dtype()
    } else {
        DType::I64
    })
}

impl Tensor {
    /// One windowed scan of `self` (cast to `dt`) along `dim`.
    fn scan(&self, op: &str, dim: i64, dt: DType, kind: ReduceKind, fill: f64) -> Result<Tensor> {
        let d = norm_dim(op, dim, self.rank())?;
        if self.rank() == 0 {
            return self
                .to_dtype(dt)?
                .reshape(&[1])?
                .scan(op, 0, dt, kind, fill)?
                .reshape(&[]);
        }
        let w = Window::new(&self.to_dtype(dt)?, d)?;
        fused_or_recorded!(&[&w.xj], |b, cv| windowed(
            b,
            (&cv(&w.xj), &cv(&w.pi), &cv(&w.pj)),
            w.d,
            kind,
            fill,
            false
        ))
    }

    /// `torch.cumsum(x, dim, dtype)`: integers and bools sum in i64.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.cumsum(0, None)?.to_vec::<f32>()?, vec![1.0, 3.0, 6.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn cumsum(&self, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
        let dt = scan_dtype(self, dtype);
        self.scan("cumsum", dim, dt, ReduceKind::Sum, 0.0)
    }

    /// `torch.cumprod(x, dim, dtype)`; the gradient handles zeros as PyTorch's.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, 3.0, 4.0], &[3])?;
    /// assert_eq!(x.cumprod(0, None)?.to_vec::<f32>()?, vec![2.0, 6.0, 24.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn cumprod(&self, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
        let dt = scan_dtype(self, dtype);
        self.scan("cumprod", dim, dt, ReduceKind::Prod, 1.0)
    }

    /// `torch.logcumsumexp(x, dim)`: a running log-sum-exp (floating inputs only).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 0.0], &[2])?;
    /// let y = x.logcumsumexp(0)?.to_vec::<f32>()?;
    /// assert!((y[1] - 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn logcumsumexp(&self, dim: i64) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!(
                "logcumsumexp",
                "expected a floating point input, got {}",
                self.dtype()
            );
        }
        let fill = f64::NEG_INFINITY;
        self.scan(
            "logcumsumexp",
            dim,
            self.dtype(),
            ReduceKind::LogSumExp,
            fill,
        )
    }

    /// `torch.cummax(x, dim)`: the running maximum and the (last) index
    /// holding it; NaN propagates. The values are `x.gather(dim, indices)`,
    /// so the gradient goes to the returned index.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, 2.0], &[4])?;
    /// let (v, i) = x.cummax(0)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![1.0, 3.0, 3.0, 3.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 2, 2]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn cummax(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.cum_extreme("cummax", dim, true)
    }

    /// `torch.cummin(x, dim)`: as [`Tensor::cummax`] for the minimum.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, 1.0, 3.0], &[3])?;
    /// let (v, i) = x.cummin(0)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![2.0, 1.0, 1.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 1]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn cummin(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.cum_extreme("cummin", dim, false)
    }

    fn cum_extreme(&self, op: &str, dim: i64, max: bool) -> Result<(Tensor, Tensor)> {
        let d = norm_dim(op, dim, self.rank())?;
        if self.rank() == 0 {
            return self.with_index_zero();
        }
        // integers compare exactly in i64 (the ±inf identities need a float or i64)
        let keys = if self.dtype().is_float() {
            self.detach()
        } else {
            self.detach().to_dtype(DType::I64)?
        };
        let w = Window::new(&keys, d)?;
        let idx = fused_or_recorded!(&[], |b, cv| running_arg(
            b,
            (&cv(&w.xj), &cv(&w.pi), &cv(&w.pj)),
            d,
            max
        ))?;
        Ok((self.gather(dim, &idx)?, idx))
    }
}
