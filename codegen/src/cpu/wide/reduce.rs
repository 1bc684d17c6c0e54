//! Row-reduction helpers: fold one tile of a row into a log-sum-exp or
//! Welford state, reading the tile (in L1) twice instead of keeping a
//! per-lane running state.
//!
//! - log-sum-exp: the tile's max `M` (at least the lowest finite value, as
//!   [`crate::online`]'s shift), then `Σ exp(x - M)` — one exp per element,
//!   no rescaling selects — merged into `(m, s)` as `lse_merge` does. A NaN
//!   anywhere makes the shift NaN; `+inf` makes it `+inf`; a row of `-inf`
//!   keeps the lowest shift with `s = 0`: the finished values are those of
//!   the one-pass reduction.
//! - Welford: the tile's mean, then `Σ (x - mean)²` (two passes), merged into
//!   `(mean, m2)` with Chan et al.'s formula. A tile holding inf or NaN
//!   before its last value has a NaN mean, as the one-pass update gives.
//!
//! State layout (f32): `[m, s]` or `[mean, m2]`; `count` is how many values
//! the state already holds.

use super::lanes::{Lanes, Scalar};
use super::math;

/// The reduction a tile is folded into (the helpers' `kind` argument).
pub const LSE: u64 = 0;
/// See [`LSE`].
pub const WELFORD: u64 = 1;
/// A whole row's log-sum-exp that also writes `exp(x - shift)` to the row
/// (see [`lse_store_row`]): a softmax's one exp per element.
pub const LSE_STORE: u64 = 2;

/// [`LSE_STORE`], then the row times `1 / s`: a whole softmax row, for a row
/// pass that is the exp itself (its `out1[i] * (1 / s)`, same bits, at the
/// helper's width while the row is in cache).
pub const SOFTMAX_ROW: u64 = 3;

const ACCS: usize = 4;
// `fold` joins the accumulators as two pairs.
const _: () = assert!(ACCS == 4);

#[inline(always)]
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else {
        b
    }
}

/// Every accumulator folded into one value: the vectors combined pairwise
/// with `join` (a [`Step`] whose accumulator and operand are alike, such as
/// [`Sum`]), then the lanes halved as a tree with `f`. A tree, not a chain:
/// a chain of 63 dependent adds cost more than a 256-element tile's sweep.
#[inline(always)]
unsafe fn fold<L: Lanes>(
    accs: &[L::F; ACCS],
    join: impl Step<L>,
    f: impl Fn(f32, f32) -> f32,
) -> f32 {
    let v = join.step(join.step(accs[0], accs[1]), join.step(accs[2], accs[3]));
    let mut lanes = [0f32; 16];
    L::store(lanes.as_mut_ptr(), v);
    let mut n = L::N;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            lanes[l] = f(lanes[l], lanes[l + n]);
        }
    }
    lanes[0]
}

/// One accumulator update of a [`sweep`]. A struct rather than a closure:
/// closures do not inherit the `#[target_feature]` of the ISA entry that
/// instantiates this code, so an out-of-line closure would also call every
/// intrinsic out of line (the lse helper ran 12x slower that way).
trait Step<L: Lanes> {
    fn step(&self, acc: L::F, v: L::F) -> L::F;
}

/// `max(acc, v)` (x86 `maxps`; NaNs are tracked by [`NanMask`]).
struct Max;
/// `acc | (v != v)`: all bits set in lanes that saw a NaN.
struct NanMask;
/// `acc + exp(v - shift)`.
struct ExpSum<F>(F);
/// `acc + v`.
struct Sum;
/// `acc + (v - mean)²`.
struct SquaredDeviation<F>(F);

impl<L: Lanes> Step<L> for Max {
    #[inline(always)]
    fn step(&self, acc: L::F, v: L::F) -> L::F {
        L::max_fast(acc, v)
    }
}
impl<L: Lanes> Step<L> for NanMask {
    #[inline(always)]
    fn step(&self, acc: L::F, v: L::F) -> L::F {
        L::or(acc, L::cmp(kiln_ir::scalar::Cmp::Ne, v, v))
    }
}
impl<L: Lanes> Step<L> for ExpSum<L::F> {
    #[inline(always)]
    fn step(&self, acc: L::F, v: L::F) -> L::F {
        L::add(acc, math::exp::<L>(L::sub(v, self.0)))
    }
}
impl<L: Lanes> Step<L> for Sum {
    #[inline(always)]
    fn step(&self, acc: L::F, v: L::F) -> L::F {
        L::add(acc, v)
    }
}
impl<L: Lanes> Step<L> for SquaredDeviation<L::F> {
    #[inline(always)]
    fn step(&self, acc: L::F, v: L::F) -> L::F {
        let d = L::sub(v, self.0);
        L::fma(d, d, acc)
    }
}

/// `f.step(acc[j], x)` over the tile, `ACCS` independent accumulators.
#[inline(always)]
unsafe fn sweep<L: Lanes>(x: *const f32, main: usize, init: L::F, f: impl Step<L>) -> [L::F; ACCS] {
    let mut acc = [init; ACCS];
    let step = L::N * ACCS;
    let mut i = 0;
    while i + step <= main {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = f.step(*a, L::load(x.add(i + j * L::N)));
        }
        i += step;
    }
    while i < main {
        acc[0] = f.step(acc[0], L::load(x.add(i)));
        i += L::N;
    }
    acc
}

#[inline(always)]
fn exp1(x: f32) -> f32 {
    math::exp::<Scalar>(x)
}

/// The log-sum-exp shift of `x[..n]`: its max, at least the lowest finite
/// value, NaN with a NaN anywhere. One sweep keeps both the maxes and a NaN
/// mask (`maxps` alone drops NaNs).
#[inline(always)]
unsafe fn row_shift<L: Lanes>(x: *const f32, n: usize) -> f32 {
    let main = n - n % L::N;
    let mut maxes = [L::splat(f32::MIN); ACCS];
    let mut nans = [L::splat(0.0); ACCS];
    let step = L::N * ACCS;
    let mut i = 0;
    while i + step <= main {
        for j in 0..ACCS {
            let v = L::load(x.add(i + j * L::N));
            maxes[j] = Step::<L>::step(&Max, maxes[j], v);
            nans[j] = Step::<L>::step(&NanMask, nans[j], v);
        }
        i += step;
    }
    while i < main {
        let v = L::load(x.add(i));
        maxes[0] = Step::<L>::step(&Max, maxes[0], v);
        nans[0] = Step::<L>::step(&NanMask, nans[0], v);
        i += L::N;
    }
    let mut m = fold::<L>(&maxes, Max, nan_max);
    if fold::<L>(&nans, NanMask, |a, b| {
        f32::from_bits(a.to_bits() | b.to_bits())
    })
    .to_bits()
        != 0
    {
        m = f32::NAN;
    }
    for j in main..n {
        m = nan_max(m, *x.add(j));
    }
    m
}

/// Folds `x[..n]` into the log-sum-exp state `[m, s]`.
#[inline(always)]
pub(crate) unsafe fn lse_tile<L: Lanes>(x: *const f32, n: usize, state: *mut f32) {
    let main = n - n % L::N;
    let m = row_shift::<L>(x, n);
    let mv = L::splat(m);
    let sums = sweep::<L>(x, main, L::splat(0.0), ExpSum(mv));
    let mut s = fold::<L>(&sums, Sum, |a, b| a + b);
    for j in main..n {
        s += exp1(*x.add(j) - m);
    }
    let (m0, s0) = (*state, *state.add(1));
    let mm = nan_max(m0, m);
    *state = mm;
    *state.add(1) = s0 * exp1(m0 - mm) + s * exp1(m - mm);
}

/// The log-sum-exp of the whole row `src[..n]` into `state = [shift, s]`,
/// writing `dst[i] = exp(src[i] - shift)` (one exp per element; `s` is their
/// sum; `dst` may be `src`). `shift` is the row max, at least the lowest
/// finite value and NaN with a NaN in the row, as [`lse_tile`]'s: the state
/// is the one-pass reduction's, and `dst * (1 / s)` is the softmax.
#[inline(always)]
pub(crate) unsafe fn lse_store_row<L: Lanes>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    state: *mut f32,
) {
    let main = n - n % L::N;
    let m = row_shift::<L>(src, n);
    let mv = L::splat(m);
    let mut acc = [L::splat(0.0); ACCS];
    let step = L::N * ACCS;
    let mut i = 0;
    while i + step <= main {
        for (j, a) in acc.iter_mut().enumerate() {
            let at = i + j * L::N;
            let e = math::exp::<L>(L::sub(L::load(src.add(at)), mv));
            L::store(dst.add(at), e);
            *a = L::add(*a, e);
        }
        i += step;
    }
    while i < main {
        let e = math::exp::<L>(L::sub(L::load(src.add(i)), mv));
        L::store(dst.add(i), e);
        acc[0] = L::add(acc[0], e);
        i += L::N;
    }
    let mut s = fold::<L>(&acc, Sum, |a, b| a + b);
    for j in main..n {
        let e = exp1(*src.add(j) - m);
        *dst.add(j) = e;
        s += e;
    }
    *state = m;
    *state.add(1) = s;
}

/// `x[i] *= scale` for `i < n`.
#[inline(always)]
unsafe fn scale_row<L: Lanes>(x: *mut f32, n: usize, scale: f32) {
    let main = n - n % L::N;
    let sv = L::splat(scale);
    let mut i = 0;
    while i < main {
        L::store(x.add(i), L::mul(L::load(x.add(i)), sv));
        i += L::N;
    }
    for j in main..n {
        *x.add(j) *= scale;
    }
}

/// Folds `x[..n]` into the Welford state `[mean, m2]` of `count` values.
#[inline(always)]
pub(crate) unsafe fn welford_tile<L: Lanes>(x: *const f32, n: usize, state: *mut f32, count: u64) {
    let main = n - n % L::N;
    let sums = sweep::<L>(x, main, L::splat(0.0), Sum);
    let mut sum = fold::<L>(&sums, Sum, |a, b| a + b);
    for j in main..n {
        sum += *x.add(j);
    }
    let mut mean = sum / n as f32;
    if !sum.is_finite() && (0..n - 1).any(|j| !(*x.add(j)).is_finite()) {
        // The one-pass mean turns NaN at the first value after an inf or
        // NaN (`inf + (x - inf) / n`); only a row whose sole non-finite
        // value is its last keeps a mean of ±inf. Tiles merge into the
        // same result: an inf mean followed by any tile gives NaN.
        mean = f32::NAN;
    }
    let mv = L::splat(mean);
    let sq = sweep::<L>(x, main, L::splat(0.0), SquaredDeviation(mv));
    let mut m2 = fold::<L>(&sq, Sum, |a, b| a + b);
    for j in main..n {
        let d = *x.add(j) - mean;
        m2 = d.mul_add(d, m2);
    }
    let (mean0, m20) = (*state, *state.add(1));
    if count == 0 {
        *state = mean;
        *state.add(1) = m2;
        return;
    }
    let (na, nb) = (count as f64, n as f64);
    let delta = (mean - mean0) as f64;
    let f = nb / (na + nb);
    *state = (mean0 as f64 + delta * f) as f32;
    *state.add(1) = (m20 as f64 + m2 as f64 + delta * delta * na * f) as f32;
}

/// Folds a tile into the state of reduction `kind` ([`LSE`], [`WELFORD`],
/// or [`LSE_STORE`] and [`SOFTMAX_ROW`] over a whole row, which write `exp`
/// (or the softmax) to `x`). `aux` is the count of values already in a
/// Welford state, and for the whole-row kinds the address of the row they
/// read (0: `x` itself). `next` is the row after the one a whole-row kind
/// reads (null: none), fetched while this one is finished.
#[inline(always)]
pub(crate) unsafe fn reduce_tile<L: Lanes>(
    kind: u64,
    x: *mut f32,
    n: usize,
    state: *mut f32,
    aux: u64,
    next: *const f32,
) {
    if n == 0 {
        return;
    }
    if matches!(kind, LSE_STORE | SOFTMAX_ROW) {
        // the row read, the row written and the next row
        super::prefetch::next_row(next, n, 3);
    }
    match kind {
        LSE => lse_tile::<L>(x, n, state),
        LSE_STORE => {
            let src = if aux == 0 {
                x as *const f32
            } else {
                aux as *const f32
            };
            lse_store_row::<L>(src, x, n, state)
        }
        SOFTMAX_ROW => {
            let src = if aux == 0 {
                x as *const f32
            } else {
                aux as *const f32
            };
            lse_store_row::<L>(src, x, n, state);
            scale_row::<L>(x, n, 1.0 / *state.add(1))
        }
        _ => welford_tile::<L>(x, n, state, aux),
    }
}
