//! Which algorithm computes a conv, chosen per shape and remembered: the
//! analogue of `torch.backends.cudnn.benchmark`. With benchmarking on
//! ([`set_benchmark`], or by default inside a compiled graph's run, see
//! [`compiled_scope`]), the first call of a shape times every candidate on
//! the real operands and keeps the fastest, in memory and in
//! `<kiln cache dir>/conv-algorithms.txt` keyed by shape, dtype, thread count
//! and ISA; later calls, in this process or the next, look it up. With it
//! off, a fixed heuristic picks (the same choice every run).
//!
//! ```
//! use kiln_runtime::externs::conv::select::{benchmark_enabled, set_benchmark};
//! set_benchmark(true);
//! assert!(benchmark_enabled());
//! ```

use crate::externs::cpu_isa;
use kiln_ir::op::conv::ConvGeometry;
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A way to compute `conv2d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvAlgo {
    /// Patches of the input copied into a column matrix, then one GEMM per tile.
    Im2colGemm,
    /// im2col + one GEMM over a chunk of samples (small images).
    Im2colBatched,
    /// im2col of a chunk of whole samples + one multi-threaded GEMM (deep
    /// layers, where the weights are the big operand).
    Im2colWide,
    /// A 1x1 stride-1 unpadded conv: one GEMM straight on the input.
    Gemm1x1,
    /// One input channel per group (depthwise, or a single-channel input):
    /// a direct loop, no GEMM.
    Depthwise,
    /// Depthwise with sixteen channels in the vector lanes (small planes;
    /// `depthwise_channels.rs`).
    DepthwiseChannels,
    /// Winograd F(2x2, 3x3) on transformed weights (3x3 stride 1 only).
    WinogradF2x2,
    /// Register tiles straight off a padded, phase-split copy of the input,
    /// on weights packed once (`direct.rs`): no column matrix.
    Direct,
    /// Sixteen output channels in the vector lanes, for a short reduction
    /// (a stem: `direct_channels.rs`).
    DirectChannels,
}

impl ConvAlgo {
    pub const ALL: [ConvAlgo; 9] = [
        ConvAlgo::Im2colGemm,
        ConvAlgo::Im2colBatched,
        ConvAlgo::Im2colWide,
        ConvAlgo::Gemm1x1,
        ConvAlgo::Depthwise,
        ConvAlgo::DepthwiseChannels,
        ConvAlgo::WinogradF2x2,
        ConvAlgo::Direct,
        ConvAlgo::DirectChannels,
    ];

    /// The name `explain()` prints and the disk cache stores.
    pub fn name(self) -> &'static str {
        match self {
            ConvAlgo::Im2colGemm => "im2col-gemm",
            ConvAlgo::Im2colBatched => "im2col-gemm-batched",
            ConvAlgo::Im2colWide => "im2col-gemm-wide",
            ConvAlgo::Gemm1x1 => "gemm-1x1",
            ConvAlgo::Depthwise => "depthwise-direct",
            ConvAlgo::DepthwiseChannels => "depthwise-channels",
            ConvAlgo::WinogradF2x2 => "winograd-f2x2-3x3",
            ConvAlgo::Direct => "direct-packed",
            ConvAlgo::DirectChannels => "direct-channels",
        }
    }

    /// The algorithm called `name`, if any.
    pub fn parse(name: &str) -> Option<ConvAlgo> {
        ConvAlgo::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether this algorithm computes `g`.
    pub fn applies(self, g: &ConvGeometry) -> bool {
        match self {
            ConvAlgo::Im2colGemm => true,
            ConvAlgo::Im2colBatched => super::batched::applies(g),
            ConvAlgo::Im2colWide => !is_1x1(g),
            ConvAlgo::Gemm1x1 => is_1x1(g),
            ConvAlgo::Depthwise => g.c_in_per_group() == 1,
            ConvAlgo::DepthwiseChannels => super::depthwise_channels::applies(g),
            ConvAlgo::WinogradF2x2 => super::winograd::applies(g),
            ConvAlgo::Direct => super::direct::applies(g),
            ConvAlgo::DirectChannels => super::direct_channels::applies(g),
        }
    }
}

fn is_1x1(g: &ConvGeometry) -> bool {
    g.kernel == [1, 1] && g.stride == [1, 1] && g.pad_begin == [0, 0] && g.pad_end == [0, 0]
}

/// The algorithms worth timing for `g`, the heuristic's choice first.
pub fn candidates(g: &ConvGeometry) -> Vec<ConvAlgo> {
    let first = heuristic(g);
    let mut c = vec![first];
    for a in [
        ConvAlgo::Direct,
        ConvAlgo::DirectChannels,
        ConvAlgo::WinogradF2x2,
        ConvAlgo::Im2colBatched,
        ConvAlgo::Im2colWide,
        ConvAlgo::Depthwise,
        ConvAlgo::DepthwiseChannels,
        ConvAlgo::Im2colGemm,
    ] {
        // a 1x1 conv's input is its column matrix: only the direct kernel
        // could beat the plain GEMM there
        let worth = first != ConvAlgo::Gemm1x1 || a == ConvAlgo::Direct;
        if a != first && a.applies(g) && worth {
            c.push(a);
        }
    }
    c
}

/// The choice without timing: depthwise for one channel per group, a plain
/// GEMM for 1x1, im2col otherwise (what every conv ran before selection).
pub fn heuristic(g: &ConvGeometry) -> ConvAlgo {
    if ConvAlgo::Depthwise.applies(g) && g.groups > 1 {
        ConvAlgo::Depthwise
    } else if is_1x1(g) {
        ConvAlgo::Gemm1x1
    } else {
        ConvAlgo::Im2colGemm
    }
}

/// 0: default (on only inside [`compiled_scope`]), 1: on, 2: off.
static BENCHMARK: AtomicU8 = AtomicU8::new(0);

thread_local! {
    static COMPILED_DEPTH: Cell<usize> = const { Cell::new(0) };
    static FORCED: Cell<Option<ConvAlgo>> = const { Cell::new(None) };
    static LAST_RUN: Cell<Option<ConvAlgo>> = const { Cell::new(None) };
}

/// The algorithm of the last conv computed on this thread (`None` before
/// the first); taking it resets it.
pub fn take_last_run() -> Option<ConvAlgo> {
    LAST_RUN.with(|c| c.take())
}

pub(super) fn note_run(algo: ConvAlgo) {
    LAST_RUN.with(|c| c.set(Some(algo)));
}

/// Turns timing of the candidates on a shape's first call on or off for
/// every conv (`kiln::backends::cpu::set_benchmark`). Without a call it is
/// on inside compiled graphs and off for eager ops.
pub fn set_benchmark(on: bool) {
    BENCHMARK.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether a conv called from here would time its candidates.
pub fn benchmark_enabled() -> bool {
    match BENCHMARK.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => COMPILED_DEPTH.with(|d| d.get() > 0),
    }
}

/// While alive, convs on this thread run as part of a compiled graph
/// (benchmarking on unless [`set_benchmark`] said otherwise).
pub struct CompiledScope(());

/// Marks the calling thread as running a compiled graph until the guard drops.
pub fn compiled_scope() -> CompiledScope {
    COMPILED_DEPTH.with(|d| d.set(d.get() + 1));
    CompiledScope(())
}

impl Drop for CompiledScope {
    fn drop(&mut self) {
        COMPILED_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `f` with every conv on this thread computed by `algo` where it
/// applies (tests compare the algorithms with this).
pub fn with_algorithm<R>(algo: ConvAlgo, f: impl FnOnce() -> R) -> R {
    let before = FORCED.with(|c| c.replace(Some(algo)));
    struct Restore(Option<ConvAlgo>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// The cache key of `g` in `dtype`: shape, dtype, threads and ISA.
pub fn key(g: &ConvGeometry, dtype: &str) -> String {
    format!(
        "conv2d n{} c{}->{} g{} in{}x{} k{}x{} s{}x{} d{}x{} p{}x{}/{}x{} {dtype} t{} {}",
        g.n,
        g.c_in,
        g.c_out,
        g.groups,
        g.in_size[0],
        g.in_size[1],
        g.kernel[0],
        g.kernel[1],
        g.stride[0],
        g.stride[1],
        g.dilation[0],
        g.dilation[1],
        g.pad_begin[0],
        g.pad_begin[1],
        g.pad_end[0],
        g.pad_end[1],
        rayon::current_num_threads(),
        cpu_isa::detect().name()
    )
}

/// The remembered choices: loaded from disk on first use.
static CHOICES: Mutex<Option<HashMap<String, ConvAlgo>>> = Mutex::new(None);

fn with_choices<R>(f: impl FnOnce(&mut HashMap<String, ConvAlgo>) -> R) -> R {
    let mut guard = CHOICES.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(|| disk::load(disk::path().as_deref()));
    f(map)
}

/// How the algorithm of a conv was (or would be) chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    /// Timed on this machine (this process or an earlier one).
    Timed(ConvAlgo),
    /// Benchmarking off: the fixed heuristic.
    Heuristic(ConvAlgo),
    /// Set by [`with_algorithm`].
    Forced(ConvAlgo),
}

impl Chosen {
    pub fn algo(self) -> ConvAlgo {
        match self {
            Chosen::Timed(a) | Chosen::Heuristic(a) | Chosen::Forced(a) => a,
        }
    }
}

/// What a conv of `g` in `dtype` runs, without timing anything: the
/// remembered choice where benchmarking found one, else the heuristic.
/// `explain()` prints this.
pub fn describe(g: &ConvGeometry, dtype: &str) -> Chosen {
    if let Some(a) = FORCED.with(|c| c.get()).filter(|a| a.applies(g)) {
        return Chosen::Forced(a);
    }
    let k = key(g, dtype);
    match with_choices(|m| m.get(&k).copied()).filter(|a| a.applies(g)) {
        Some(a) => Chosen::Timed(a),
        None => Chosen::Heuristic(heuristic(g)),
    }
}

/// Rounds of timing: every candidate runs in the first, those within
/// [`RETIME_WITHIN`] of the fastest in the second, and those within
/// [`TIE_WITHIN`] in the rest. With two rounds, ResNet-18's cache held a
/// different choice for 2-6 of its 11 conv shapes from one fresh process to
/// the next on a busy Xeon (model 207), and a cache with direct-packed for
/// its 14x14 and 7x7 3x3 convs ran the model at 119-124 ms against 97-99
/// with Winograd's; with two tie-break rounds more, 95-111 ms (median 96)
/// against 98-110 (103) in five fresh processes each, compile() to first
/// output 770-900 ms against 680-760. (A third round over every close
/// candidate had made it 1.15-1.28 s from 0.95-1.07 on a slower machine.)
const TIMING_ROUNDS: usize = 4;

/// The second round re-times only the candidates within this factor of the
/// fastest so far: the round is there to undo a burst of preemption between
/// close candidates, and a clear loser (im2col at 1.6-2.4x Winograd on
/// ResNet-18's 3x3 convs) re-run cost compile() ~0.1 s.
const RETIME_WITHIN: f64 = 1.5;

/// Later rounds re-time only candidates this close to the fastest: the
/// choices a burst of preemption can still turn.
const TIE_WITHIN: f64 = 1.2;

/// The algorithm for this call of `g`: forced, remembered, timed now or the
/// heuristic. Timing calls `trial(None)` once, untimed, then
/// `trial(Some(algo))` for each candidate as [`fastest`] says.
pub fn choose(g: &ConvGeometry, dtype: &str, trial: &mut dyn FnMut(Option<ConvAlgo>)) -> Chosen {
    if let Some(a) = FORCED.with(|c| c.get()).filter(|a| a.applies(g)) {
        return Chosen::Forced(a);
    }
    if !benchmark_enabled() {
        return Chosen::Heuristic(heuristic(g));
    }
    let k = key(g, dtype);
    if let Some(a) = with_choices(|m| m.get(&k).copied()).filter(|a| a.applies(g)) {
        return Chosen::Timed(a);
    }
    let cands = candidates(g);
    let best = if cands.len() == 1 {
        cands[0]
    } else {
        // the operands' first touch, untimed: whichever candidate ran first
        // paid the page faults of a fresh output and the cold caches (a 1x1
        // conv's GEMM, timed first, lost to direct-packed that ran 1.4-2.9x
        // slower on MobileNetV3-Large's expansions)
        trial(None);
        fastest(&cands, |a| {
            let t0 = Instant::now();
            trial(Some(a));
            t0.elapsed().as_secs_f64()
        })
    };
    remember(&k, best);
    Chosen::Timed(best)
}

/// The candidate with the fastest run, `time(a)` running `a` once and
/// returning its seconds. Every candidate runs in the first round; each
/// later round re-runs those within [`RETIME_WITHIN`] (the second) or
/// [`TIE_WITHIN`] (the rest) of the fastest so far, when there are two or
/// more of them (a lone leader re-timed changes nothing), and the first candidate when it is not the leader (it ran
/// cold). Rounds over all candidates, each candidate's fastest run
/// counting: on a shared machine a burst of preemption can span two runs in
/// a row, and a cache timed with each candidate's runs back to back held
/// im2col for a depthwise conv it ran about 2x slower than depthwise-direct.
pub fn fastest(cands: &[ConvAlgo], mut time: impl FnMut(ConvAlgo) -> f64) -> ConvAlgo {
    let mut secs = vec![f64::INFINITY; cands.len()];
    let leader = |secs: &[f64]| (0..cands.len()).min_by(|&i, &j| secs[i].total_cmp(&secs[j]));
    for round in 0..TIMING_ROUNDS {
        let within = if round < 2 { RETIME_WITHIN } else { TIE_WITHIN };
        let cut = within * secs.iter().copied().fold(f64::INFINITY, f64::min);
        let mut rerun: Vec<usize> = (0..cands.len())
            .filter(|&i| round == 0 || secs[i] <= cut)
            .collect();
        let ahead = leader(&secs);
        if round > 0 && rerun.len() < 2 {
            rerun.clear();
        }
        // the first candidate ran first: besides the operands' first touch it
        // paid its own code's (the GEMM's packing buffers on every thread), so
        // when it lost the first round it runs once more (a 1x1 conv's GEMM
        // lost half of its fresh-process timings to direct-packed, 2x slower)
        if round == 1 && ahead != Some(0) && !rerun.contains(&0) {
            rerun.push(0);
        }
        if rerun.is_empty() {
            break;
        }
        // the leader last: when it stays ahead, its run is the one that
        // left the output behind (see `conv2d_call`)
        rerun.sort_by_key(|&i| round > 0 && Some(i) == ahead);
        for i in rerun {
            secs[i] = secs[i].min(time(cands[i]));
        }
    }
    cands[leader(&secs).unwrap_or(0)]
}

/// Stores `algo` for `key` in memory and on disk (best effort).
pub fn remember(key: &str, algo: ConvAlgo) {
    let snapshot = with_choices(|m| {
        m.insert(key.to_string(), algo);
        m.clone()
    });
    if let Some(p) = disk::path() {
        disk::store(&p, &snapshot);
    }
}

/// Forgets every remembered choice in memory (the disk file is re-read on
/// next use), so a test can check the round trip through the file.
pub fn forget_in_memory() {
    *CHOICES.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The kiln cache directory: `$KILN_CACHE_DIR`, else `<tmp>/kiln-cache`;
/// `None` when `KILN_CACHE_DIR=off`.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("KILN_CACHE_DIR") {
        Ok(d) if d == "off" => None,
        Ok(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => Some(std::env::temp_dir().join("kiln-cache")),
    }
}

/// The on-disk form: a header line, then `key<TAB>algorithm` lines.
pub mod disk {
    use super::ConvAlgo;
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    /// v2: the direct kernel joined the candidates, so v1's choices (timed
    /// without it) are dropped silently and every shape is timed again.
    /// v3: the direct kernel got its AVX-512 tile, so v2's choices (timed
    /// at half its speed there) are dropped the same way.
    /// v4: the depthwise kernel moved to register accumulators (several
    /// times faster), so v3's choices of im2col for depthwise shapes go.
    /// v5: small planes are timed on at least 4096 output positions (two
    /// samples of a 7x7 plane had ranked im2col first), so v4's go too.
    /// v6: Winograd shares blocks across samples (7x7 planes went from
    /// slower than im2col to faster), so v5's choices go as well.
    /// v7: depthwise-channels and direct-channels are candidates (v6 never
    /// timed them: MobileNetV3's small depthwise planes and its stem).
    /// v8: timing starts with an untimed run (v7 timed the first candidate
    /// with the fresh output's page faults and kept direct-packed for 1x1
    /// convs 1.4-2.9x slower than their GEMM), and depthwise-channels got
    /// register blocks, so v7's choices go.
    /// v9: the first candidate runs again when it lost the first round (v8
    /// kept direct-packed for a 1x1 conv timed first in a process, 2x
    /// slower than its GEMM), and a 1x1 conv's GEMM takes whole planes
    /// (faster where its plane was two tiles), so v8's choices go. v10:
    /// close candidates get two tie-break runs more ([`TIMING_ROUNDS`]), so
    /// v9's choices, made on two runs each, go.
    pub const HEADER: &str = "kiln conv algorithms v10";
    const OLDER: [&str; 9] = [
        "kiln conv algorithms v1",
        "kiln conv algorithms v2",
        "kiln conv algorithms v3",
        "kiln conv algorithms v4",
        "kiln conv algorithms v5",
        "kiln conv algorithms v6",
        "kiln conv algorithms v7",
        "kiln conv algorithms v8",
        "kiln conv algorithms v9",
    ];

    /// `<cache dir>/conv-algorithms.txt`, or `None` when caching is off.
    pub fn path() -> Option<PathBuf> {
        Some(super::cache_dir()?.join("conv-algorithms.txt"))
    }

    /// The choices in `path`; a missing file is empty, a corrupt one is
    /// empty with a warning on stderr (every shape is timed again).
    pub fn load(path: Option<&Path>) -> HashMap<String, ConvAlgo> {
        let Some(path) = path else {
            return HashMap::new();
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return HashMap::new();
        };
        if OLDER.iter().any(|h| text.lines().next() == Some(*h)) {
            return HashMap::new();
        }
        match parse(&text) {
            Ok(m) => m,
            Err(why) => {
                eprintln!(
                    "kiln: warning: ignoring the conv algorithm cache {}: {why}; the algorithms will be timed again",
                    path.display()
                );
                HashMap::new()
            }
        }
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<HashMap<String, ConvAlgo>, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("the first line is not `{HEADER}`"));
        }
        let mut m = HashMap::new();
        for (i, line) in lines.enumerate() {
            let (k, a) = line
                .split_once('\t')
                .ok_or_else(|| format!("line {} has no tab", i + 2))?;
            let algo = ConvAlgo::parse(a)
                .ok_or_else(|| format!("line {}: unknown algorithm `{a}`", i + 2))?;
            m.insert(k.to_string(), algo);
        }
        Ok(m)
    }

    /// Writes `choices` to `path` atomically (temp file + rename); a cache
    /// that cannot be written is skipped.
    pub fn store(path: &Path, choices: &HashMap<String, ConvAlgo>) {
        let mut rows: Vec<_> = choices.iter().collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        let mut text = format!("{HEADER}\n");
        for (k, a) in rows {
            text.push_str(&format!("{k}\t{}\n", a.name()));
        }
        if let Some(d) = path.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        let tmp = path.with_extension(format!(
            "tmp{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}
