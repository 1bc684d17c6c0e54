//! Convolution on a CUDA device: one launch of the implicit-GEMM template
//! (`kiln_codegen::cuda::conv`), with a pointwise epilogue fused into it
//! when a compiled graph has one (Conv + folded BatchNorm + ReLU).

use super::epilogue::{epilogue_args, EpilogueViews};
use super::launch::{launch_device, MAX_GRID};
use crate::launch::View;
use crate::memory::Device;
use crate::profiler::{self, Category};
use kiln_codegen::cuda::conv::{conv_template, ConvSpec, Epilogue};
use kiln_codegen::cuda::template::TILE;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::{bail, Result};

/// The operands of one convolution: contiguous `x` `[N, C, H, W]`, `w`
/// `[K, C/groups, R, S]`, `bias` `[K]`, and a fresh contiguous `out`
/// `[N, K, OH, OW]` (the user's ranks, flattened the same way).
pub struct ConvViews<'a> {
    pub x: View<'a>,
    pub w: View<'a>,
    pub bias: Option<View<'a>>,
    pub out: View<'a>,
}

/// Runs `out = epilogue(conv(x, w) + bias)` for `g` as one launch on the
/// operands' device.
pub fn conv2d(g: &ConvGeometry, v: &ConvViews, epilogue: Option<&EpilogueViews>) -> Result<()> {
    let name = "conv2d";
    let mut all = vec![v.out, v.x, v.w];
    all.extend(v.bias);
    let dev = launch_device(name, &all)?;
    let Device::Cuda(ordinal) = dev else {
        bail!(
            name,
            "the CUDA conv needs its operands on a CUDA device, got {dev}"
        );
    };
    let dt = v.x.dtype();
    for (what, o) in [("input", v.x), ("weight", v.w), ("output", v.out)]
        .into_iter()
        .chain(v.bias.map(|b| ("bias", b)))
    {
        if o.dtype() != dt {
            bail!(name, "{what} is {} where the input is {dt}", o.dtype());
        }
        if !o.layout.is_contiguous() || o.storage.device() != dev {
            bail!(name, "the CUDA conv's {what} must be contiguous on {dev}");
        }
    }
    let [oh, ow] = g.out_size;
    let out_dims = [g.n, g.c_out, oh, ow];
    let e = epilogue
        .map(|e| epilogue_args(name, e, v.out, &out_dims, dev))
        .transpose()?;
    let spec = ConvSpec {
        dtype: dt,
        bias: v.bias.is_some(),
        epilogue: epilogue.zip(e.as_ref()).map(|(ev, a)| Epilogue {
            kernel: ev.kernel,
            value_operands: &a.value_operands,
        }),
    };
    let t = conv_template(&spec)?;
    let _p = profiler::scope_with(Category::Kernel, || t.name.clone());
    if out_dims.iter().product::<usize>() == 0 {
        return Ok(());
    }
    let addr = |o: &View| o.storage.device_ptr() + (o.layout.offset * o.dtype().size()) as u64;
    let mut words = vec![addr(&v.out), addr(&v.x), addr(&v.w)];
    words.extend(v.bias.as_ref().map(addr));
    if let Some(e) = &e {
        words.extend(&e.ptrs);
    }
    let [h, wd] = g.in_size;
    let [r, s] = g.kernel;
    let geometry = [
        g.n,
        g.c_in,
        h,
        wd,
        g.c_out,
        oh,
        ow,
        r,
        s,
        g.stride[0],
        g.stride[1],
        g.pad_begin[0],
        g.pad_begin[1],
        g.dilation[0],
        g.dilation[1],
        g.groups,
    ];
    words.extend(geometry.iter().map(|&x| x as u64));
    if let Some(e) = &e {
        words.extend(&e.tail);
    }
    if words.len() != t.params.len() {
        bail!(
            name,
            "{}: {} arguments for {} parameters",
            t.name,
            words.len(),
            t.params.len()
        );
    }
    let tiles = g.groups * g.c_out_per_group().div_ceil(TILE) * (g.n * oh * ow).div_ceil(TILE);
    let grid = tiles.clamp(1, MAX_GRID) as u32;
    super::gpu(ordinal)?.launch_template(&t, &words, grid)
}
