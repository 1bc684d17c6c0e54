//! Launching KernelIR over views on a CUDA device: the same dim collapsing
//! and specialisation as the CPU path (so both backends see the same
//! kernels), then one launch with a grid and a block instead of a split of
//! dim 0 across threads. f16/bf16 operands stay f16/bf16: the CUDA C loads
//! and stores them natively, where the CPU path widens them on the host.

use super::LaunchArgs;
use crate::launch::{specialise, View};
use crate::memory::Device;
use crate::profiler::{self, Category};
use crate::storage::Storage;
use kiln_codegen::cuda::POINTWISE_BLOCK;
use kiln_codegen::Kernel;
use kiln_ir::{bail, Result};

/// Most blocks per launch: kernels loop over the rest (grid-stride).
pub(crate) const MAX_GRID: usize = 1 << 16;

/// The device every operand is on, or an error naming the two that differ.
/// A one-element CPU input (a scalar tensor, broadcast or not) may join a
/// CUDA launch, as in PyTorch; it is uploaded with the launch.
pub fn launch_device(name: &str, views: &[View]) -> Result<Device> {
    let cuda = views
        .iter()
        .map(|v| v.storage.device())
        .find(|d| d.is_cuda());
    let Some(dev) = cuda else {
        return Ok(Device::Cpu);
    };
    for (i, v) in views.iter().enumerate() {
        let d = v.storage.device();
        // (a one-element storage: every index of its view reads element 0)
        if d != dev && !(d == Device::Cpu && v.storage.len() == 1 && i > 0) {
            bail!(
                name,
                "expected all tensors on one device, got {dev} and {d} (operand {i}, shape {:?})",
                v.layout.dims
            );
        }
    }
    Ok(dev)
}

/// Blocks and threads per block for `k` over loop dims `dims` (a reduction's
/// block at most `max_reduce_block` threads).
pub fn launch_shape(k: &Kernel, dims: &[usize], max_reduce_block: u32) -> (u32, u32) {
    match k.reduce {
        None => {
            // a vectorised kernel's threads take whole vectors
            let vec = kiln_codegen::cuda::vector_width(k).unwrap_or(1);
            let total: usize = dims.iter().product::<usize>().div_ceil(vec);
            let block = POINTWISE_BLOCK as usize;
            (
                total.div_ceil(block).clamp(1, MAX_GRID) as u32,
                block as u32,
            )
        }
        Some(_) => {
            let (rows, len) = dims.split_at(dims.len() - 1);
            let rows: usize = rows.iter().product();
            // a short row needs no more threads than elements (in whole warps)
            let block = (len[0].div_ceil(32) * 32).clamp(32, max_reduce_block as usize);
            (rows.clamp(1, MAX_GRID) as u32, block as u32)
        }
    }
}

/// Runs `template` over `views` on `dev` (see [`crate::launch::launch`]).
pub fn launch(dev: Device, template: &Kernel, views: &[View], scalars: &[u64]) -> Result<()> {
    let Device::Cuda(ordinal) = dev else {
        unreachable!("cuda launch on {dev}")
    };
    let _p = profiler::scope_with(Category::Kernel, || template.name.clone());
    let Some((k, cd, cs)) = specialise(template, views) else {
        return Ok(());
    };
    // scalar operands from the CPU travel with the launch
    let mut uploads: Vec<Storage> = vec![];
    let mut ptrs = vec![];
    for v in views {
        let base = if v.storage.device() == dev {
            v.storage.device_ptr()
        } else {
            uploads.push(v.storage.to_device(dev)?);
            uploads.last().unwrap().device_ptr()
        };
        ptrs.push(base + (v.layout.offset * v.dtype().size()) as u64);
    }
    let gpu = super::gpu(ordinal)?;
    let (grid, block) = launch_shape(&k, &cd, gpu.max_reduce_block());
    let args = LaunchArgs {
        ptrs,
        sizes: cd.iter().map(|&n| n as i64).collect(),
        strides: cs
            .iter()
            .flat_map(|s| s.iter().map(|&x| x as i64))
            .collect(),
        scalars: scalars.to_vec(),
        start: 0,
        end: cd[0] as i64,
        grid,
        block,
    };
    gpu.launch(&k, &args)
}
