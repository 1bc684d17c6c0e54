//! Fused attention on a CUDA device: the templates of
//! `kiln_codegen::cuda::attention` launched over contiguous query, key,
//! value (and output) views and a strided mask.

use super::launch::{launch_device, MAX_GRID};
use crate::externs::attention::AttnCall;
use crate::launch::View;
use crate::memory::Device;
use crate::profiler::{self, Category};
use kiln_codegen::cuda::attention::{attention_templates, ATTENTION_BLOCK};
use kiln_ir::{bail, Result};

/// The optional mask of a device call, a view over `[N, H, L, S]`.
#[derive(Clone, Copy)]
pub enum DeviceMask<'a> {
    None,
    Bool(View<'a>),
    Float(View<'a>),
}

fn addr(v: &View) -> u64 {
    v.storage.device_ptr() + (v.layout.offset * v.dtype().size()) as u64
}

/// The shared tail of every launch: mask pointers, sizes, scale.
fn tail(call: &AttnCall, mask: &DeviceMask) -> Vec<u64> {
    let d = call.dims;
    let (kind, ptrs, st) = match mask {
        DeviceMask::None => (0u64, [0, 0], vec![0isize; 4]),
        DeviceMask::Bool(m) => (1, [addr(m), 0], m.layout.strides.to_vec()),
        DeviceMask::Float(m) => (2, [0, addr(m)], m.layout.strides.to_vec()),
    };
    let mut w = ptrs.to_vec();
    w.extend([d.n, d.h, d.hk, d.l, d.s, d.e, d.ev].map(|x| x as u64));
    w.extend([call.is_causal as u64, kind]);
    w.extend(st.iter().map(|&s| s as i64 as u64));
    w.push(call.scale.to_bits());
    w
}

fn ordinal(name: &str, views: &[View]) -> Result<u8> {
    match launch_device(name, views)? {
        Device::Cuda(o) => Ok(o),
        d => bail!(
            name,
            "the CUDA attention needs its operands on a CUDA device, got {d}"
        ),
    }
}

fn grid(threads: usize) -> u32 {
    threads
        .div_ceil(ATTENTION_BLOCK as usize)
        .clamp(1, MAX_GRID) as u32
}

/// `out [N, H, L, Ev]` and `lse [N, H, L]` of one fused attention call; q,
/// k, v, out and lse contiguous views in one float dtype.
pub fn attention_forward(
    call: &AttnCall,
    [q, k, v]: [View; 3],
    mask: DeviceMask,
    out: View,
    lse: View,
) -> Result<()> {
    let name = "scaled_dot_product_attention";
    let o = ordinal(name, &[out, lse, q, k, v])?;
    let [t, _, _] = attention_templates(out.dtype())?;
    let _p = profiler::scope_with(Category::Kernel, || t.name.clone());
    let d = call.dims;
    if d.n * d.h * d.l == 0 {
        return Ok(());
    }
    let mut words = [out, lse, q, k, v].iter().map(addr).collect::<Vec<_>>();
    words.extend(tail(call, &mask));
    super::gpu(o)?.launch_template(&t, &words, grid(d.n * d.h * d.l))
}

/// The gradients `dq, dk, dv` of one call, from `q, k, v`, the saved `out`
/// and `lse`, and the output gradient `gout` (all contiguous); `delta`
/// (`[N, H, L]`) is scratch.
pub fn attention_backward(
    call: &AttnCall,
    [q, k, v]: [View; 3],
    mask: DeviceMask,
    [out, lse, gout]: [View; 3],
    [dq, dk, dv, delta]: [View; 4],
) -> Result<()> {
    let name = "scaled_dot_product_attention_backward";
    let o = ordinal(name, &[dq, dk, dv, delta, q, k, v, out, lse, gout])?;
    let [_, tq, tkv] = attention_templates(dq.dtype())?;
    let d = call.dims;
    let gpu = super::gpu(o)?;
    let rest = tail(call, &mask);
    let mut words = [dq, delta, q, k, v, out, lse, gout]
        .iter()
        .map(addr)
        .collect::<Vec<_>>();
    words.extend(&rest);
    {
        let _p = profiler::scope_with(Category::Kernel, || tq.name.clone());
        if d.n * d.h * d.l > 0 {
            gpu.launch_template(&tq, &words, grid(d.n * d.h * d.l))?;
        }
    }
    let mut words = [dk, dv, q, k, v, delta, lse, gout]
        .iter()
        .map(addr)
        .collect::<Vec<_>>();
    words.extend(&rest);
    let _p = profiler::scope_with(Category::Kernel, || tkv.name.clone());
    if d.n * d.hk * d.s == 0 {
        return Ok(());
    }
    gpu.launch_template(&tkv, &words, grid(d.n * d.hk * d.s))
}
