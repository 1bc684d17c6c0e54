//! The kernel cache: machine code by kernel signature, compiled into JIT
//! generations that are retired once the code they hold passes a bound.

use super::*;
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
            Executable::Native(f, _) => f.call(ptrs, strides, sizes, scalars, start, end),
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
pub(super) static SPECIALISED: AtomicUsize = AtomicUsize::new(0);

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
