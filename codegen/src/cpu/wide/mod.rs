//! Wide-vector block helpers for the CPU JIT.
//!
//! Cranelift emits 128-bit vectors only, so a kernel whose time goes into a
//! transcendental (exp, erf, tanh: gelu, sigmoid, silu, softmax's exp) is
//! compute-bound at f32x4. These helpers are rustc code compiled for AVX2 +
//! FMA (8 lanes) and AVX-512F (16 lanes); [`detect`] picks one at run time
//! with `is_x86_feature_detected!`, and the JIT code of such a kernel calls
//! it on L1-sized tiles ([`TILE`] elements, see `cpu/tiles.rs`). Log-sum-exp
//! rows, Welford rows of a contiguous input and, on AVX-512, pointwise rows
//! use them by default ([`Uses::from_env`]); Welford rows of an expression
//! (and pointwise rows on AVX2) only with `KILN_WIDE=1` (or
//! `CpuJit::set_wide(true)`). Without either ISA, or with `KILN_WIDE=0`,
//! kernels keep their f32x4 Cranelift code.
//!
//! Results are the Cranelift code's bits: `math.rs` is `cpu/math.rs`
//! operation for operation, and compound ops (gelu, sigmoid, ...) run the
//! shared [`kiln_ir::scalar::lower_unary`] on tiles, or its primitives in
//! registers in the same order (`tile.rs`).
//!
//! ```
//! use kiln_codegen::cpu::wide;
//! let mut xs = vec![0.5f32; 300];
//! wide::apply(wide::detect(), kiln_ir::UnaryOp::Exp, &mut xs).unwrap();
//! assert!((xs[0] - 0.5f32.exp()).abs() < 1e-6);
//! ```

mod affine;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod caches;
mod chain;
mod isa;
mod lanes;
mod math;
mod prefetch;
mod reduce;
#[cfg(test)]
mod tests;
mod tile;

pub use caches::fence_streams;
pub(crate) use caches::{l1_data_cache, streams};

pub use affine::AffineRow;
pub use chain::{ChainRow, CHAIN_OPS, NO_OP};
pub(crate) use chain::{ADD, DIV, FLIP, MAX_SRCS, MAX_STEPS, MUL, SRC_SHIFT, SUB};
pub use reduce::{LSE, LSE_STORE, SOFTMAX_ROW, WELFORD};
pub use tile::{op_code, SUPPORTED, TILE};

use kiln_ir::{Error, UnaryOp};

/// A wide instruction set the helpers are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WideIsa {
    /// AVX2 + FMA, 8 f32 lanes.
    Avx2,
    /// AVX-512F, 16 f32 lanes.
    Avx512,
    /// One lane of plain Rust (no wide ISA; for tests and as the fallback).
    Portable,
}

impl WideIsa {
    /// `avx2`, `avx512` or `portable`, for logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            WideIsa::Avx2 => "avx2",
            WideIsa::Avx512 => "avx512",
            WideIsa::Portable => "portable",
        }
    }

    /// f32 lanes per vector.
    pub fn lanes(self) -> usize {
        match self {
            WideIsa::Avx2 => 8,
            WideIsa::Avx512 => 16,
            WideIsa::Portable => 1,
        }
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        match self {
            WideIsa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The `extern "C" fn(op_code, buf, n)` the JIT code calls (see [`entry`]).
    pub(crate) fn entry(self) -> *const u8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx2 => wide_unary_avx2 as *const u8,
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx512 => wide_unary_avx512 as *const u8,
            _ => wide_unary_portable as *const u8,
        }
    }
}

impl WideIsa {
    /// The `extern "C" fn(kind, tile, n, state, aux, next)` that folds a
    /// tile into a row reduction's state (see `reduce.rs`; `aux` is a
    /// Welford state's count, or the row an [`LSE_STORE`] reads, and `next`
    /// that row's successor, or null).
    pub(crate) fn reduce_entry(self) -> *const u8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx2 => wide_reduce_avx2 as *const u8,
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx512 => wide_reduce_avx512 as *const u8,
            _ => wide_reduce_portable as *const u8,
        }
    }
}

impl WideIsa {
    /// The `extern "C" fn(&AffineRow)` of a normalisation's row pass
    /// (see `affine.rs`).
    pub(crate) fn affine_entry(self) -> *const u8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx2 => wide_affine_avx2 as *const u8,
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx512 => wide_affine_avx512 as *const u8,
            _ => wide_affine_portable as *const u8,
        }
    }
}

impl WideIsa {
    /// The `extern "C" fn(&ChainRow)` of a pointwise row that is one chain
    /// (see `chain.rs`).
    pub(crate) fn chain_entry(self) -> *const u8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx2 => wide_chain_avx2 as *const u8,
            #[cfg(target_arch = "x86_64")]
            WideIsa::Avx512 => wide_chain_avx512 as *const u8,
            _ => wide_chain_portable as *const u8,
        }
    }
}

/// An `extern "C"` entry per ISA for the helper `$f`, a function generic
/// over [`lanes::Lanes`] that is inlined into each: the portable one, and on
/// x86_64 an AVX2 + FMA and an AVX-512F one whose `#[target_feature]`
/// reaches every intrinsic (each is handed out only where
/// [`WideIsa::available`] says so).
macro_rules! isa_entries {
    ($portable:ident, $avx2:ident, $avx512:ident => $f:ident($($a:ident: $t:ty),*)) => {
        extern "C" fn $portable($($a: $t),*) {
            // SAFETY: the JIT passes pointers covering what the helper touches.
            unsafe { $f::<lanes::Scalar>($($a),*) }
        }

        isa_entries!(@x86 $avx2, "avx2,fma", avx2::Avx2 => $f($($a: $t),*));
        isa_entries!(@x86 $avx512, "avx512f", avx512::Avx512 => $f($($a: $t),*));
    };
    (@x86 $name:ident, $features:literal, $lanes:ty => $f:ident($($a:ident: $t:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        extern "C" fn $name($($a: $t),*) {
            #[target_feature(enable = $features)]
            unsafe fn go($($a: $t),*) {
                $f::<$lanes>($($a),*)
            }
            // SAFETY: handed out only where the CPU has `$features`
            // (`WideIsa::available`); as the portable entry.
            unsafe { go($($a),*) }
        }
    };
}

/// A chain row (`chain.rs`) from the JIT's stack.
#[inline(always)]
unsafe fn chain_abi<L: lanes::Lanes>(r: *const ChainRow) {
    chain::chain_row::<L>(&*r)
}

/// A normalisation's row pass (`affine.rs`) from the JIT's stack.
#[inline(always)]
unsafe fn affine_abi<L: lanes::Lanes>(r: *const AffineRow) {
    affine::affine_row::<L>(&*r)
}

/// A tile or row folded into a reduction state (`reduce.rs`).
#[inline(always)]
unsafe fn reduce_abi<L: lanes::Lanes>(
    kind: u64,
    x: *mut f32,
    n: u64,
    st: *mut f32,
    aux: u64,
    next: *const f32,
) {
    reduce::reduce_tile::<L>(kind, x, n as usize, st, aux, next)
}

isa_entries!(wide_chain_portable, wide_chain_avx2, wide_chain_avx512 => chain_abi(r: *const ChainRow));
isa_entries!(wide_affine_portable, wide_affine_avx2, wide_affine_avx512 => affine_abi(r: *const AffineRow));
isa_entries!(wide_reduce_portable, wide_reduce_avx2, wide_reduce_avx512 => reduce_abi(
    kind: u64, x: *mut f32, n: u64, st: *mut f32, aux: u64, next: *const f32
));

/// `out[i] = ((x[i] - mean) * rstd) * w[i] + b[i]` with `isa` (`None`:
/// portable), as the JIT code runs a normalisation's row pass; `w` and `b`
/// may be absent.
///
/// ```
/// use kiln_codegen::cpu::wide;
/// let (x, w, mut out) = ([1.0f32, 3.0], [2.0f32, 2.0], [0.0f32; 2]);
/// wide::affine_row(wide::detect(), &x, Some(&w), None, &mut out, 2.0, 0.5).unwrap();
/// assert_eq!(out, [-1.0, 1.0]);
/// ```
pub fn affine_row(
    isa: Option<WideIsa>,
    x: &[f32],
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    out: &mut [f32],
    mean: f32,
    rstd: f32,
) -> Result<(), Error> {
    let isa = available(isa, "affine_row")?;
    let n = out.len();
    let lens = [Some(x), w, b].map(|r| r.map(|r| r.len()));
    if lens.iter().flatten().any(|&l| l != n) {
        return Err(Error::Codegen(format!(
            "wide::affine_row: out has {n} values, (x, w, b) {lens:?}"
        )));
    }
    let ptr = |r: Option<&[f32]>| r.map_or(std::ptr::null(), |r| r.as_ptr());
    let row = AffineRow {
        x: x.as_ptr(),
        w: ptr(w),
        b: ptr(b),
        out: out.as_mut_ptr(),
        next: std::ptr::null(),
        n: n as u64,
        launch: n as u64,
        mean,
        rstd,
    };
    let f: extern "C" fn(*const AffineRow) =
        // SAFETY: every affine entry has this signature.
        unsafe { std::mem::transmute::<*const u8, _>(isa.affine_entry()) };
    f(&row);
    Ok(())
}

/// Folds `xs` into a reduction state with `isa` (`None`: portable), as the
/// JIT code does per tile: `kind` is [`LSE`] (state `[m, s]`, start
/// `[f32::MIN, 0]`) or [`WELFORD`] (state `[mean, m2]` of `count` values).
pub fn fold_tile(
    isa: Option<WideIsa>,
    kind: u64,
    xs: &[f32],
    state: &mut [f32; 2],
    count: u64,
) -> Result<(), Error> {
    let isa = available(isa, "fold_tile")?;
    if kind == LSE_STORE || kind == SOFTMAX_ROW {
        return Err(Error::Codegen(
            "wide::fold_tile: LSE_STORE and SOFTMAX_ROW rewrite their row (use wide::lse_store_row or wide::softmax_from)".into(),
        ));
    }
    // SAFETY: the helpers only read a tile of another kind.
    unsafe { reduce_with(isa, kind, xs.as_ptr() as *mut f32, xs.len(), state, count) };
    Ok(())
}

/// A softmax row's first half, as the JIT code runs it: returns the row's
/// log-sum-exp state `[shift, s]` and leaves `exp(x - shift)` in `xs` (see
/// [`LSE_STORE`]).
///
/// ```
/// use kiln_codegen::cpu::wide;
/// let mut xs = vec![0.0f32, 1.0, 2.0];
/// let [shift, s] = wide::lse_store_row(wide::detect(), &mut xs).unwrap();
/// assert_eq!(shift, 2.0);
/// assert!((s - (1.0 + (-1f32).exp() + (-2f32).exp())).abs() < 1e-6);
/// ```
pub fn lse_store_row(isa: Option<WideIsa>, xs: &mut [f32]) -> Result<[f32; 2], Error> {
    let isa = available(isa, "lse_store_row")?;
    let mut state = [f32::MIN, 0.0];
    // SAFETY: a row of xs.len() f32 and a 2-f32 state.
    unsafe { reduce_with(isa, LSE_STORE, xs.as_mut_ptr(), xs.len(), &mut state, 0) };
    Ok(state)
}

/// [`lse_store_row`] reading `src` and writing the exps to `dst`, as the
/// JIT code runs a softmax of a contiguous input.
///
/// ```
/// use kiln_codegen::cpu::wide;
/// let (src, mut dst) = ([0.0f32, 1.0], [9.0f32; 2]);
/// let [shift, _] = wide::lse_store_from(wide::detect(), &src, &mut dst).unwrap();
/// assert_eq!((shift, dst[1]), (1.0, 1.0));
/// ```
pub fn lse_store_from(
    isa: Option<WideIsa>,
    src: &[f32],
    dst: &mut [f32],
) -> Result<[f32; 2], Error> {
    row_from(isa, LSE_STORE, "lse_store_from", src, dst)
}

/// The whole softmax of the row `src` into `dst` ([`SOFTMAX_ROW`]), as the
/// JIT code runs a softmax whose row pass is the exp itself; returns the
/// log-sum-exp state `[shift, s]`.
///
/// ```
/// use kiln_codegen::cpu::wide;
/// let (src, mut dst) = ([0.0f32, 0.0], [9.0f32; 2]);
/// let [_, s] = wide::softmax_from(wide::detect(), &src, &mut dst).unwrap();
/// assert_eq!((s, dst), (2.0, [0.5, 0.5]));
/// ```
pub fn softmax_from(isa: Option<WideIsa>, src: &[f32], dst: &mut [f32]) -> Result<[f32; 2], Error> {
    row_from(isa, SOFTMAX_ROW, "softmax_from", src, dst)
}

/// A whole-row helper `kind` reading `src`, writing `dst`.
fn row_from(
    isa: Option<WideIsa>,
    kind: u64,
    what: &str,
    src: &[f32],
    dst: &mut [f32],
) -> Result<[f32; 2], Error> {
    let isa = available(isa, what)?;
    if src.len() != dst.len() {
        return Err(Error::Codegen(format!(
            "wide::{what}: src has {} values, dst {}",
            src.len(),
            dst.len()
        )));
    }
    let mut state = [f32::MIN, 0.0];
    let aux = src.as_ptr() as u64;
    // SAFETY: rows of dst.len() f32 each and a 2-f32 state.
    unsafe { reduce_with(isa, kind, dst.as_mut_ptr(), dst.len(), &mut state, aux) };
    Ok(state)
}

/// `isa` (`None`: portable) if this CPU has it, else an error naming `what`.
fn available(isa: Option<WideIsa>, what: &str) -> Result<WideIsa, Error> {
    let isa = isa.unwrap_or(WideIsa::Portable);
    if isa.available() {
        Ok(isa)
    } else {
        Err(Error::Codegen(format!(
            "wide::{what}: this CPU lacks {}",
            isa.name()
        )))
    }
}

/// Calls `isa`'s reduce entry.
///
/// # Safety
/// `x` points at `n` f32, writable for [`LSE_STORE`]; `isa` is available.
unsafe fn reduce_with(
    isa: WideIsa,
    kind: u64,
    x: *mut f32,
    n: usize,
    state: &mut [f32; 2],
    count: u64,
) {
    let f: extern "C" fn(u64, *mut f32, u64, *mut f32, u64, *const f32) =
        // SAFETY: every reduce entry has this signature.
        unsafe { std::mem::transmute::<*const u8, _>(isa.reduce_entry()) };
    f(
        kind,
        x,
        n as u64,
        state.as_mut_ptr(),
        count,
        std::ptr::null(),
    );
}

/// Which kernels call the helpers (where the CPU has a wide ISA and FMA).
///
/// ```
/// use kiln_codegen::cpu::wide::{Uses, WideIsa};
/// let u = Uses::from_env(WideIsa::Avx512);
/// assert!(u.rows || std::env::var("KILN_WIDE").is_ok_and(|v| v == "0"));
/// assert!(!Uses::all(false).any());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Uses {
    /// Pointwise rows with a transcendental, on tiles.
    pub pointwise: bool,
    /// Log-sum-exp rows (softmax, log_softmax, logsumexp, cross entropy),
    /// Welford rows of a contiguous input (layer_norm of a tensor) and
    /// normalising row passes (`affine.rs`).
    pub rows: bool,
    /// Welford rows of an expression, through a tile copy.
    pub expression_rows: bool,
    /// Pointwise rows that are one chain of binary steps around one wide
    /// op, in one pass (`chain.rs`) instead of tiles or f32x4.
    pub chains: bool,
}

impl Uses {
    /// Every use on, or none.
    pub fn all(on: bool) -> Uses {
        Uses {
            pointwise: on,
            rows: on,
            expression_rows: on,
            chains: on,
        }
    }

    /// The uses measured to pay, unless `KILN_WIDE` says otherwise
    /// (`1`: all, `0`: none). Rows: on AVX2, W2 softmax ran 1.70x faster
    /// compiled and 1.27x eager; on AVX-512, W3 layer_norm read in place
    /// 2.44 -> 1.76 ms. Pointwise on AVX-512 only: with compound ops in
    /// registers W1's gelu chain ran 2.39 -> 1.83 ms compiled on Zen 5 (on
    /// AVX2 it had lost, 0.59x, before that). Chains on both (`KILN_CHAIN=0`
    /// turns them off): W1 compiled ~2.0 -> 1.33-1.63 ms on AVX-512 and
    /// 4.6-6.5 -> 2.9-3.5 ms with the AVX2 helpers (`KILN_WIDE_ISA=avx2`,
    /// Zen 4, a busy period). Welford rows through a tile copy measured no
    /// faster than f32x4.
    pub fn from_env(isa: WideIsa) -> Uses {
        match std::env::var("KILN_WIDE").as_deref() {
            Ok("1") => Uses::all(true),
            Ok("0") => Uses::all(false),
            _ => Uses {
                pointwise: isa == WideIsa::Avx512,
                rows: true,
                expression_rows: false,
                chains: isa != WideIsa::Portable
                    && !std::env::var("KILN_CHAIN").is_ok_and(|v| v == "0"),
            },
        }
    }

    /// Whether any kernel calls a helper.
    pub fn any(self) -> bool {
        self.pointwise || self.rows || self.expression_rows || self.chains
    }
}

/// The widest ISA this CPU has (AVX-512F, else AVX2 + FMA), or `None` when it
/// has neither or the environment sets `KILN_WIDE=0` (then kernels keep
/// their 128-bit Cranelift code). Detected once per process.
pub fn detect() -> Option<WideIsa> {
    static ISA: std::sync::OnceLock<Option<WideIsa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("KILN_WIDE").is_ok_and(|v| v == "0") {
            return None;
        }
        // `KILN_WIDE_ISA=avx2` takes AVX2 on an AVX-512 machine (to time it)
        let avx2 = std::env::var("KILN_WIDE_ISA").is_ok_and(|v| v == "avx2");
        [WideIsa::Avx512, WideIsa::Avx2]
            .into_iter()
            .filter(|&i| !(avx2 && i == WideIsa::Avx512))
            .find(|i| i.available())
    })
}

/// `xs = op(xs)` in place with `isa` (`None`: the portable helper), for
/// tests and callers outside the JIT.
pub fn apply(isa: Option<WideIsa>, op: UnaryOp, xs: &mut [f32]) -> Result<(), Error> {
    let code = op_code(op).ok_or_else(|| {
        Error::Codegen(format!(
            "wide::apply: {op:?} has no wide helper (supported: {SUPPORTED:?})"
        ))
    })?;
    let isa = available(isa, "apply")?;
    let f: extern "C" fn(u64, *mut f32, u64) =
        // SAFETY: every entry has this signature.
        unsafe { std::mem::transmute::<*const u8, _>(isa.entry()) };
    f(code as u64, xs.as_mut_ptr(), xs.len() as u64);
    Ok(())
}

fn op_of(code: u64) -> Option<UnaryOp> {
    SUPPORTED.get(code as usize).copied()
}

/// The portable helper: `buf[..n] = SUPPORTED[op](buf[..n])`.
extern "C" fn wide_unary_portable(op: u64, buf: *mut f32, n: u64) {
    if let Some(op) = op_of(op) {
        // SAFETY: the JIT passes a tile of n f32.
        unsafe {
            tile::run::<isa::Portable, isa::Portable>(op, buf, n as usize, isa::PORTABLE_LANES)
        }
    }
}

/// The AVX2 helper (only handed out where [`WideIsa::available`] says so).
#[cfg(target_arch = "x86_64")]
extern "C" fn wide_unary_avx2(op: u64, buf: *mut f32, n: u64) {
    if let Some(op) = op_of(op) {
        // SAFETY: a tile of n f32; the CPU has AVX2 + FMA.
        unsafe { tile::run::<isa::Avx2Tiles, isa::Portable>(op, buf, n as usize, 8) }
    }
}

/// The AVX-512 helper (only handed out where [`WideIsa::available`] says so).
#[cfg(target_arch = "x86_64")]
extern "C" fn wide_unary_avx512(op: u64, buf: *mut f32, n: u64) {
    if let Some(op) = op_of(op) {
        // SAFETY: a tile of n f32; the CPU has AVX-512F.
        unsafe { tile::run::<isa::Avx512Tiles, isa::Portable>(op, buf, n as usize, 16) }
    }
}
