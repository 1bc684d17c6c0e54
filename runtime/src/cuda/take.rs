//! Rows picked by an index on a CUDA device: one launch of the take
//! template (`kiln_codegen::cuda::take`), for `index_select` and `embedding`.

use super::launch::{launch_device, MAX_GRID};
use crate::launch::View;
use crate::memory::Device;
use crate::profiler::{self, Category};
use kiln_codegen::cuda::take::take_template;
use kiln_ir::{bail, DType, Result};

/// `out [O, K, I] = x [O, n, I] at rows index [K]`: `x` any view of those
/// dims, `index` contiguous i64 with every entry in `-n..n` (checked by the
/// caller), `out` contiguous, of `x`'s dtype.
pub fn take(x: View, index: View, out: View) -> Result<()> {
    let name = "index_select";
    let dev = launch_device(name, &[out, x, index])?;
    let Device::Cuda(ordinal) = dev else {
        bail!(
            name,
            "the CUDA take needs its operands on a CUDA device, got {dev}"
        );
    };
    let (dx, di, dout) = (&x.layout.dims, &index.layout.dims, &out.layout.dims);
    if dx.len() != 3 || di.len() != 1 || dout.as_slice() != [dx[0], di[0], dx[2]] {
        bail!(
            name,
            "expected [O, n, I] at [K] into [O, K, I], got {dx:?} at {di:?} into {dout:?}"
        );
    }
    if index.dtype() != DType::I64 || out.dtype() != x.dtype() {
        bail!(
            name,
            "index {} and output {} for an input of {}",
            index.dtype(),
            out.dtype(),
            x.dtype()
        );
    }
    for (what, v) in [("index", &index), ("output", &out)] {
        if !v.layout.is_contiguous() || v.storage.device() != dev {
            bail!(name, "the CUDA take's {what} must be contiguous on {dev}");
        }
    }
    let t = take_template(x.dtype());
    let _p = profiler::scope_with(Category::Kernel, || t.name.clone());
    let total: usize = dout.iter().product();
    if total == 0 {
        return Ok(());
    }
    let addr = |v: &View| v.storage.device_ptr() + (v.layout.offset * v.dtype().size()) as u64;
    let s = &x.layout.strides;
    let mut words = vec![addr(&out), addr(&x), addr(&index)];
    words.extend([dx[0], di[0], dx[2], dx[1]].map(|v| v as u64));
    words.extend([s[0], s[1], s[2]].map(|v| v as i64 as u64));
    let grid = total.div_ceil(t.block as usize).clamp(1, MAX_GRID) as u32;
    super::gpu(ordinal)?.launch_template(&t, &words, grid)
}
