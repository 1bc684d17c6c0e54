//! Fork-join in which the calling thread takes part, as an OpenMP team's
//! master does.
//!
//! A rayon parallel region entered from a thread outside the pool (the
//! user's main thread) hands the whole region to the pool and puts the caller
//! to sleep until a worker has woken, run it and woken the caller back: two
//! futex round trips per region, each several microseconds on a VM. A small
//! CNN's training step runs about a hundred such regions of tens of
//! microseconds each (W5: 20% of its time went to the wake-ups). Here the
//! caller starts on its contiguous share of the chunks at once while
//! `threads - 1` helpers, queued on the rayon pool, take theirs, and each
//! then takes what is left of the others'; a helper that wakes after the
//! caller took every chunk finds none and returns. The chunk boundaries are
//! the caller's, so which thread runs a chunk never changes a result. Long
//! regions still go to the pool whole ([`pooled`]).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let sum = AtomicUsize::new(0);
//! kiln_runtime::par::for_each_chunk(10, || (), |_, i| {
//!     sum.fetch_add(i, Ordering::Relaxed);
//! });
//! assert_eq!(sum.into_inner(), 45);
//! ```

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};

/// Spins of the caller waiting for helpers' last chunks before it parks.
const SPINS: usize = 1 << 12;

/// One participant's share of the chunks, `next..end`, which others may
/// take from once theirs is done; a cache line of its own.
#[repr(align(128))]
struct Share {
    next: AtomicUsize,
    end: usize,
}

/// What the caller and its helpers share. `task` is only dereferenced for a
/// claimed chunk index below `n`; the caller returns only after all `n`
/// chunks are done, so the borrow it erases outlives every use.
struct Team {
    /// Participant p starts on `shares[p]`: contiguous chunks, as rayon's
    /// splitting gives them, so neighbouring chunks' data stays in one core's cache.
    shares: Vec<Share>,
    done: AtomicUsize,
    joined: AtomicUsize,
    n: usize,
    /// `task(participant, chunk)`: participant 0 is the caller.
    task: *const (dyn Fn(usize, usize) + Sync),
    caller: Thread,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `task` points to a `Sync` closure that outlives every dereference
// (see `Team`); the other fields are Send + Sync.
unsafe impl Send for Team {}
unsafe impl Sync for Team {}

impl Team {
    /// Runs chunks as `participant`: its own share first, then what is left
    /// of the others'.
    fn work(&self, participant: usize) {
        let team = self.shares.len();
        for q in (0..team).map(|k| (participant + k) % team) {
            let share = &self.shares[q];
            loop {
                let i = share.next.fetch_add(1, Ordering::Relaxed);
                if i >= share.end {
                    break;
                }
                self.run_chunk(participant, i);
            }
        }
    }

    fn run_chunk(&self, participant: usize, i: usize) {
        // SAFETY: chunk i < n is not done yet, so the caller is still waiting.
        let task = unsafe { &*self.task };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(participant, i))) {
            self.panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(p);
        }
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.caller.unpark();
        }
    }
}

/// Runs `f(state, i)` for every chunk `i` in `0..n`, in parallel on the
/// calling thread and the rayon pool's threads, and returns the states: each
/// participating thread makes its own `state` with `init` on its first chunk
/// (scratch buffers, partial sums). A panic in any chunk is resumed on the
/// caller after every chunk has finished.
pub fn for_each_chunk<S: Send>(
    n: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) -> Vec<S> {
    let threads = rayon::current_num_threads();
    if n <= 1 || threads < 2 {
        let mut s = init();
        (0..n).for_each(|i| f(&mut s, i));
        return vec![s];
    }
    if rayon::current_thread_index().is_some() || POOLED.with(Cell::get) {
        // inside the pool already (rayon's own work stealing is cheap
        // there), or a long region (see `pooled`)
        use rayon::prelude::*;
        let out = (0..n)
            .into_par_iter()
            .fold(&init, |mut s, i| {
                f(&mut s, i);
                s
            })
            .collect();
        keep_awake(threads);
        return out;
    }
    let team = threads.min(n);
    // participant p alone touches states[p], so its lock is never contended
    let states: Vec<Mutex<Option<S>>> = (0..team).map(|_| Mutex::new(None)).collect();
    let task = |p: usize, i: usize| {
        let mut s = states[p].lock().unwrap_or_else(|e| e.into_inner());
        f(s.get_or_insert_with(&init), i);
    };
    run(n, team, &task);
    keep_awake(threads);
    states
        .into_iter()
        .filter_map(|s| s.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}

/// Pool workers spinning after a region (see [`keep_awake`]).
static KEEPERS: AtomicUsize = AtomicUsize::new(0);

/// How long a pool worker spins for new work after a region, in
/// microseconds: `$KILN_SPIN_US`, default 300 (0: not at all). OpenMP's
/// `KMP_BLOCKTIME`/`GOMP_SPINCOUNT` are the same knob.
fn spin_us() -> u64 {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *US.get_or_init(|| {
        std::env::var("KILN_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300)
    })
}

/// After a region entered from outside the pool, keeps up to `threads - 1`
/// pool workers awake for [`spin_us`], running whatever rayon work appears
/// (the next region's helpers, a pooled region, the `gemm` crate's jobs).
///
/// A worker that went to sleep between two regions is woken by a futex, and
/// on a VM an idle vCPU's wake-up took long enough that a region of a few
/// hundred microseconds ran on one thread: MobileNetV3's `[8, 96, 7, 7] *
/// [576, 96, 1, 1]` conv took 0.62 ms in the model with 2 threads, 0.58 with
/// 1, and 0.32 with a worker kept awake (Zen 5, 2 vCPUs). Between its polls
/// a keeper pauses (64 spin-loop hints), so it does not contend for the
/// pool's queues while the others work.
fn keep_awake(threads: usize) {
    let us = spin_us();
    if us == 0 || rayon::current_thread_index().is_some() {
        return;
    }
    let want = threads - 1;
    let claim = |k: usize| (k < want).then_some(k + 1);
    if KEEPERS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, claim)
        .is_err()
    {
        return;
    }
    rayon::spawn(move || {
        let limit = std::time::Duration::from_micros(us);
        let mut since = std::time::Instant::now();
        while since.elapsed() < limit {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => since = std::time::Instant::now(),
                _ => (0..64).for_each(|_| std::hint::spin_loop()),
            }
        }
        KEEPERS.fetch_sub(1, Ordering::AcqRel);
    });
}

thread_local! {
    static POOLED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, when `on`, with its parallel regions handed whole to the rayon pool, the
/// caller waiting, instead of the caller taking part: for regions of a
/// millisecond or more (a ResNet-18 conv layer), where one handoff is
/// cheap. There the caller taking part measured 5-8% slower on ResNet-18
/// and MobileNetV3 (2 threads, Zen 5), with three times the context
/// switches: a third thread (an idle pool worker woken by the helper's job)
/// competes for the two cores.
pub fn pooled<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            POOLED.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(POOLED.with(|p| p.replace(on || p.get())));
    f()
}

/// [`for_each_chunk`]'s `Result` form: the error of the lowest failing
/// chunk, after every chunk has run.
pub fn try_for_each_chunk<S: Send, E: Send>(
    n: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) -> Result<(), E> + Sync,
) -> Result<Vec<S>, E> {
    let first: Mutex<Option<(usize, E)>> = Mutex::new(None);
    let states = for_each_chunk(n, init, |s, i| {
        if let Err(e) = f(s, i) {
            let mut g = first.lock().unwrap_or_else(|e| e.into_inner());
            if g.as_ref().is_none_or(|(j, _)| i < *j) {
                *g = Some((i, e));
            }
        }
    });
    match first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(states),
    }
}

/// `f(i)` for every `i` in `0..n`, in parallel, in index order.
pub fn map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    for_each_chunk(
        n,
        || (),
        |_, i| {
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(f(i));
        },
    );
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every chunk ran")
        })
        .collect()
}

/// A pointer the participants share to write disjoint pieces of one slice.
struct Base<T>(*mut T);
// SAFETY: each piece is handed to one chunk alone (see `for_each_piece`).
unsafe impl<T: Send> Send for Base<T> {}
unsafe impl<T: Send> Sync for Base<T> {}

impl<T> Base<T> {
    /// Piece `r` of the slice.
    ///
    /// # Safety
    /// `r` lies inside the slice and no other live reference overlaps it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn piece(&self, r: std::ops::Range<usize>) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(r.start), r.len())
    }
}

/// `f(state, i, piece)` for each `len`-element piece `i` of `data` (the last
/// may be shorter), in parallel as [`for_each_chunk`]: `par_chunks_mut`.
pub fn for_each_piece<T: Send, S: Send>(
    data: &mut [T],
    len: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, &mut [T]) + Sync,
) -> Vec<S> {
    let (total, len) = (data.len(), len.max(1));
    let base = Base(data.as_mut_ptr());
    for_each_chunk(total.div_ceil(len), init, |s, i| {
        // SAFETY: piece i lies inside `data` and chunk i alone touches it.
        f(s, i, unsafe { base.piece(range_of(i, len, total)) })
    })
}

/// [`for_each_piece`]'s `Result` form (the error of the lowest failing piece).
pub fn try_for_each_piece<T: Send, S: Send, E: Send>(
    data: &mut [T],
    len: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, &mut [T]) -> Result<(), E> + Sync,
) -> Result<Vec<S>, E> {
    let (total, len) = (data.len(), len.max(1));
    let base = Base(data.as_mut_ptr());
    try_for_each_chunk(total.div_ceil(len), init, |s, i| {
        // SAFETY: as in `for_each_piece`.
        f(s, i, unsafe { base.piece(range_of(i, len, total)) })
    })
}

fn range_of(i: usize, len: usize, total: usize) -> std::ops::Range<usize> {
    i * len..((i + 1) * len).min(total)
}

/// `0..n` cut into about `4 x threads` equal ranges (at most `n`): chunk `c`
/// of `chunks` is `n * c / chunks .. n * (c + 1) / chunks`.
pub fn chunks(n: usize) -> usize {
    n.min(4 * rayon::current_num_threads())
}

/// Range `c` of `chunks` equal ranges of `0..n`.
pub fn range(n: usize, chunks: usize, c: usize) -> std::ops::Range<usize> {
    n * c / chunks..n * (c + 1) / chunks
}

/// The team run of `task` over `0..n` by `team` participants (see the module doc).
fn run(n: usize, team: usize, task: &(dyn Fn(usize, usize) + Sync)) {
    // SAFETY: erases the borrow's lifetime; `Team` says why that is sound.
    let task: *const (dyn Fn(usize, usize) + Sync + 'static) = unsafe { std::mem::transmute(task) };
    let shared = Arc::new(Team {
        shares: (0..team)
            .map(|p| {
                let r = range(n, team, p);
                Share {
                    next: AtomicUsize::new(r.start),
                    end: r.end,
                }
            })
            .collect(),
        done: AtomicUsize::new(0),
        joined: AtomicUsize::new(1),
        n,
        task,
        caller: thread::current(),
        panic: Mutex::new(None),
    });
    for _ in 1..team {
        let t = Arc::clone(&shared);
        rayon::spawn(move || {
            let p = t.joined.fetch_add(1, Ordering::Relaxed);
            t.work(p)
        });
    }
    shared.work(0);
    let mut spins = 0;
    while shared.done.load(Ordering::Acquire) < n {
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            thread::park();
        }
    }
    let panic = shared
        .panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Keepers are at most `threads - 1` and retire once no work comes.
    #[test]
    fn keepers_are_bounded_and_retire() {
        for _ in 0..20 {
            for_each_chunk(8, || (), |_, _| {});
            assert!(KEEPERS.load(Ordering::Acquire) < rayon::current_num_threads().max(2));
        }
        let t = std::time::Instant::now();
        while KEEPERS.load(Ordering::Acquire) > 0 {
            assert!(t.elapsed().as_secs() < 30, "keepers never retired");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn every_chunk_runs_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            for_each_chunk(
                n,
                || (),
                |_, i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                },
            );
            assert_eq!(map(n, |i| 2 * i), (0..n).map(|i| 2 * i).collect::<Vec<_>>());
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
    }

    #[test]
    fn each_thread_makes_its_state_once() {
        let made = AtomicUsize::new(0);
        let sum = AtomicUsize::new(0);
        let counts = for_each_chunk(
            64,
            || {
                made.fetch_add(1, Ordering::Relaxed);
                0usize
            },
            |count, i| {
                *count += 1;
                sum.fetch_add(i, Ordering::Relaxed);
            },
        );
        assert_eq!(sum.into_inner(), 64 * 63 / 2);
        assert_eq!(counts.iter().sum::<usize>(), 64);
        assert_eq!(made.into_inner(), counts.len());
    }

    #[test]
    fn a_panicking_chunk_reaches_the_caller_after_the_rest() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            for_each_chunk(
                50,
                || (),
                |_, i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert!(i != 7, "chunk seven");
                },
            )
        }));
        assert!(r.is_err());
        assert_eq!(ran.into_inner(), 50);
    }

    #[test]
    fn the_lowest_failing_chunk_is_the_error() {
        let r = try_for_each_chunk(40, || (), |_, i| if i % 10 == 3 { Err(i) } else { Ok(()) });
        assert_eq!(r.err(), Some(3));
    }

    #[test]
    fn pieces_are_the_chunks_of_the_slice() {
        let mut v: Vec<usize> = vec![0; 103];
        for_each_piece(
            &mut v,
            10,
            || (),
            |_, i, piece| {
                assert_eq!(piece.len(), if i == 10 { 3 } else { 10 });
                piece.iter_mut().for_each(|x| *x = i);
            },
        );
        assert_eq!(v, (0..103).map(|k| k / 10).collect::<Vec<_>>());
    }

    #[test]
    fn pooled_regions_run_every_chunk_and_restore_the_mode() {
        let hits = AtomicUsize::new(0);
        pooled(true, || {
            for_each_chunk(
                33,
                || (),
                |_, _| {
                    hits.fetch_add(1, Ordering::Relaxed);
                },
            );
            assert!(POOLED.with(Cell::get));
        });
        assert_eq!(hits.into_inner(), 33);
        assert!(!POOLED.with(Cell::get));
    }

    #[test]
    fn ranges_cover_every_index_once() {
        for n in [1, 5, 64, 1001] {
            let c = chunks(n);
            let all: Vec<usize> = (0..c).flat_map(|k| range(n, c, k)).collect();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
    }
}
