//! The f32 transcendentals of `cpu/math.rs`, operation for operation, over
//! [`Lanes`]: same constants, same order, the same fused multiply-adds and
//! the same NaN-keeping selects, so a lane computes the bits the Cranelift
//! code computes (the tests in `wide/tests.rs` compare them bit for bit).
//! The algorithms and their accuracy are described in `cpu/math.rs`.

#![allow(clippy::excessive_precision)]

use super::super::math::{ERF_CENTRE, ERF_POLY};
use super::lanes::Lanes;
use kiln_ir::scalar::Cmp;

/// `(a < b) ? t : f`.
#[inline(always)]
fn sel_lt<L: Lanes>(a: L::F, b: L::F, t: L::F, f: L::F) -> L::F {
    L::select(L::cmp(Cmp::Lt, a, b), t, f)
}

/// min(x, hi) and max(x, lo) that keep NaN.
#[inline(always)]
fn clamp<L: Lanes>(x: L::F, lo: f32, hi: f32) -> L::F {
    let h = L::splat(hi);
    let x = sel_lt::<L>(h, x, h, x);
    let l = L::splat(lo);
    sel_lt::<L>(x, l, l, x)
}

/// Horner: `((c0·x + c1)·x + c2)...`, accumulator first in each fma.
#[inline(always)]
fn horner<L: Lanes>(x: L::F, coeffs: &[f32]) -> L::F {
    let mut p = L::splat(coeffs[0]);
    for &c in &coeffs[1..] {
        p = L::fma(p, x, L::splat(c));
    }
    p
}

/// 2^n for i32 lanes `n` in [-126, 127].
#[inline(always)]
fn pow2i<L: Lanes>(n: L::F) -> L::F {
    L::shl23(L::iadd(n, L::splat_bits(127)))
}

#[inline(always)]
pub(crate) fn abs<L: Lanes>(x: L::F) -> L::F {
    L::and(x, L::splat_bits(0x7fff_ffff))
}

#[inline(always)]
pub(crate) fn neg<L: Lanes>(x: L::F) -> L::F {
    L::xor(x, L::splat_bits(0x8000_0000))
}

#[inline(always)]
pub(crate) fn exp<L: Lanes>(x: L::F) -> L::F {
    let x = clamp::<L>(x, -104.0, 89.0);
    let magic = 12582912.0f32;
    let m = L::splat(magic);
    let t = L::fma(x, L::splat(std::f32::consts::LOG2_E), m);
    let n = L::sub(t, m);
    let r = L::fma(n, L::splat(-0.693359375), x);
    let r = L::fma(n, L::splat(2.12194440e-4), r);
    let p = horner::<L>(
        r,
        &[
            1.9875691500e-4,
            1.3981999507e-3,
            8.3334519073e-3,
            4.1665795894e-2,
            1.6666665459e-1,
            5.0000001201e-1,
        ],
    );
    let r2 = L::mul(r, r);
    let y = L::fma(p, r2, r);
    let y = L::add(y, L::splat(1.0));
    if L::SCALEF {
        // y·2^n rounded once, as the two exact-then-rounding steps below:
        // the same bits in fewer instructions.
        return L::scalef(y, n);
    }
    let ni = L::isub(t, L::splat_bits(magic.to_bits()));
    let n1 = L::sshr1(ni);
    let n2 = L::isub(ni, n1);
    let y = L::mul(y, pow2i::<L>(n1));
    L::mul(y, pow2i::<L>(n2))
}

#[inline(always)]
pub(crate) fn log<L: Lanes>(x0: L::F) -> L::F {
    let tiny = L::splat(f32::MIN_POSITIVE);
    let xs = L::mul(x0, L::splat(8388608.0));
    let x = sel_lt::<L>(x0, tiny, xs, x0);
    let zero = L::splat(0.0);
    let eadj = sel_lt::<L>(x0, tiny, L::splat(23.0), zero);
    let ei = L::isub(L::ushr23(x), L::splat_bits(126));
    let e = L::sub(L::i2f(ei), eadj);
    let mb = L::or(
        L::and(x, L::splat_bits(0x007f_ffff)),
        L::splat_bits(0x3f00_0000),
    );
    let one = L::splat(1.0);
    let lt = L::cmp(Cmp::Lt, mb, L::splat(std::f32::consts::FRAC_1_SQRT_2));
    let dm = L::select(lt, mb, zero);
    let de = L::select(lt, one, zero);
    let e = L::sub(e, de);
    let m = L::add(mb, dm);
    let m = L::sub(m, one);
    let z = L::mul(m, m);
    let p = horner::<L>(
        m,
        &[
            7.0376836292e-2,
            -1.1514610310e-1,
            1.1676998740e-1,
            -1.2420140846e-1,
            1.4249322787e-1,
            -1.6668057665e-1,
            2.0000714765e-1,
            -2.4999993993e-1,
            3.3333331174e-1,
        ],
    );
    let pm = L::mul(p, m);
    let y = L::mul(pm, z);
    let y = L::fma(e, L::splat(-2.12194440e-4), y);
    let y = L::fma(z, L::splat(-0.5), y);
    let r = L::add(m, y);
    let r = L::fma(e, L::splat(0.693359375), r);
    let inf = L::splat(f32::INFINITY);
    let r = L::select(L::cmp(Cmp::Eq, x0, inf), inf, r);
    let r = L::select(L::cmp(Cmp::Eq, x0, zero), L::splat(f32::NEG_INFINITY), r);
    L::select(L::lt_or_unordered(x0, zero), L::splat(f32::NAN), r)
}

#[inline(always)]
pub(crate) fn log1p<L: Lanes>(x: L::F) -> L::F {
    let one = L::splat(1.0);
    let u = L::add(x, one);
    let d = L::sub(u, one);
    let l = log::<L>(u);
    let q = L::div(x, d);
    let r = L::mul(l, q);
    let r = L::select(L::cmp(Cmp::Eq, d, L::splat(0.0)), x, r);
    let inf = L::splat(f32::INFINITY);
    L::select(L::cmp(Cmp::Eq, x, inf), inf, r)
}

#[inline(always)]
pub(crate) fn expm1<L: Lanes>(x: L::F) -> L::F {
    let e = exp::<L>(x);
    let big = L::sub(e, L::splat(1.0));
    let p = horner::<L>(
        x,
        &[
            1.0 / 40320.0,
            1.0 / 5040.0,
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
        ],
    );
    let small = L::mul(p, x);
    sel_lt::<L>(abs::<L>(x), L::splat(0.5), small, big)
}

/// `|r|` with the sign of `x` (r >= 0).
#[inline(always)]
fn with_sign_of<L: Lanes>(r: L::F, x: L::F) -> L::F {
    L::or(r, L::and(x, L::splat_bits(0x8000_0000)))
}

/// `x·P(x²)/Q(x²)`, coefficients from the highest degree down.
#[inline(always)]
fn odd_rational<L: Lanes>(x: L::F, p: &[f32], q: &[f32]) -> L::F {
    let x2 = L::mul(x, x);
    let pv = horner::<L>(x2, p);
    let qv = horner::<L>(x2, q);
    L::div(L::mul(pv, x), qv)
}

#[inline(always)]
pub(crate) fn tanh<L: Lanes>(x: L::F) -> L::F {
    let r = odd_rational::<L>(
        x,
        &[
            6.6781810449316e-06,
            0.002716236174942825,
            0.1274675772805192,
            0.9999999999605309,
        ],
        &[
            0.0001958757428770005,
            0.022983209392018148,
            0.4608009097213269,
            1.0,
        ],
    );
    let ax = abs::<L>(x);
    let big = L::cmp(Cmp::Gt, ax, L::splat(2.5));
    if !L::any(big) {
        return r;
    }
    let two = L::splat(2.0);
    let e = exp::<L>(L::mul(ax, two));
    let one = L::splat(1.0);
    let d = L::add(e, one);
    let t = L::sub(one, L::div(two, d));
    L::select(big, with_sign_of::<L>(t, x), r)
}

#[inline(always)]
pub(crate) fn erf<L: Lanes>(x: L::F) -> L::F {
    // the Cranelift code's polynomial (cpu/math.rs), op for op
    let u = L::sub(L::mul(x, x), L::splat(ERF_CENTRE));
    let r = L::mul(horner::<L>(u, &ERF_POLY), x);
    let ax = abs::<L>(x);
    let big = L::cmp(Cmp::Gt, ax, L::splat(2.5));
    if !L::any(big) {
        return r;
    }
    let four = L::splat(4.0);
    let a = sel_lt::<L>(four, ax, four, ax);
    let t = L::sub(a, L::splat(3.25));
    let p = horner::<L>(
        t,
        &[
            -2.039502335763673e-05,
            8.253265966244013e-05,
            -0.00017344292710577003,
            0.0002634492935295424,
            -0.0003128712767606715,
            0.00028655611589546416,
            -0.00019591072541373926,
            9.486601211825823e-05,
            -2.9185936401025028e-05,
            4.302760777115923e-06,
        ],
    );
    let e = L::sub(L::splat(1.0), p);
    L::select(big, with_sign_of::<L>(e, x), r)
}
