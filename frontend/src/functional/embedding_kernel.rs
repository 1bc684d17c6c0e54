//! `embedding` on a CUDA device: the rows of the table picked by one launch
//! of the take kernel ([`take_rows`]), after one bounds check. Its backward
//! is `scatter_add`.

use crate::ops::gather_kernel::take_rows;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::Device;

/// `weight[indices]` as `[indices.numel(), dim]`, for `idx` (i64, any shape)
/// and `weight` `[v, dim]` (compute dtype) on one device.
pub(super) fn embedding_kernel(idx: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (v, d) = (weight.dims()[0], weight.dims()[1]);
    let flat = idx.reshape(&[-1, 1])?;
    let n = flat.dims()[0];
    if n > 0 {
        // one small sync, as the host path checks before gathering
        let lo = idx.amin(None, false)?.item()? as i64;
        let hi = idx.amax(None, false)?.item()? as i64;
        if lo < 0 || hi >= v as i64 {
            // the error path may read the indices to name the first bad one
            let host = idx.to_device(Device::Cpu)?.contiguous()?.to_vec::<i64>()?;
            let (pos, bad) = host
                .iter()
                .copied()
                .enumerate()
                .find(|&(_, i)| i < 0 || i >= v as i64)
                .unwrap_or((0, if lo < 0 { lo } else { hi }));
            bail!(
                "embedding",
                "index {bad} (at position {pos}) is out of range for weight {} with {v} rows",
                fmt_dims(&[v, d])
            );
        }
    }
    debug_assert_eq!(idx.dtype(), DType::I64);
    take_rows(weight, 0, &flat.contiguous()?)
}
