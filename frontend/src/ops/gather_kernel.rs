//! `gather` on a CUDA device as one generated reduction: for each output
//! position, the sum over `j` of `index == j ? x[.., j, ..] : 0` along the
//! gathered dim, with `x` and `index` read in place through broadcast views
//! and `j` from an `arange`. It reads the gathered dim whole for every output,
//! which is what a class dimension (cross-entropy's gather) costs anyway.
//! Its backward, `scatter_add`, is the same reduction turned round.

use crate::ops::kernel::KernelCall;
use crate::ops::pointwise::copy_into;
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
    gather_unchecked(x, d, index)
}

/// [`gather_kernel`] without the bounds check, for callers that checked.
pub(crate) fn gather_unchecked(x: &Tensor, d: usize, index: &Tensor) -> Result<Tensor> {
    let n = x.dims()[d];
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

/// `zeros(dims).scatter_add(d, index, src)` (index i64 of `src`'s shape, in
/// range; `src` no larger than `dims` off `d`) on `src`'s device, as one
/// reduction: each output position sums, over `j` along `d`, `src` where
/// `index == position`. It reads `src`'s dim `d` whole for every output
/// position (`dims[d] * src.dims()[d]` per line: an embedding gradient costs
/// vocabulary x tokens x width) but is deterministic and needs no atomics.
pub(crate) fn scatter_add_kernel(
    dims: &[usize],
    d: usize,
    index: &Tensor,
    src: &Tensor,
) -> Result<Tensor> {
    let (sd, n) = (src.dims().to_vec(), dims[d]);
    let mut kept = sd.clone();
    kept[d] = n;
    let mut loop_dims = kept.clone();
    loop_dims.push(sd[d]);
    // src and index over [kept.., j]: dim d broadcast, j along their dim d
    let along = |t: &Tensor| {
        let mut st: Vec<isize> = t.strides().to_vec();
        let sj = st[d];
        st[d] = 0;
        st.push(sj);
        t.with_layout(Layout {
            dims: loop_dims.iter().copied().collect(),
            strides: st.into_iter().collect(),
            offset: t.offset(),
        })
    };
    let (sv, iv) = (along(src), along(&index.expand_to(&sd)?));
    let mut at = vec![1usize; loop_dims.len()];
    at[d] = n;
    let pos = Tensor::arange(n, DType::I64)
        .reshape_dims(&at)?
        .to_device(src.device())?;
    let dt = src.dtype();
    let mut k = KernelCall::new();
    let x = k.input(&sv, dt.compute());
    let i = k.input(&iv, DType::I64);
    let p = k.input(&pos, DType::I64);
    // a negative index counts from the end
    let hit = k.binary(BinaryOp::Eq, i, p, DType::I64);
    let nv = k.scalar(n as f64, DType::I64);
    let pneg = k.binary(BinaryOp::Sub, p, nv, DType::I64);
    let hit_neg = k.binary(BinaryOp::Eq, i, pneg, DType::I64);
    let hit = k.binary(BinaryOp::Or, hit, hit_neg, DType::Bool);
    let zero = k.scalar(0.0, dt.compute());
    let v = k.select(hit, x, zero, dt.compute());
    let out = k.reduce(
        "scatter_add",
        ReduceKind::Sum,
        v,
        &loop_dims,
        dt,
        |_, acc| vec![acc],
    )?;
    if kept == dims {
        return Ok(out);
    }
    let full = Tensor::zeros_on(dims, dt, src.device())?;
    let mut region = full.clone();
    for (k, &e) in kept.iter().enumerate() {
        region = region.narrow(k as i64, 0, e)?;
    }
    copy_into(&out, &region)?;
    Ok(full)
}
