//! Launching KernelIR over strided views: dim collapsing, the kernel cache,
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

/// How launched kernels execute: Cranelift machine code, or the reference
/// interpreter when `KILN_BACKEND=interp` (to tell a miscompile from a bad kernel).
enum Backend {
    Jit,
    Interp,
}

/// A kernel ready to run.
pub enum Executable {
    /// Machine code, and the JIT generation that holds it (kept alive while
    /// this executable is: see [`kernel_cache`]).
    Native(CompiledKernel, Arc<Generation>),
    Interpreted(Kernel),
}

/// One JIT module's worth of kernels. The cache compiles into its newest
/// generation and retires the oldest once the machine code it holds passes
/// the bound; a retired generation's code is freed when the last executable
/// compiled in it (a compiled plan may still hold some) is dropped.
pub struct Generation {
    jit: Mutex<Option<CpuJit>>,
}

impl Drop for Generation {
    fn drop(&mut self) {
        let jit = self.jit.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(jit) = jit {
            // SAFETY: every executable compiled in this generation holds an
            // `Arc` to it, and its function pointer is only called through
            // that executable: none is left.
            unsafe { jit.free_memory() }
        }
    }
}

impl Executable {
    /// Runs dim 0 over `start..end` (see [`kiln_codegen::KernelFn`] for the ABI).
    ///
    /// # Safety
    /// Pointers, strides and sizes must describe valid buffers for the kernel.
    pub unsafe fn run(
        &self,
        ptrs: &[*mut u8],
        strides: &[isize],
        sizes: &[usize],
        scalars: &[u64],
        start: usize,
        end: usize,
    ) {
        match self {
            Executable::Native(f, _) => (f.func())(
                ptrs.as_ptr(),
                strides.as_ptr(),
                sizes.as_ptr(),
                scalars.as_ptr(),
                start,
                end,
            ),
            Executable::Interpreted(k) => {
                kiln_codegen::interp::run_kernel(k, ptrs, strides, sizes, scalars, start, end)
            }
        }
    }
}

struct Cache {
    backend: Backend,
    /// Each kernel's executable and the id of the generation holding it.
    kernels: HashMap<Kernel, (Arc<Executable>, u64)>,
    /// Live generations, oldest first; the last is the one compiled into.
    generations: std::collections::VecDeque<GenerationUse>,
    next_generation: u64,
}

struct GenerationUse {
    id: u64,
    owner: Arc<Generation>,
    /// Bytes of machine code compiled into it.
    bytes: usize,
}

/// Generations the bound is split into: a new one starts when the newest
/// holds a quarter of the bound, so retiring the oldest frees about that.
const GENERATIONS: usize = 4;

static LIMIT: OnceLock<AtomicUsize> = OnceLock::new();
static EVICTED: AtomicUsize = AtomicUsize::new(0);

fn limit() -> &'static AtomicUsize {
    LIMIT.get_or_init(|| {
        let mb = std::env::var("KILN_KERNEL_CACHE_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(512);
        AtomicUsize::new(mb.saturating_mul(1 << 20))
    })
}

/// Sets the bound on the kernel cache's machine code, in bytes (default
/// 512 MiB, or `KILN_KERNEL_CACHE_MB`): past it, the oldest generation of
/// kernels is dropped from the cache and recompiled when next launched.
/// The newest generation is never retired, so one kernel bigger than the
/// bound still stays (the bound should be many kernels' worth).
///
/// ```
/// kiln_runtime::launch::set_kernel_cache_limit(64 << 20);
/// assert_eq!(kiln_runtime::launch::kernel_cache().limit, 64 << 20);
/// ```
pub fn set_kernel_cache_limit(bytes: usize) {
    limit().store(bytes, Ordering::Relaxed);
}

/// The JIT kernel cache's size and bound (also in `memory_summary()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCacheMemory {
    /// Kernels the cache holds.
    pub kernels: usize,
    /// Bytes of machine code in the generations the cache holds.
    pub code_bytes: usize,
    pub generations: usize,
    /// The bound on `code_bytes`.
    pub limit: usize,
    /// Kernels dropped from the cache since the process started.
    pub evicted: usize,
}

/// A snapshot of the kernel cache's memory (see [`KernelCacheMemory`]).
pub fn kernel_cache() -> KernelCacheMemory {
    let limit = limit().load(Ordering::Relaxed);
    let (kernels, code_bytes, generations) = match CACHE.get() {
        Some(c) => {
            let c = c.lock().unwrap_or_else(|e| e.into_inner());
            (
                c.kernels.len(),
                c.generations.iter().map(|g| g.bytes).sum(),
                c.generations.len(),
            )
        }
        None => (0, 0, 0),
    };
    KernelCacheMemory {
        kernels,
        code_bytes,
        generations,
        limit,
        evicted: EVICTED.load(Ordering::Relaxed),
    }
}

impl Cache {
    /// The generation to compile into, starting a new one when the newest is full.
    fn current(&mut self) -> Result<&mut GenerationUse> {
        let per = (limit().load(Ordering::Relaxed) / GENERATIONS).max(1);
        if self.generations.back().is_none_or(|g| g.bytes >= per) {
            let jit = CpuJit::new()?;
            self.next_generation += 1;
            self.generations.push_back(GenerationUse {
                id: self.next_generation,
                owner: Arc::new(Generation {
                    jit: Mutex::new(Some(jit)),
                }),
                bytes: 0,
            });
        }
        Ok(self.generations.back_mut().expect("a generation"))
    }

    /// Retires the oldest generations while the code held passes the bound.
    fn evict(&mut self) {
        let limit = limit().load(Ordering::Relaxed);
        while self.generations.len() > 1
            && self.generations.iter().map(|g| g.bytes).sum::<usize>() > limit
        {
            let old = self.generations.pop_front().expect("a generation");
            let before = self.kernels.len();
            self.kernels.retain(|_, (_, id)| *id != old.id);
            EVICTED.fetch_add(before - self.kernels.len(), Ordering::Relaxed);
        }
    }
}

static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
static HITS: AtomicUsize = AtomicUsize::new(0);
static COMPILES: AtomicUsize = AtomicUsize::new(0);
static SPECIALISED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static RECORDING: std::cell::RefCell<Option<Vec<Kernel>>> = const { std::cell::RefCell::new(None) };
    static CAPTURE: std::cell::RefCell<Option<Vec<Captured>>> = const { std::cell::RefCell::new(None) };
}

/// One launch seen by [`capture_launches`]: everything needed to run it
/// again on other buffers of the same layouts without building KernelIR or
/// looking machine code up.
pub enum Captured {
    /// A CPU launch: machine code, collapsed loop dims, per-operand strides
    /// (flattened) and where each operand starts.
    Launch(CapturedLaunch),
    /// A launch that cannot be replayed as one call (a CUDA device, or
    /// f16/bf16 operands widened through temporaries).
    Opaque(&'static str),
}

/// A replayable CPU launch (see [`Captured`]).
pub struct CapturedLaunch {
    pub exec: Arc<Executable>,
    /// The kernel as specialised for this launch (for [`record_kernels`]).
    pub kernel: Arc<Kernel>,
    pub dims: Vec<usize>,
    pub strides: Vec<isize>,
    pub scalars: Vec<u64>,
    /// Per operand (outputs first): its storage and the element offset of its view.
    pub storages: Vec<*const Storage>,
    /// Per operand: its storage's [`Storage::id`] (an address is reused once
    /// its storage is freed; the id is not).
    pub ids: Vec<u64>,
    pub offsets: Vec<usize>,
    /// Per operand: its storage's dtype and length in elements.
    pub dtypes: Vec<DType>,
    pub lens: Vec<usize>,
    /// Dim 0 may be split across threads.
    pub splittable: bool,
}

/// Runs `f` and returns the launches it made on this thread, for replay with
/// [`run_launch`] (the compiled executor's prebuilt launch list).
pub fn capture_launches<R>(f: impl FnOnce() -> R) -> (R, Vec<Captured>) {
    let prev = CAPTURE.with(|c| c.borrow_mut().replace(vec![]));
    let out = f();
    let got = CAPTURE
        .with(|c| std::mem::replace(&mut *c.borrow_mut(), prev))
        .unwrap_or_default();
    (out, got)
}

fn capturing() -> bool {
    CAPTURE.with(|c| c.borrow().is_some())
}

fn note_captured(c: impl FnOnce() -> Captured) {
    CAPTURE.with(|v| {
        if let Some(v) = v.borrow_mut().as_mut() {
            v.push(c())
        }
    });
}

/// Whether [`record_kernels`] is recording on this thread (a replayed launch
/// then notes its kernel, as a launch through [`launch`] does).
pub fn recording_kernels() -> bool {
    RECORDING.with(|r| r.borrow().is_some())
}

/// Runs `f` and returns it with the kernels it launched on this thread, as
/// specialised for launch (rank after collapsing, inner-stride pattern) — what
/// snapshot tests and `explain`-style tools look at.
pub fn record_kernels<R>(f: impl FnOnce() -> R) -> (R, Vec<Kernel>) {
    let prev = RECORDING.with(|r| r.borrow_mut().replace(vec![]));
    let out = f();
    let got = RECORDING
        .with(|r| std::mem::replace(&mut *r.borrow_mut(), prev))
        .unwrap_or_default();
    (out, got)
}

/// Adds `k` (as specialised for launch) to this thread's [`record_kernels`].
pub fn note_launched(k: &Kernel) {
    RECORDING.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(k.clone())
        }
    });
}

/// Whether `KILN_LOG` (comma-separated stages, as `TORCH_LOGS`) names `what`.
pub fn log_enabled(what: &str) -> bool {
    static LOG: OnceLock<String> = OnceLock::new();
    LOG.get_or_init(|| std::env::var("KILN_LOG").unwrap_or_default())
        .split(',')
        .any(|w| w.trim() == what)
}

/// Counters of the kernel cache since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Machine-code lookups that found the kernel (each hashes a whole KernelIR).
    pub hits: usize,
    pub compiles: usize,
    /// Kernels specialised for a launch (a KernelIR cloned and its rank and
    /// stride pattern set): every launch through [`launch`], none replayed
    /// by [`run_launch`].
    pub specialised: usize,
}

pub fn cache_stats() -> CacheStats {
    CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        compiles: COMPILES.load(Ordering::Relaxed),
        specialised: SPECIALISED.load(Ordering::Relaxed),
    }
}

/// Looks `k` up by signature (dtypes, rank, inner-stride pattern, body), compiling on a miss.
pub fn compiled(k: &Kernel) -> Result<Arc<Executable>> {
    let cache = CACHE.get_or_init(|| {
        let backend = match std::env::var("KILN_BACKEND").as_deref() {
            Ok("interp") => Backend::Interp,
            _ => Backend::Jit,
        };
        Mutex::new(Cache {
            backend,
            kernels: HashMap::new(),
            generations: Default::default(),
            next_generation: 0,
        })
    });
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((f, _)) = c.kernels.get(k) {
        HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(f.clone());
    }
    let _p = profiler::scope_with(Category::Compile, || format!("codegen {}", k.name));
    let (f, id) = match c.backend {
        Backend::Jit => {
            let g = c.current()?;
            let code = {
                let mut jit = g.owner.jit.lock().unwrap_or_else(|e| e.into_inner());
                jit.as_mut().expect("a live generation").compile(k)?
            };
            g.bytes += code.code_size;
            let id = g.id;
            (Arc::new(Executable::Native(code, g.owner.clone())), id)
        }
        Backend::Interp => (Arc::new(Executable::Interpreted(k.clone())), 0),
    };
    COMPILES.fetch_add(1, Ordering::Relaxed);
    if log_enabled("kernels") {
        eprint!("[kiln kernels] {}", k.to_text());
    }
    if log_enabled("code") {
        if let Ok(clif) = kiln_codegen::cpu::CpuJit::clif_text(k) {
            eprint!("[kiln code] {}\n{clif}", k.name);
        }
    }
    c.kernels.insert(k.clone(), (f.clone(), id));
    c.evict();
    Ok(f)
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
        rayon::scope(|s| {
            for c in 0..chunks {
                let (a, b) = (n0 * c / chunks, n0 * (c + 1) / chunks);
                let run = &run;
                s.spawn(move |_| run(a, b));
            }
        });
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
