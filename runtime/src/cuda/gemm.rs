//! Matrix products on a CUDA device: one launch of the tiled GEMM template
//! (`kiln_codegen::cuda::gemm`) over strided operands, with a compiled
//! graph's pointwise epilogue fused in when it has one.

use super::epilogue::{epilogue_args, EpilogueViews};
use super::launch::{launch_device, MAX_GRID};
use crate::launch::View;
use crate::memory::Device;
use crate::profiler::{self, Category};
use kiln_codegen::cuda::epilogue::Epilogue;
use kiln_codegen::cuda::gemm::{gemm_template, GemmSpec};
use kiln_codegen::cuda::template::TILE;
use kiln_ir::{bail, Result};

/// `out [B, M, N] = epilogue(a [B, M, K] @ w [B, K, N])`: `a` and `w` any
/// views of those dims (stride 0 broadcasts a batch), `out` contiguous; f32
/// or f64. The epilogue's views have the dims `[B, M, N]`.
pub fn gemm(a: View, w: View, out: View, epilogue: Option<&EpilogueViews>) -> Result<()> {
    let name = "matmul";
    let dev = launch_device(name, &[out, a, w])?;
    let Device::Cuda(ordinal) = dev else {
        bail!(
            name,
            "the CUDA GEMM needs its operands on a CUDA device, got {dev}"
        );
    };
    let dims = |v: &View| v.layout.dims.to_vec();
    let (da, dw, dout) = (dims(&a), dims(&w), dims(&out));
    let ok = da.len() == 3
        && dw.len() == 3
        && dout.len() == 3
        && da[0] == dw[0]
        && da[2] == dw[1]
        && dout == [da[0], da[1], dw[2]];
    if !ok {
        bail!(
            name,
            "expected [B, M, K] @ [B, K, N] into [B, M, N], got {da:?} @ {dw:?} into {dout:?}"
        );
    }
    let dt = out.dtype();
    if a.dtype() != dt || w.dtype() != dt {
        bail!(name, "operands {} and {} into {dt}", a.dtype(), w.dtype());
    }
    if !out.layout.is_contiguous() {
        bail!(name, "the CUDA GEMM writes a contiguous output");
    }
    for (what, v) in [("left", &a), ("right", &w)] {
        if v.storage.device() != dev {
            bail!(
                name,
                "{what} operand on {}, output on {dev}",
                v.storage.device()
            );
        }
    }
    let e = epilogue
        .map(|e| epilogue_args(name, e, out, &dout, dev))
        .transpose()?;
    let spec = GemmSpec {
        dtype: dt,
        epilogue: epilogue.zip(e.as_ref()).map(|(ev, a)| Epilogue {
            kernel: ev.kernel,
            value_operands: &a.value_operands,
        }),
    };
    let t = gemm_template(&spec)?;
    let _p = profiler::scope_with(Category::Kernel, || t.name.clone());
    let [b, m, n] = [dout[0], dout[1], dout[2]];
    if b * m * n == 0 {
        return Ok(());
    }
    let addr = |v: &View| v.storage.device_ptr() + (v.layout.offset * v.dtype().size()) as u64;
    let (sa, sw) = (&a.layout.strides, &w.layout.strides);
    let mut words = vec![addr(&out), addr(&a), addr(&w)];
    if let Some(e) = &e {
        words.extend(&e.ptrs);
    }
    words.extend([b, m, n, da[2]].map(|x| x as u64));
    words.extend([sa[0], sa[1], sa[2], sw[0], sw[1], sw[2]].map(|s| s as i64 as u64));
    if let Some(e) = &e {
        words.extend(&e.tail);
    }
    let tiles = b * m.div_ceil(TILE) * n.div_ceil(TILE);
    super::gpu(ordinal)?.launch_template(&t, &words, tiles.clamp(1, MAX_GRID) as u32)
}
