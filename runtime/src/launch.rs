//! Launching KernelIR over strided views: dim collapsing, the kernel cache
//! (`launch/cache.rs`) and launch capture (`launch/capture.rs`),
//! f16/bf16 widening, and splitting dim 0 across threads.

use crate::profiler::{self, Category};
use crate::storage::Storage;
use crate::strided::for_each_offset_pair;
use kiln_codegen::cpu::{CompiledKernel, CpuJit};
use kiln_codegen::{Inner, Kernel};
use kiln_ir::op::Layout;
use kiln_ir::{DType, Result, Strides};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod cache;
mod capture;
pub use cache::*;
pub use capture::*;

/// A strided operand: a layout over a storage.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub storage: &'a Storage,
    pub layout: &'a Layout,
}

impl View<'_> {
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
}

/// Loop dims and per-operand strides after dropping size-1 dims and merging
/// dims that are contiguous with each other in every operand. With a
/// reduction the last dim is the reduced one and is never merged away.
pub fn collapse(dims: &[usize], strides: &[Strides], reduce: bool) -> (Vec<usize>, Vec<Strides>) {
    let r = dims.len();
    let keep_last = reduce && r > 0;
    let outer = if keep_last { r - 1 } else { r };
    let mut cd: Vec<usize> = vec![];
    let mut cs: Vec<Strides> = vec![Strides::new(); strides.len()];
    for d in 0..outer {
        if dims[d] == 1 {
            continue;
        }
        let mergeable = !cd.is_empty()
            && strides
                .iter()
                .zip(&cs)
                .all(|(s, c)| *c.last().unwrap() == s[d] * dims[d] as isize);
        if mergeable {
            *cd.last_mut().unwrap() *= dims[d];
            for (s, c) in strides.iter().zip(cs.iter_mut()) {
                *c.last_mut().unwrap() = s[d];
            }
        } else {
            cd.push(dims[d]);
            for (s, c) in strides.iter().zip(cs.iter_mut()) {
                c.push(s[d]);
            }
        }
    }
    if keep_last {
        cd.push(dims[r - 1]);
        for (s, c) in strides.iter().zip(cs.iter_mut()) {
            c.push(s[r - 1]);
        }
    }
    if cd.is_empty() {
        cd.push(1);
        for c in cs.iter_mut() {
            c.push(0);
        }
    }
    (cd, cs)
}

struct SendPtrs(Vec<*mut u8>);
unsafe impl Send for SendPtrs {}
unsafe impl Sync for SendPtrs {}

impl SendPtrs {
    // a method, so closures capture the Sync wrapper rather than its field
    fn get(&self) -> &[*mut u8] {
        &self.0
    }
}

/// Work below this many elements runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// Runs `template` (its operand dtypes and body; rank and inner patterns are
/// filled in here) over `views`, which all have the loop dims (the leading
/// [`Kernel::outputs`] are the outputs; a reduction's has stride 0 along the last dim).
pub fn launch(template: &Kernel, views: &[View], scalars: &[u64]) -> Result<()> {
    let dev = crate::cuda::launch::launch_device(&template.name, views)?;
    if dev.is_cuda() {
        note_captured(|| Captured::Opaque("a CUDA launch"));
        return crate::cuda::launch::launch(dev, template, views, scalars);
    }
    // f16/bf16 operands: kernels never see them; widen inputs, narrow the output.
    if views.iter().any(|v| v.dtype().is_half()) {
        note_captured(|| Captured::Opaque("f16/bf16 operands widened around the kernel"));
        return launch_widened(template, views, scalars);
    }
    let _p = profiler::scope_with(Category::Kernel, || template.name.clone())
        .shapes(|| views.iter().map(|v| operand_dims(v.layout)).collect())
        .bytes(|| views.iter().map(operand_bytes).sum());
    let Some((k, cd, cs)) = specialise(template, views) else {
        return Ok(());
    };
    let f = compiled(&k)?;
    let ptrs: Vec<*mut u8> = views
        .iter()
        .map(|v| unsafe { v.storage.ptr().add(v.layout.offset * v.dtype().size()) })
        .collect();
    let flat_strides: Vec<isize> = cs.iter().flat_map(|s| s.iter().copied()).collect();
    // a rank-1 reduction has no kept dim to split: its dim 0 is the reduced one
    let splittable = cd.len() > usize::from(template.reduce.is_some());
    if capturing() {
        note_captured(|| {
            Captured::Launch(CapturedLaunch {
                exec: f.clone(),
                kernel: Arc::new(k.clone()),
                dims: cd.clone(),
                strides: flat_strides.clone(),
                scalars: scalars.to_vec(),
                storages: views.iter().map(|v| v.storage as *const Storage).collect(),
                ids: views.iter().map(|v| v.storage.id()).collect(),
                offsets: views.iter().map(|v| v.layout.offset).collect(),
                dtypes: views.iter().map(|v| v.dtype()).collect(),
                lens: views.iter().map(|v| v.storage.len()).collect(),
                splittable,
            })
        });
    }
    // SAFETY: the views describe live buffers of the kernel's operands
    unsafe { run_launch(&f, ptrs, &flat_strides, &cd, scalars, splittable) };
    Ok(())
}

/// Runs compiled kernel `f` over operands starting at `ptrs` (outputs first)
/// with collapsed loop dims `dims` and flattened per-operand `strides`,
/// splitting dim 0 across threads when the work is large and `splittable`.
/// [`launch`] ends here; the compiled executor calls it directly with a
/// launch it captured once ([`capture_launches`]).
///
/// # Safety
/// The pointers, strides and dims must describe live buffers laid out as the
/// kernel was specialised for.
pub unsafe fn run_launch(
    f: &Executable,
    ptrs: Vec<*mut u8>,
    strides: &[isize],
    dims: &[usize],
    scalars: &[u64],
    splittable: bool,
) {
    let ptrs = SendPtrs(ptrs);
    let total: usize = dims.iter().product();
    let n0 = dims[0];
    let threads = rayon::current_num_threads();
    let run =
        |start: usize, end: usize| unsafe { f.run(ptrs.get(), strides, dims, scalars, start, end) };
    if total < PARALLEL_MIN || n0 < 2 || threads < 2 || !splittable {
        run(0, n0);
    } else {
        let chunks = n0.min(threads * 4);
        let each = |_: &mut (), c| {
            let r = crate::par::range(n0, chunks, c);
            run(r.start, r.end)
        };
        // The caller takes part even in long launches (unlike a long conv's
        // regions, `par::pooled`): handing W1-W3's 4M-element launches to
        // the pool whole ran 4-7% slower (W3 compiled 0.675 against 0.637
        // ms, W2 1.042 against 0.979, medians of 6 alternating runs, Xeon
        // model 207, 2 threads), and ResNet-18 and MobileNetV3 measured the
        // same either way (99.9 against 100.2 ms, 12.6 against 12.2, 10).
        crate::par::for_each_chunk(chunks, || (), each);
    }
}

/// `template` specialised for `views`: loop dims collapsed (see [`collapse`]),
/// its rank and each operand's inner-stride pattern set, noted for
/// [`record_kernels`]; with the collapsed dims and strides. None when there
/// is nothing to do (an empty output of a pointwise kernel, or empty kept dims).
pub(crate) fn specialise(
    template: &Kernel,
    views: &[View],
) -> Option<(Kernel, Vec<usize>, Vec<Strides>)> {
    let dims = &views[0].layout.dims;
    if dims.contains(&0) && template.reduce.is_none() {
        return None;
    }
    let strides: Vec<Strides> = views.iter().map(|v| v.layout.strides.clone()).collect();
    let (cd, cs) = collapse(dims, &strides, template.reduce.is_some());
    if cd[..cd.len() - usize::from(template.reduce.is_some())].contains(&0) {
        return None;
    }
    let mut k = template.clone();
    SPECIALISED.fetch_add(1, Ordering::Relaxed);
    k.rank = cd.len();
    for ((op, s), v) in k.operands.iter_mut().zip(&cs).zip(views) {
        op.inner = Inner::of_stride(*s.last().unwrap());
        // only CUDA kernels see f16/bf16 (the CPU path widens them before this)
        if v.dtype().is_half() {
            op.dtype = v.dtype();
        }
    }
    note_launched(&k);
    Some((k, cd, cs))
}

/// An operand's dims as the profiler reports them: broadcast (stride-0) dims as 1.
fn operand_dims(l: &Layout) -> Vec<usize> {
    l.dims
        .iter()
        .zip(&l.strides)
        .map(|(&d, &s)| if s == 0 { d.min(1) } else { d })
        .collect()
}

/// Bytes an operand occupies (its distinct elements: broadcast dims count once).
fn operand_bytes(v: &View) -> u64 {
    (operand_dims(v.layout).iter().product::<usize>() * v.dtype().size()) as u64
}

fn launch_widened(template: &Kernel, views: &[View], scalars: &[u64]) -> Result<()> {
    let mut k = template.clone();
    let mut temps: Vec<(Storage, Layout)> = vec![];
    let nout = template.outputs();
    // an output is read first only when the kernel loads it (an in-place update)
    let loaded = |i: usize| {
        i >= nout
            || template
                .body
                .iter()
                .any(|(ins, _)| *ins == kiln_codegen::Instr::Load(i))
    };
    for (i, v) in views.iter().enumerate() {
        if v.dtype().is_half() {
            k.operands[i].dtype = DType::F32;
            let l = Layout::contiguous(&v.layout.dims);
            let s = Storage::try_empty(DType::F32, l.numel())?;
            if loaded(i) {
                convert(
                    *v,
                    View {
                        storage: &s,
                        layout: &l,
                    },
                );
            }
            // the output keeps its broadcast-along-reduction stride pattern
            let mut l = l;
            if i == 0 && template.reduce.is_some() {
                if let Some(last) = l.strides.last_mut() {
                    *last = 0;
                }
                let contiguous_kept = Layout::contiguous(&v.layout.dims[..v.layout.rank() - 1]);
                for (d, st) in contiguous_kept.strides.iter().enumerate() {
                    l.strides[d] = *st;
                }
            }
            temps.push((s, l));
        } else {
            temps.push((Storage::empty(DType::F32, 0), Layout::contiguous(&[])));
        }
    }
    let widened: Vec<View> = views
        .iter()
        .zip(&temps)
        .map(|(v, (s, l))| {
            if v.dtype().is_half() {
                View {
                    storage: s,
                    layout: l,
                }
            } else {
                *v
            }
        })
        .collect();
    launch(&k, &widened, scalars)?;
    for (w, v) in widened.iter().zip(views).take(nout) {
        if v.dtype().is_half() {
            convert(*w, *v);
        }
    }
    Ok(())
}

/// Host-side elementwise conversion between any two dtypes (CPU storages
/// only: on a device a conversion is a kernel like any other), with
/// round-to-nearest-even into f16/bf16 (crate `half`). Views must have equal dims
/// (broadcast strides in `src` are fine; a reduced output view is written once per element).
pub fn convert(src: View, dst: View) {
    let _p = profiler::scope("convert", Category::Memcpy)
        .shapes(|| vec![dst.layout.dims.to_vec(), src.layout.dims.to_vec()])
        .bytes(|| operand_bytes(&src) + operand_bytes(&dst));
    let (sd, dd) = (src.dtype(), dst.dtype());
    let exact_int = !sd.is_float() && !dd.is_float();
    // element by element, no temporary: a u8 `ones` of 100 MB costs 100 MB
    // (a reduction output view has stride 0 on its last dim: writing the
    // same element repeatedly is harmless because the values repeat too)
    unsafe {
        let p = src.storage.ptr();
        let q = dst.storage.ptr();
        for_each_offset_pair(src.layout, dst.layout, |os, od| {
            if exact_int {
                write_i64(q, dd, od, read_i64(p, sd, os));
            } else {
                write_f64(q, dd, od, read_f64(p, sd, os));
            }
        });
    }
}

unsafe fn read_f64(p: *const u8, d: DType, o: usize) -> f64 {
    match d {
        DType::F32 => *(p as *const f32).add(o) as f64,
        DType::F64 => *(p as *const f64).add(o),
        DType::F16 => half::f16::from_bits(*(p as *const u16).add(o)).to_f64(),
        DType::BF16 => half::bf16::from_bits(*(p as *const u16).add(o)).to_f64(),
        _ => read_i64(p, d, o) as f64,
    }
}

unsafe fn read_i64(p: *const u8, d: DType, o: usize) -> i64 {
    match d {
        DType::Bool | DType::U8 => *p.add(o) as i64,
        DType::I8 => *(p as *const i8).add(o) as i64,
        DType::I16 => *(p as *const i16).add(o) as i64,
        DType::I32 => *(p as *const i32).add(o) as i64,
        DType::I64 => *(p as *const i64).add(o),
        _ => read_f64(p, d, o) as i64,
    }
}

unsafe fn write_f64(p: *mut u8, d: DType, o: usize, v: f64) {
    match d {
        // f64 -> f32 -> f16 would round twice; half rounds f32 inputs, and f16
        // values come from f32 kernels, so go through f32 exactly as PyTorch does.
        DType::F32 => *(p as *mut f32).add(o) = v as f32,
        DType::F64 => *(p as *mut f64).add(o) = v,
        DType::F16 => *(p as *mut u16).add(o) = half::f16::from_f32(v as f32).to_bits(),
        DType::BF16 => *(p as *mut u16).add(o) = half::bf16::from_f32(v as f32).to_bits(),
        DType::Bool => *p.add(o) = (v != 0.0) as u8,
        // float -> int truncates toward zero, then wraps to the width
        _ => write_i64(p, d, o, v as i64),
    }
}

unsafe fn write_i64(p: *mut u8, d: DType, o: usize, v: i64) {
    match d {
        DType::Bool => *p.add(o) = (v != 0) as u8,
        DType::U8 => *p.add(o) = v as u8,
        DType::I8 => *(p as *mut i8).add(o) = v as i8,
        DType::I16 => *(p as *mut i16).add(o) = v as i16,
        DType::I32 => *(p as *mut i32).add(o) = v as i32,
        DType::I64 => *(p as *mut i64).add(o) = v,
        _ => write_f64(p, d, o, v as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strides(v: &[isize]) -> Strides {
        smallvec::SmallVec::from_slice(v)
    }

    #[test]
    fn collapse_merges_contiguous_and_keeps_reduce_axis() {
        let (d, s) = collapse(
            &[2, 3, 4],
            &[strides(&[12, 4, 1]), strides(&[12, 4, 1])],
            false,
        );
        assert_eq!(d, vec![24]);
        assert_eq!(s[0].as_slice(), &[1]);
        let (d, _) = collapse(
            &[2, 3, 4],
            &[strides(&[3, 1, 0]), strides(&[12, 4, 1])],
            true,
        );
        assert_eq!(d, vec![6, 4]);
        // a transpose cannot merge
        let (d, _) = collapse(&[3, 2], &[strides(&[2, 1]), strides(&[1, 3])], false);
        assert_eq!(d, vec![3, 2]);
    }
}
