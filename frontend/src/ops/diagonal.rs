//! The strided views `diagonal` and `Tensor.unfold` (graph ops of their
//! own: a stride pattern no chain of the other views makes), and
//! `diag_embed`, their copying inverse. `diagonal`'s gradient is written
//! back through the same view; `unfold`'s windows may overlap, so its
//! gradient is a scatter-add of every window element to its source.

use super::scan::positions;
use crate::autograd::rules;
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::view as lv;
use kiln_ir::op::Op;
use kiln_ir::shape::norm_dim;
use kiln_ir::{BinaryOp, Result};

impl Tensor {
    /// `torch.diagonal(x, offset, dim1, dim2)`: a view of the elements with
    /// `j - i == offset` in dims `dim1`, `dim2`, appended as the last dim.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3])?;
    /// let d = x.diagonal(1, 0, 1)?;
    /// assert_eq!((d.to_vec::<f32>()?, d.shares_storage(&x)), (vec![1.0, 5.0], true));
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        trace::record(
            || Op::Diagonal { offset, dim1, dim2 },
            &[self],
            || {
                let y = self.with_layout(lv::diagonal(self.layout(), offset, dim1, dim2)?);
                rules::view::region("diagonal", self, y, move |z| z.diagonal(offset, dim1, dim2))
            },
        )
    }

    /// `x.unfold(dimension, size, step)`: a view of the windows of `size`
    /// along `dimension`, `step` apart (a new last dim walks a window).
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4])?;
    /// let w = x.unfold(0, 2, 1)?;
    /// assert_eq!(w.dims(), &[3, 2]);
    /// assert_eq!(w.to_vec::<f32>()?, vec![1.0, 2.0, 2.0, 3.0, 3.0, 4.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn unfold(&self, dimension: i64, size: usize, step: usize) -> Result<Tensor> {
        trace::record(
            || Op::Unfold {
                dim: dimension,
                size,
                step,
            },
            &[self],
            || {
                let y = self.with_layout(lv::unfold(self.layout(), dimension, size, step)?);
                if !crate::autograd::needs_grad(&[self]) || self.rank() == 0 {
                    return Ok(y);
                }
                let d = norm_dim("unfold", dimension, self.rank())?;
                let (xd, windows) = (self.dims_vec(), y.dims()[d]);
                crate::autograd::record("unfold", y, &[self], move |g| {
                    // window w's element s came from w * step + s along d
                    let from: Vec<i64> = (0..windows * size)
                        .map(|k| ((k / size) * step + k % size) as i64)
                        .collect();
                    let flat = g
                        .movedim(&[-1], &[d as i64 + 1])?
                        .flatten(d as i64, d as i64 + 1)?;
                    let mut shape = vec![1usize; xd.len()];
                    shape[d] = from.len();
                    let idx = Tensor::from_vec(from, &shape)?
                        .to_device(g.device())?
                        .expand_to(flat.dims())?;
                    Ok(vec![Some(rules::index::scatter_add(&xd, d, &idx, &flat)?)])
                })
            },
        )
    }

    /// `torch.diag_embed(x, offset, dim1, dim2)`: a new tensor whose
    /// diagonal (`offset`) in dims `dim1`, `dim2` holds the last dim of `x`,
    /// zeros elsewhere.
    ///
    /// ```
    /// # use kiln_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let y = x.diag_embed(0, -2, -1)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 2.0]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn diag_embed(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        let r = self.rank() + 1;
        let (d1, d2) = (
            norm_dim("diag_embed", dim1, r)?,
            norm_dim("diag_embed", dim2, r)?,
        );
        if d1 == d2 {
            kiln_ir::bail!("diag_embed", "dim1 and dim2 are both {d1}");
        }
        let x = if self.rank() == 0 {
            self.reshape(&[1])?
        } else {
            self.clone()
        };
        let n = x.dims()[x.rank() - 1];
        let m = n + offset.unsigned_abs() as usize;
        // x's last dim runs along the row (offset >= 0) or column axis,
        // padded to m; the other of the two is broadcast
        let (along, other) = if offset >= 0 { (d1, d2) } else { (d2, d1) };
        let mut src = vec![0i64; r];
        let rest = (0..r).filter(|&k| k != d1 && k != d2);
        for (k, a) in rest.enumerate() {
            src[a] = k as i64;
        }
        src[along] = r as i64 - 2;
        src[other] = r as i64 - 1;
        let col = x.unsqueeze(-1)?.permute(&src)?;
        let mut zd = col.dims_vec();
        zd[along] = m - n;
        let z = Tensor::zeros(&zd, x.dtype()).to_device(x.device())?;
        let col = Tensor::cat(&[&col, &z], along as i64)?;
        let mut full = col.dims_vec();
        full[other] = m;
        let i = positions(&x, m, r, d1)?;
        let j = positions(&x, m, r, d2)?;
        let on = j.sub(&i)?.binary_scalar(BinaryOp::Eq, offset, false)?;
        Tensor::where_scalar(&on, &col.expand_to(&full)?, 0)
    }
}
