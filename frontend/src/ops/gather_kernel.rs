//! `gather` on a CUDA device as one generated reduction: for each output
//! position, the sum over `j` of `index == j ? x[.., j, ..] : 0` along the
//! gathered dim, with `x` and `index` read in place through broadcast views
//! and `j` from an `arange`. It reads the gathered dim whole for every output,
//! which is what a class dimension (cross-entropy's gather) costs anyway.

use crate::ops::kernel::KernelCall;
use crate::Tensor;
use kiln_ir::op::Layout;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};

/// `x.gather(d, index)` (index i64, same rank, checked by the caller) on `x`'s device.
pub(crate) fn gather_kernel(x: &Tensor, d: usize, index: &Tensor) -> Result<Tensor> {
    let n = x.dims()[d];
    if index.numel() > 0 {
        // bounds, as the host path checks them (one small sync)
        let (lo, hi) = (
            index.amin(None, false)?.item()? as i64,
            index.amax(None, false)?.item()? as i64,
        );
        let bad = if lo < -(n as i64) { lo } else { hi };
        if lo < -(n as i64) || hi >= n as i64 {
            bail!(
                "gather",
                "index {bad} is out of range for dim {d} of size {n} (input shape {})",
                fmt_dims(x.dims())
            );
        }
    }
    let mut loop_dims = index.dims().to_vec();
    loop_dims.push(n);
    // x over [index dims.., j]: its own strides, dim d broadcast, j along dim d
    let mut xs: Vec<isize> = x.strides().to_vec();
    xs[d] = 0;
    xs.push(x.strides()[d]);
    let xv = x.with_layout(Layout {
        dims: loop_dims.iter().copied().collect(),
        strides: xs.into_iter().collect(),
        offset: x.offset(),
    });
    let iv = index.unsqueeze(-1)?.expand_to(&loop_dims)?;
    let j = Tensor::arange(n, DType::I64).to_device(x.device())?;
    let dt = x.dtype();
    let mut k = KernelCall::new();
    let xval = k.input(&xv, dt.compute());
    let ival = k.input(&iv, DType::I64);
    let jval = k.input(&j, DType::I64);
    // a negative index counts from the end
    let neg = k.binary(BinaryOp::Eq, ival, jval, DType::I64);
    let nj = k.scalar(n as f64, DType::I64);
    let jneg = k.binary(BinaryOp::Sub, jval, nj, DType::I64);
    let hit_neg = k.binary(BinaryOp::Eq, ival, jneg, DType::I64);
    let hit = k.binary(BinaryOp::Or, neg, hit_neg, DType::Bool);
    let zero = k.scalar(0.0, dt.compute());
    let v = k.select(hit, xval, zero, dt.compute());
    k.reduce("gather", ReduceKind::Sum, v, &loop_dims, dt, |_, acc| {
        vec![acc]
    })
}
