//! Ops whose output shape depends on the values: `nonzero`, `argwhere`,
//! `where(cond)`, `masked_select`. They read the mask back to the host (a
//! compaction), so a trace stops there with a graph break naming the op, as
//! `torch.compile` does by default; the gathered values go through
//! `index_select`, whose gradient scatters back.

use crate::compile::trace;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result};

/// Why these ops (and `one_hot` without `num_classes`, `repeat_interleave`
/// with counts and no `output_size`) cannot be traced: the graph break's reason.
pub(crate) const DATA_DEPENDENT: &str = "its output shape depends on the input's values";

impl Tensor {
    /// The row-major flat positions of the nonzero elements (read back).
    fn nonzero_positions(&self, op: &str) -> Result<Vec<i64>> {
        trace::unsupported(op, DATA_DEPENDENT)?;
        let nz = if self.dtype() == DType::Bool {
            self.clone()
        } else {
            self.binary_scalar(BinaryOp::Ne, 0i64, false)?
        };
        let v = nz.to_vec::<bool>()?;
        Ok((0..v.len() as i64).filter(|&i| v[i as usize]).collect())
    }

    /// `torch.nonzero(x)` (= `torch.argwhere`): the indices of the nonzero
    /// elements, one row per element, i64 `[count, rank]`.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 0.0], &[2, 2])?;
    /// assert_eq!(x.nonzero()?.to_vec::<i64>()?, vec![0, 1, 1, 0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn nonzero(&self) -> Result<Tensor> {
        let flat = self.nonzero_positions("nonzero")?;
        let r = self.rank();
        let mut out = Vec::with_capacity(flat.len() * r);
        for &p in &flat {
            let mut rem = p as usize;
            let mut coord = vec![0i64; r];
            for k in (0..r).rev() {
                coord[k] = (rem % self.dims()[k]) as i64;
                rem /= self.dims()[k];
            }
            out.extend(coord);
        }
        Tensor::from_vec(out, &[flat.len(), r])?.to_device(self.device())
    }

    /// `torch.where(cond)`: [`Tensor::nonzero`] as one index tensor per dim.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![false, true, true, false], &[2, 2])?;
    /// let ij = x.nonzero_tuple()?;
    /// assert_eq!(ij[0].to_vec::<i64>()?, vec![0, 1]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn nonzero_tuple(&self) -> Result<Vec<Tensor>> {
        let nz = self.nonzero()?;
        (0..self.rank() as i64)
            .map(|k| nz.select(1, k)?.contiguous())
            .collect()
    }

    /// `torch.masked_select(x, mask)`: the elements where `mask` (broadcast
    /// with `x`) is true, as a 1-D tensor.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let m = Tensor::from_vec(vec![true, false, true], &[3])?;
    /// assert_eq!(x.masked_select(&m)?.to_vec::<f32>()?, vec![1.0, 3.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            bail!(
                "masked_select",
                "mask must be bool, got {} {}",
                mask.dtype(),
                fmt_dims(mask.dims())
            );
        }
        let dims = kiln_ir::shape::broadcast_shapes("masked_select", self.dims(), mask.dims())?;
        let at = mask.expand_to(&dims)?.nonzero_positions("masked_select")?;
        let n = at.len();
        let idx = Tensor::from_vec(at, &[n])?.to_device(self.device())?;
        self.expand_to(&dims)?.reshape(&[-1])?.index_select(0, &idx)
    }
}
