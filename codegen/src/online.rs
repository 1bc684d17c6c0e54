//! One-pass reductions whose running state is more than one value, written
//! once over [`ScalarOps`] so the interpreter, Cranelift (lane-wise, on
//! vectors too) and CUDA C share their meaning:
//!
//! - [`ReduceKind::LogSumExp`]: the online log-sum-exp. The state is `(m, s)`,
//!   a running shift and `s = Σ exp(x - m)`. A new `x` above `m` (or NaN)
//!   becomes the shift and rescales the sum: `s = s·exp(m - x) + 1`; otherwise
//!   `s += exp(x - m)`. Both cases take one `exp(-|x - m|)`. `m` starts at the
//!   lowest finite value rather than -inf, so -inf elements add `exp(-inf) = 0`
//!   instead of `exp(-inf + inf) = NaN`. Two states merge as `m = max(m1, m2)`,
//!   `s = s1·exp(m1 - m) + s2·exp(m2 - m)`.
//! - [`ReduceKind::Welford`]: Welford's mean and variance. The state is
//!   `(n, mean, m2)` with `n` an i64 count (kept by the backend, see
//!   [`welford_push`]); two states merge with Chan et al.'s formula.
//!
//! [`lse_finish`] and [`welford_finish`] give the epilogue's values (the
//! reduction's `acc` and its parts, see [`AccPart`]).

use crate::kernel::AccPart;
use kiln_ir::scalar::{Cmp, Prim1, Prim2, ScalarOps};
use kiln_ir::{DType, ReduceKind};

/// The lowest finite value of a float dtype: the log-sum-exp's starting shift.
pub fn lowest(dt: DType) -> f64 {
    match dt {
        DType::F64 => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// `(m, s)`: the log-sum-exp of the values seen is `m + log(s)`.
#[derive(Debug, Clone, Copy)]
pub struct Lse<V> {
    pub m: V,
    pub s: V,
}

/// The empty log-sum-exp: `(lowest, 0)`.
pub fn lse_init<S: ScalarOps>(s: &mut S, dt: DType) -> Lse<S::V> {
    Lse {
        m: s.constant(lowest(dt), dt),
        s: s.constant(0.0, dt),
    }
}

/// Adds `x` to the state (branch-free, so it vectorises lane-wise).
pub fn lse_push<S: ScalarOps>(s: &mut S, st: Lse<S::V>, x: S::V, dt: DType) -> Lse<S::V> {
    let gt = s.compare(Cmp::Gt, x, st.m, dt);
    let nan = s.compare(Cmp::Ne, x, x, dt);
    let take = s.binary(Prim2::Or, gt, nan, DType::Bool);
    // exp(m - x) when x takes over, exp(x - m) otherwise: exp(-|x - m|)
    let d = s.binary(Prim2::Sub, x, st.m, dt);
    let a = s.unary(Prim1::Abs, d, dt);
    let na = s.unary(Prim1::Neg, a, dt);
    let e = s.unary(Prim1::Exp, na, dt);
    let one = s.constant(1.0, dt);
    let scaled = s.binary(Prim2::Mul, st.s, e, dt);
    let rescaled = s.binary(Prim2::Add, scaled, one, dt);
    let added = s.binary(Prim2::Add, st.s, e, dt);
    Lse {
        m: s.select(take, x, st.m, dt),
        s: s.select(take, rescaled, added, dt),
    }
}

/// Combines two states (lane-wise).
pub fn lse_merge<S: ScalarOps>(s: &mut S, a: Lse<S::V>, b: Lse<S::V>, dt: DType) -> Lse<S::V> {
    let m = s.binary(Prim2::Max, a.m, b.m, dt);
    let da = s.binary(Prim2::Sub, a.m, m, dt);
    let ea = s.unary(Prim1::Exp, da, dt);
    let db = s.binary(Prim2::Sub, b.m, m, dt);
    let eb = s.unary(Prim1::Exp, db, dt);
    let sa = s.binary(Prim2::Mul, a.s, ea, dt);
    let sb = s.binary(Prim2::Mul, b.s, eb, dt);
    Lse {
        m,
        s: s.binary(Prim2::Add, sa, sb, dt),
    }
}

/// The finished log-sum-exp: `(lse, shift, logsum)` with `lse = shift + logsum`.
///
/// `logsum = log(s)`, except NaN when the shift is +inf (so a softmax
/// `exp((x - shift) - logsum)` is NaN on that row, as PyTorch's); `lse` is
/// the shift itself when that is +inf. A row of only -inf (or an empty one)
/// keeps the lowest finite shift with `s = 0`: `logsum = lse = -inf`.
pub fn lse_finish<S: ScalarOps>(s: &mut S, st: Lse<S::V>, dt: DType) -> (S::V, S::V, S::V) {
    let l = s.unary(Prim1::Log, st.s, dt);
    let inf = s.constant(f64::INFINITY, dt);
    let top = s.compare(Cmp::Eq, st.m, inf, dt);
    let nan = s.constant(f64::NAN, dt);
    let logsum = s.select(top, nan, l, dt);
    let sum = s.binary(Prim2::Add, st.m, l, dt);
    let lse = s.select(top, st.m, sum, dt);
    (lse, st.m, logsum)
}

/// `(mean, m2)` of Welford's state; the count is kept by the backend (an
/// i64 per state, or one count shared by vector lanes that all saw as many values).
#[derive(Debug, Clone, Copy)]
pub struct Moments<V> {
    pub mean: V,
    pub m2: V,
}

pub fn welford_init<S: ScalarOps>(s: &mut S, dt: DType) -> Moments<S::V> {
    let z = s.constant(0.0, dt);
    Moments { mean: z, m2: z }
}

/// Adds `x` as the `n`-th value, given `inv_n = 1 / n` (lane-wise):
/// `delta = x - mean; mean += delta / n; m2 += delta * (x - mean)`.
pub fn welford_push<S: ScalarOps>(
    s: &mut S,
    st: Moments<S::V>,
    x: S::V,
    inv_n: S::V,
    dt: DType,
) -> Moments<S::V> {
    let delta = s.binary(Prim2::Sub, x, st.mean, dt);
    let step = s.binary(Prim2::Mul, delta, inv_n, dt);
    let mean = s.binary(Prim2::Add, st.mean, step, dt);
    let d2 = s.binary(Prim2::Sub, x, mean, dt);
    let p = s.binary(Prim2::Mul, delta, d2, dt);
    Moments {
        mean,
        m2: s.binary(Prim2::Add, st.m2, p, dt),
    }
}

/// `1 / n` for the i64 count `n` (as a value of `dt`).
pub fn inv_count<S: ScalarOps>(s: &mut S, n: S::V, dt: DType) -> S::V {
    let nf = s.cast(n, DType::I64, dt);
    let one = s.constant(1.0, dt);
    s.binary(Prim2::Div, one, nf, dt)
}

/// Merges states of `na` and `nb` values (counts as values of `dt`, lane-wise):
/// `delta = mean_b - mean_a`, `mean = mean_a + delta·nb/n`,
/// `m2 = m2_a + m2_b + delta²·na·nb/n`. Two empty states give an empty state.
pub fn welford_merge<S: ScalarOps>(
    s: &mut S,
    (na, a): (S::V, Moments<S::V>),
    (nb, b): (S::V, Moments<S::V>),
    dt: DType,
) -> Moments<S::V> {
    let n = s.binary(Prim2::Add, na, nb, dt);
    let zero = s.constant(0.0, dt);
    let empty = s.compare(Cmp::Eq, n, zero, dt);
    let q = s.binary(Prim2::Div, nb, n, dt);
    let f = s.select(empty, zero, q, dt);
    let delta = s.binary(Prim2::Sub, b.mean, a.mean, dt);
    let step = s.binary(Prim2::Mul, delta, f, dt);
    let mean = s.binary(Prim2::Add, a.mean, step, dt);
    let dd = s.binary(Prim2::Mul, delta, delta, dt);
    let w = s.binary(Prim2::Mul, na, f, dt);
    let corr = s.binary(Prim2::Mul, dd, w, dt);
    let m2 = s.binary(Prim2::Add, a.m2, b.m2, dt);
    Moments {
        mean,
        m2: s.binary(Prim2::Add, m2, corr, dt),
    }
}

/// The finished moments of `n` values (i64): `(biased variance, mean)`,
/// both NaN when `n == 0`.
pub fn welford_finish<S: ScalarOps>(
    s: &mut S,
    n: S::V,
    st: Moments<S::V>,
    dt: DType,
) -> (S::V, S::V) {
    let nf = s.cast(n, DType::I64, dt);
    let var = s.binary(Prim2::Div, st.m2, nf, dt);
    let zero = s.constant(0.0, dt);
    let empty = s.compare(Cmp::Eq, nf, zero, dt);
    let nan = s.constant(f64::NAN, dt);
    (var, s.select(empty, nan, st.mean, dt))
}

/// Whether `kind` runs through this module.
pub fn is_online(kind: ReduceKind) -> bool {
    matches!(kind, ReduceKind::LogSumExp | ReduceKind::Welford)
}

/// The parts of a finished online reduction, as the epilogue reads them.
#[derive(Debug, Clone, Copy)]
pub struct Finished<V> {
    /// `acc`: the log-sum-exp, or the biased variance.
    pub acc: V,
    /// `acc.shift` / `acc.mean`.
    pub first: V,
    /// `acc.logsum` (log-sum-exp only; the mean again for Welford).
    pub second: V,
}

impl<V: Copy> Finished<V> {
    /// The value of `acc` (`None`) or of one of its parts.
    pub fn get(&self, part: Option<AccPart>) -> V {
        match part {
            None => self.acc,
            Some(AccPart::Shift) | Some(AccPart::Mean) => self.first,
            Some(AccPart::LogSum) => self.second,
        }
    }
}

/// Finishes a log-sum-exp state.
pub fn finish_lse<S: ScalarOps>(s: &mut S, st: Lse<S::V>, dt: DType) -> Finished<S::V> {
    let (acc, first, second) = lse_finish(s, st, dt);
    Finished { acc, first, second }
}

/// Finishes a Welford state of `n` (i64) values.
pub fn finish_welford<S: ScalarOps>(
    s: &mut S,
    n: S::V,
    st: Moments<S::V>,
    dt: DType,
) -> Finished<S::V> {
    let (acc, mean) = welford_finish(s, n, st, dt);
    Finished {
        acc,
        first: mean,
        second: mean,
    }
}
