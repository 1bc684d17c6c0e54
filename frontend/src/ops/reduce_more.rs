//! Reductions composed from the primitive ones: `any`, `all`,
//! `count_nonzero`, `linalg.vector_norm` (and `torch.norm`), `var_mean`,
//! `std_mean`, `aminmax`, `nansum`, `nanmean`. Each is a few recorded
//! Tensor ops (so autograd and the tracer see primitives, and `compile`
//! fuses them), with PyTorch's gradients at the edges: a zero vector's norm
//! has gradient 0 (not NaN), NaNs get none under `nansum`/`nanmean`.

use crate::autograd::Saved;
use crate::Tensor;
use kiln_ir::{bail, BinaryOp, DType, Result};

/// The norm orders [`Tensor::vector_norm`] takes (PyTorch's `ord`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormOrd {
    /// `sum(|x|^p)^(1/p)`; `P(2.0)` is the Euclidean norm, `P(0.0)` counts nonzeros.
    P(f64),
    /// `max |x|`.
    Inf,
    /// `min |x|`.
    NegInf,
}

impl NormOrd {
    /// `ord` as a number (`±inf` for the max/min norms).
    pub fn from_f64(p: f64) -> NormOrd {
        if p == f64::INFINITY {
            NormOrd::Inf
        } else if p == f64::NEG_INFINITY {
            NormOrd::NegInf
        } else {
            NormOrd::P(p)
        }
    }
}

/// `where(s != 0, f(where(s != 0, s, 1)), 0)`: `f` at zero replaced by 0
/// with a zero gradient (a bare `f` would give `inf * 0 = NaN` there).
fn zero_safe(s: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let nz = s.binary_scalar(BinaryOp::Ne, 0.0, false)?;
    let v = f(&Tensor::where_scalar(&nz, s, 1.0)?)?;
    Tensor::where_scalar(&nz, &v, 0.0)
}

impl Tensor {
    /// `x != 0` (bools as they are), counted in i64 over `dims` (None = all).
    fn nonzero_count(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        let nz = if self.dtype() == DType::Bool {
            self.clone()
        } else {
            self.binary_scalar(BinaryOp::Ne, 0i64, false)?
        };
        nz.to_dtype(DType::I64)?.sum(dims, keepdim)
    }

    /// `torch.any(x, dim, keepdim)`: whether any element over `dims` (None =
    /// all) is nonzero (NaN counts); an empty dim gives false. Always bool.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 0.0, 0.0], &[2, 2])?;
    /// assert_eq!(x.any(Some(&[1]), false)?.to_vec::<bool>()?, vec![true, false]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn any(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        self.nonzero_count(dims, keepdim)?
            .binary_scalar(BinaryOp::Gt, 0i64, false)
    }

    /// `torch.all(x, dim, keepdim)`: whether every element is nonzero; an
    /// empty dim gives true. Always bool.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 0.0, 3.0], &[2, 2])?;
    /// assert_eq!(x.all(Some(&[1]), false)?.to_vec::<bool>()?, vec![true, false]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn all(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        let zero = if self.dtype() == DType::Bool {
            self.logical_not()?
        } else {
            self.binary_scalar(BinaryOp::Eq, 0i64, false)?
        };
        zero.to_dtype(DType::I64)?
            .sum(dims, keepdim)?
            .binary_scalar(BinaryOp::Eq, 0i64, false)
    }

    /// `torch.count_nonzero(x, dim)`: i64 counts over `dims` (None = all).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 5.0, 0.0], &[2, 2])?;
    /// assert_eq!(x.count_nonzero(None)?.to_vec::<i64>()?, vec![2]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn count_nonzero(&self, dims: Option<&[i64]>) -> Result<Tensor> {
        self.nonzero_count(dims, false)
    }

    /// `torch.linalg.vector_norm(x, ord, dim, keepdim)` over `dims` (None =
    /// all); floating inputs. The gradient of a zero vector is 0, as PyTorch's.
    ///
    /// ```
    /// # use kiln_frontend::{NormOrd, Tensor};
    /// let x = Tensor::from_vec(vec![3.0f32, -4.0], &[2])?;
    /// assert_eq!(x.vector_norm(NormOrd::P(2.0), None, false)?.item()?, 5.0);
    /// assert_eq!(x.vector_norm(NormOrd::Inf, None, false)?.item()?, 4.0);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn vector_norm(&self, ord: NormOrd, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!(
                "linalg.vector_norm",
                "expected a floating point input, got {}",
                self.dtype()
            );
        }
        let a = self.abs()?;
        match ord {
            NormOrd::Inf => a.amax(dims, keepdim),
            NormOrd::NegInf => a.amin(dims, keepdim),
            // nonzeros counted (NaN is nonzero); sign(x) * 0 keeps the result
            // on the graph with the zero gradient PyTorch gives
            NormOrd::P(p) if p == 0.0 => {
                let count = self
                    .binary_scalar(BinaryOp::Ne, 0.0, false)?
                    .to_dtype(self.dtype())?;
                count
                    .add(&self.sign()?.mul_scalar(0.0)?)?
                    .sum(dims, keepdim)
            }
            NormOrd::P(p) if p == 1.0 => a.sum(dims, keepdim),
            NormOrd::P(p) => {
                let powered = if p == 2.0 {
                    self.mul(self)?
                } else if p < 1.0 {
                    zero_safe(&a, |a| a.pow_scalar(p))?
                } else {
                    a.pow_scalar(p)?
                };
                let s = powered.sum(dims, keepdim)?;
                zero_safe(&s, |s| {
                    if p == 2.0 {
                        s.sqrt()
                    } else {
                        s.pow_scalar(1.0 / p)
                    }
                })
            }
        }
    }

    /// `torch.var_mean(x, dim, correction, keepdim)`: `(var, mean)` over
    /// `dims` (empty = all).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// let (v, m) = x.var_mean(&[], 1.0, false)?;
    /// assert_eq!((v.item()?, m.item()?), (2.0, 2.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn var_mean(
        &self,
        dims: &[i64],
        correction: f64,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        let m = self.mean(Some(dims), keepdim)?;
        Ok((self.var(dims, correction, keepdim)?, m))
    }

    /// `torch.std_mean(x, dim, correction, keepdim)`: `(std, mean)`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// let (s, m) = x.std_mean(&[], 0.0, false)?;
    /// assert_eq!((s.item()?, m.item()?), (1.0, 2.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn std_mean(
        &self,
        dims: &[i64],
        correction: f64,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        let m = self.mean(Some(dims), keepdim)?;
        Ok((self.std(dims, correction, keepdim)?, m))
    }

    /// `torch.aminmax(x, dim, keepdim)`: `(amin, amax)` over `dims` (None =
    /// all); ties share the gradient, as `amin`/`amax`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, -1.0, 5.0], &[3])?;
    /// let (lo, hi) = x.aminmax(None, false)?;
    /// assert_eq!((lo.item()?, hi.item()?), (-1.0, 5.0));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn aminmax(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<(Tensor, Tensor)> {
        Ok((self.amin(dims, keepdim)?, self.amax(dims, keepdim)?))
    }

    /// `x` with NaN replaced by 0 (no gradient there).
    fn nan_zeroed(&self) -> Result<Tensor> {
        Tensor::where_scalar(&self.eq(self)?, self, 0.0)
    }

    /// `torch.nansum(x, dim, keepdim)`: the sum treating NaN as 0.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0], &[3])?;
    /// assert_eq!(x.nansum(None, false)?.item()?, 3.0);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn nansum(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return self.sum(dims, keepdim);
        }
        self.nan_zeroed()?.sum(dims, keepdim)
    }

    /// `torch.nanmean(x, dim, keepdim)`: the mean of the non-NaN values.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0], &[3])?;
    /// assert_eq!(x.nanmean(None, false)?.item()?, 1.5);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn nanmean(&self, dims: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!(
                "nanmean",
                "expected a floating point input, got {}",
                self.dtype()
            );
        }
        let x = self.detach();
        let numbers = x.eq(&x)?.to_dtype(x.dtype())?;
        let count = numbers.sum(dims, true)?;
        let y = x.nan_zeroed()?.sum(dims, true)?.div(&count)?;
        let y = if keepdim {
            y
        } else {
            y.reshape_dims(&reduced(x.dims(), dims)?)?
        };
        if !crate::autograd::needs_grad(&[self]) {
            return Ok(y);
        }
        // PyTorch's mask * (g / count): a row of only NaN gets NaN (0 * inf)
        let (xd, keep) = (x.dims_vec(), count.dims_vec());
        let (sc, sn) = (
            Saved::new("nanmean", &count),
            Saved::new("nanmean", &numbers),
        );
        crate::autograd::record("nanmean", y, &[self], move |g| {
            let g = g.reshape_dims(&keep)?.expand_to(&xd)?;
            Ok(vec![Some(g.div(&sc.get()?)?.mul(&sn.get()?)?)])
        })
    }
}

/// `dims` (None = all) of `shape` removed.
fn reduced(shape: &[usize], dims: Option<&[i64]>) -> Result<Vec<usize>> {
    let rd = kiln_ir::op::infer::reduce_dims("nanmean", shape.len(), dims)?;
    Ok((0..shape.len())
        .filter(|k| !rd.contains(k))
        .map(|k| shape[k])
        .collect())
}
