//! A process-wide profiler in the spirit of `torch.profiler.profile`.
//!
//! ```
//! use kiln_runtime::profiler::{self, Category};
//! let ((), prof) = profiler::profile(|| {
//!     let _s = profiler::scope("my_step", Category::User);
//!     // ... eager ops: kernels, externs, compiles and backward nodes record themselves
//! });
//! print!("{}", prof.table(false));
//! # let dir = std::env::temp_dir().join(format!("kiln-prof-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! prof.export_chrome_trace(dir.join("trace.json")).unwrap();
//! ```
//!
//! Recording is switched by one [`AtomicBool`]: when no session runs, an
//! instrumented call site costs one relaxed load and a branch (see
//! `benches/profiler_overhead.rs`). While a session runs, every [`scope`]
//! guard records an [`Event`] (name, [`Category`], start, duration, thread,
//! input shapes, bytes) into a buffer owned by its thread. Events nest by time
//! on each thread: a guard opened while another is alive on the same thread is
//! its child (compile stages inside the kernel launch inside the op that
//! triggered them), which the table uses for self time and the Chrome trace
//! shows as stacked slices.
//!
//! Only one session runs at a time: [`Profiler::start`] waits for a session on
//! another thread to end (so tests can profile concurrently) and panics if the
//! calling thread already runs one.

mod report;

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

pub use report::{KeyAverage, Profile};

/// What an event measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// A user-visible op (`softmax`, `cross_entropy`, `conv2d`): its kernels and
    /// extern calls are children.
    Op,
    /// One generated kernel launch (named after what it computes: `add`,
    /// `fused[sub+exp]`, `amax`), including the threads it was split over.
    Kernel,
    /// An extern kernel call (GEMM, convolution, pooling, embedding).
    Extern,
    /// A compile stage (`codegen <kernel>` on a kernel-cache miss; `trace`
    /// and `rewrite` once `compile()` exists).
    Compile,
    /// An autograd backward node (`MulBackward`, `ConvolutionBackward`).
    Backward,
    /// A data copy or conversion outside generated kernels (host-to-device
    /// copies once devices exist).
    Memcpy,
    /// A region marked by the user with [`record_function`].
    User,
    /// A collective of `kiln::distributed` (`all_reduce`, `broadcast`, ...),
    /// recorded on the communication thread (its own track in the trace)
    /// with the bytes it sends.
    Comm,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Op => "op",
            Category::Kernel => "kernel",
            Category::Extern => "extern",
            Category::Compile => "compile",
            Category::Backward => "backward",
            Category::Memcpy => "memcpy",
            Category::User => "user",
            Category::Comm => "comm",
        }
    }
}

/// One recorded interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Cow<'static, str>,
    pub category: Category,
    /// Nanoseconds since the session started.
    pub start_ns: u64,
    pub dur_ns: u64,
    /// The profiler's id of the recording thread (see [`current_thread_id`]).
    pub tid: u64,
    /// Nesting depth on its thread (0 = outermost).
    pub depth: u32,
    /// Order in which events were opened on this thread (for nesting).
    pub seq: u64,
    /// Input shapes (for kernels: each operand's dims with broadcast dims as 1,
    /// operand 0 being the output).
    pub shapes: Vec<Vec<usize>>,
    /// Bytes read and written, when known (0 otherwise).
    pub bytes: u64,
}

impl Event {
    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.dur_ns
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Incremented by every session start, so a guard opened in an earlier
/// session never records into a later one.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
/// The session's time origin.
static ORIGIN: Mutex<Option<Instant>> = Mutex::new(None);
static SESSION: Mutex<()> = Mutex::new(());

type Buffer = Arc<Mutex<Vec<Event>>>;

struct ThreadEntry {
    tid: u64,
    name: String,
    events: Buffer,
}

fn registry() -> &'static Mutex<Vec<ThreadEntry>> {
    static R: OnceLock<Mutex<Vec<ThreadEntry>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(vec![]))
}

struct ThreadState {
    tid: u64,
    depth: Cell<u32>,
    seq: Cell<u64>,
    /// (generation, origin) cached per thread to avoid the ORIGIN lock per event.
    origin: Cell<Option<(u64, Instant)>>,
    buffer: RefCell<Option<Buffer>>,
}

thread_local! {
    static THREAD: ThreadState = ThreadState {
        tid: NEXT_TID.fetch_add(1, Ordering::Relaxed),
        depth: Cell::new(0),
        seq: Cell::new(0),
        origin: Cell::new(None),
        buffer: RefCell::new(None),
    };
    static IN_SESSION: Cell<bool> = const { Cell::new(false) };
}

/// Whether a session is recording (one relaxed load).
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The profiler's small integer id of the calling thread (the `tid` of its events).
pub fn current_thread_id() -> u64 {
    THREAD.with(|t| t.tid)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An open interval; records its [`Event`] when dropped. Inert (and free)
/// when the profiler was off at creation.
#[must_use = "a scope measures until it is dropped; bind it: `let _s = scope(..)`"]
pub struct Scope {
    open: Option<Box<Open>>,
    /// Guards nest per thread: not `Send`.
    _not_send: PhantomData<*const ()>,
}

struct Open {
    name: Cow<'static, str>,
    category: Category,
    generation: u64,
    start: Instant,
    depth: u32,
    seq: u64,
    shapes: Vec<Vec<usize>>,
    bytes: u64,
}

/// Opens a scope named `name` (see [`Scope`]); a no-op when not profiling.
#[inline(always)]
pub fn scope(name: &'static str, category: Category) -> Scope {
    if !enabled() {
        return Scope::inert();
    }
    Scope::open(Cow::Borrowed(name), category)
}

/// Like [`scope`] with a computed name; `name` runs only when profiling.
#[inline(always)]
pub fn scope_with<N: Into<Cow<'static, str>>>(
    category: Category,
    name: impl FnOnce() -> N,
) -> Scope {
    if !enabled() {
        return Scope::inert();
    }
    Scope::open(name().into(), category)
}

/// `torch.profiler.record_function`: marks a region of user code.
#[inline(always)]
pub fn record_function(name: &'static str) -> Scope {
    scope(name, Category::User)
}

impl Scope {
    #[inline(always)]
    fn inert() -> Scope {
        Scope {
            open: None,
            _not_send: PhantomData,
        }
    }

    #[cold]
    fn open(name: Cow<'static, str>, category: Category) -> Scope {
        let generation = GENERATION.load(Ordering::Acquire);
        let (depth, seq) = THREAD.with(|t| {
            let d = t.depth.get();
            t.depth.set(d + 1);
            let s = t.seq.get();
            t.seq.set(s + 1);
            (d, s)
        });
        Scope {
            open: Some(Box::new(Open {
                name,
                category,
                generation,
                start: Instant::now(),
                depth,
                seq,
                shapes: vec![],
                bytes: 0,
            })),
            _not_send: PhantomData,
        }
    }

    /// Whether this scope records (the profiler was on when it opened).
    #[inline(always)]
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    /// Attaches input shapes; `f` runs only when recording.
    #[inline(always)]
    pub fn shapes(mut self, f: impl FnOnce() -> Vec<Vec<usize>>) -> Scope {
        if let Some(o) = self.open.as_mut() {
            o.shapes = f();
        }
        self
    }

    /// Attaches a byte count; `f` runs only when recording.
    #[inline(always)]
    pub fn bytes(mut self, f: impl FnOnce() -> u64) -> Scope {
        if let Some(o) = self.open.as_mut() {
            o.bytes = f();
        }
        self
    }
}

impl Drop for Scope {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(o) = self.open.take() {
            close(o);
        }
    }
}

#[cold]
fn close(o: Box<Open>) {
    let end = Instant::now();
    let _ = THREAD.try_with(|t| {
        t.depth.set(t.depth.get().saturating_sub(1));
        if !enabled() || GENERATION.load(Ordering::Acquire) != o.generation {
            return;
        }
        let origin = match t.origin.get() {
            Some((g, i)) if g == o.generation => i,
            _ => match *lock(&ORIGIN) {
                Some(i) => {
                    t.origin.set(Some((o.generation, i)));
                    i
                }
                None => return,
            },
        };
        let o = *o;
        let ev = Event {
            name: o.name,
            category: o.category,
            start_ns: o.start.saturating_duration_since(origin).as_nanos() as u64,
            dur_ns: end.saturating_duration_since(o.start).as_nanos() as u64,
            tid: t.tid,
            depth: o.depth,
            seq: o.seq,
            shapes: o.shapes,
            bytes: o.bytes,
        };
        let mut b = t.buffer.borrow_mut();
        let buf = b.get_or_insert_with(|| {
            let buf: Buffer = Arc::new(Mutex::new(vec![]));
            let name = std::thread::current()
                .name()
                .map(str::to_string)
                .unwrap_or_else(|| format!("thread {}", t.tid));
            lock(registry()).push(ThreadEntry {
                tid: t.tid,
                name,
                events: buf.clone(),
            });
            buf
        });
        lock(buf).push(ev);
    });
}

/// A running profiling session (`with torch.profiler.profile() as prof:`).
/// [`Profiler::stop`] ends it and returns what was recorded; dropping it
/// without `stop` discards the events.
pub struct Profiler {
    started: Instant,
    _session: MutexGuard<'static, ()>,
}

impl Profiler {
    /// Starts recording on every thread of the process.
    ///
    /// # Panics
    /// When the calling thread already runs a session (sessions do not nest).
    pub fn start() -> Profiler {
        if IN_SESSION.with(|s| s.replace(true)) {
            panic!("profiler: a profiling session is already running on this thread");
        }
        let session = lock(&SESSION);
        // events of an earlier session left in thread buffers are dropped
        for e in lock(registry()).iter() {
            lock(&e.events).clear();
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        *lock(&ORIGIN) = Some(started);
        ENABLED.store(true, Ordering::Release);
        Profiler {
            started,
            _session: session,
        }
    }

    /// Stops recording and collects every thread's events.
    pub fn stop(self) -> Profile {
        let wall_ns = self.started.elapsed().as_nanos() as u64;
        ENABLED.store(false, Ordering::Release);
        let mut events = vec![];
        let mut threads = vec![];
        let mut reg = lock(registry());
        for e in reg.iter() {
            let mut evs = std::mem::take(&mut *lock(&e.events));
            if !evs.is_empty() {
                threads.push((e.tid, e.name.clone()));
                events.append(&mut evs);
            }
        }
        // forget threads that have exited (only the registry holds their buffer)
        reg.retain(|e| Arc::strong_count(&e.events) > 1);
        drop(reg);
        events.sort_by_key(|e| (e.tid, e.seq));
        threads.sort();
        Profile::new(events, threads, wall_ns)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Release);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        *lock(&ORIGIN) = None;
        IN_SESSION.with(|s| s.set(false));
    }
}

/// `with torch.profiler.profile() as prof: f()`: runs `f` with the profiler on
/// and returns its result with the recorded [`Profile`].
pub fn profile<R>(f: impl FnOnce() -> R) -> (R, Profile) {
    let p = Profiler::start();
    let r = f();
    (r, p.stop())
}

#[cfg(test)]
mod tests;
