//! Tensor factories with PyTorch's numerics: `arange` (start, end, step),
//! `linspace`/`logspace` (PyTorch's two-sided formula: the first half counts
//! up from `start`, the second down from `end`, so both ends are exact),
//! `eye`, `full_like`/`zeros_like`/`ones_like` and `one_hot`. Values depend
//! only on the arguments and are filled on the host, as `Tensor::full` is.

use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result};

impl Tensor {
    /// `torch.arange(start, end, step, dtype)`: `ceil((end - start) / step)`
    /// values `start + i * step` (computed in f64, then cast).
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::arange_step(1.0, 10.0, 3.0, DType::I64)?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![1, 4, 7]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn arange_step(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            bail!(
                "arange",
                "step must be finite and nonzero, got start {start}, end {end}, step {step}"
            );
        }
        if (end - start) * step < 0.0 {
            bail!("arange", "upper bound and larger bound inconsistent with step sign (start {start}, end {end}, step {step})");
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let v: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
        Tensor::from_vec(v, &[n])?.to_dtype(dtype)
    }

    /// `torch.linspace(start, end, steps, dtype)`.
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::linspace(0.0, 1.0, 5, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Result<Tensor> {
        Tensor::from_vec(linspace_values(start, end, steps, dtype), &[steps])?.to_dtype(dtype)
    }

    /// `torch.logspace(start, end, steps, base, dtype)`: `base` to the
    /// powers of [`Tensor::linspace`].
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::logspace(0.0, 2.0, 3, 10.0, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 10.0, 100.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn logspace(start: f64, end: f64, steps: usize, base: f64, dtype: DType) -> Result<Tensor> {
        let v: Vec<f64> = linspace_values(start, end, steps, dtype)
            .into_iter()
            .map(|e| base.powf(e))
            .collect();
        Tensor::from_vec(v, &[steps])?.to_dtype(dtype)
    }

    /// `torch.eye(n, m, dtype)`: ones on the main diagonal of an `n x m` matrix.
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::eye(2, 3, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn eye(n: usize, m: usize, dtype: DType) -> Result<Tensor> {
        let v: Vec<f64> = (0..n * m)
            .map(|k| f64::from(u8::from(k / m == k % m)))
            .collect();
        Tensor::from_vec(v, &[n, m])?.to_dtype(dtype)
    }

    /// `torch.full_like(x, value, dtype)`: `x`'s shape and device, its dtype
    /// unless given (an integer dtype truncates `value`).
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::zeros(&[2], DType::I64);
    /// assert_eq!(x.full_like(7.5, None)?.to_vec::<i64>()?, vec![7, 7]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn full_like(&self, value: f64, dtype: Option<DType>) -> Result<Tensor> {
        let dt = dtype.unwrap_or(self.dtype());
        Tensor::try_full(self.dims(), value, dt)?.to_device(self.device())
    }

    /// `torch.zeros_like(x, dtype)`.
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::ones(&[2], DType::F32);
    /// assert_eq!(x.zeros_like(None)?.to_vec::<f32>()?, vec![0.0, 0.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn zeros_like(&self, dtype: Option<DType>) -> Result<Tensor> {
        self.full_like(0.0, dtype)
    }

    /// `torch.ones_like(x, dtype)`.
    ///
    /// ```
    /// # use kiln_frontend::{DType, Tensor};
    /// let x = Tensor::zeros(&[2], DType::I64);
    /// assert_eq!(x.ones_like(None)?.to_vec::<i64>()?, vec![1, 1]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn ones_like(&self, dtype: Option<DType>) -> Result<Tensor> {
        self.full_like(1.0, dtype)
    }

    /// `F.one_hot(x, num_classes)`: i64 `x`'s classes as i64 one-hot rows
    /// (a trailing dim of `num_classes`; None: the largest class + 1, which
    /// reads the values back, so a trace stops there).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2i64, 0], &[2])?;
    /// assert_eq!(x.one_hot(Some(3))?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn one_hot(&self, num_classes: Option<usize>) -> Result<Tensor> {
        if self.dtype() != DType::I64 {
            bail!(
                "one_hot",
                "class values must be i64, got {} {}",
                self.dtype(),
                fmt_dims(self.dims())
            );
        }
        if num_classes.is_none() {
            crate::compile::trace::unsupported("one_hot", super::nonzero::DATA_DEPENDENT)?;
        }
        let reads = num_classes.is_none() || !crate::compile::trace::is_tracing();
        let (lo, hi) = if reads && self.numel() > 0 {
            (
                self.amin(None, false)?.item()? as i64,
                self.amax(None, false)?.item()? as i64,
            )
        } else {
            (0, -1)
        };
        let c = num_classes.unwrap_or((hi + 1).max(0) as usize);
        if lo < 0 || hi >= c as i64 {
            bail!(
                "one_hot",
                "class values must be in [0, {c}), got {lo}..={hi} (shape {})",
                fmt_dims(self.dims())
            );
        }
        let classes = super::scan::positions(self, c, 1, 0)?;
        self.unsqueeze(-1)?
            .binary(BinaryOp::Eq, &classes)?
            .to_dtype(DType::I64)
    }
}

/// `steps` values from `start` to `end` as PyTorch computes them in `dtype`
/// (f32 operands for f32): the first half `start + i * step`, the second
/// `end - (steps - 1 - i) * step`, each one fused multiply-add rounded once
/// (an f32 product is exact in f64), as PyTorch's vectorised kernel does.
fn linspace_values(start: f64, end: f64, steps: usize, dtype: DType) -> Vec<f64> {
    let round = |v: f64| {
        if dtype == DType::F64 {
            v
        } else {
            v as f32 as f64
        }
    };
    let (s, e) = (round(start), round(end));
    if steps == 1 {
        return vec![s];
    }
    let step = round((e - s) / (steps as f64 - 1.0));
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                round(s + step * i as f64)
            } else {
                round(e - step * (steps - 1 - i) as f64)
            }
        })
        .collect()
}
