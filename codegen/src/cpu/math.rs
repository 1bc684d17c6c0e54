//! Vectorisable f32 transcendentals built from Cranelift arithmetic: the same
//! code serves scalars (`f32`) and vectors (`f32x4`). Every function keeps
//! NaN (clamps are written as selects that pass NaN through, which Cranelift
//! lowers to single `minps`/`maxps`) and the IEEE special values.
//!
//! - exp: Cephes expf — round(x·log2 e) by the 1.5·2^23 trick, two-constant
//!   Cody–Waite reduction, degree-5 polynomial, scaling by two powers of two so
//!   results overflow to inf and underflow gradually to 0 (about 1 ulp);
//! - log: Cephes logf — exponent extraction (subnormals rescaled), mantissa in
//!   [sqrt(1/2), sqrt 2), degree-8 polynomial (about 1 ulp);
//! - log1p: Goldberg/Kahan `log(u) · x / (u - 1)` with u = 1 + x;
//! - expm1: degree-8 Taylor polynomial for |x| < 0.5, `exp(x) - 1` beyond;
//! - tanh: a small odd rational fit, erf: an odd polynomial without division
//!   (both made for kiln with mpmath, Lawson iterations on relative error)
//!   near 0, and for |x| > 2.5 a tail formula
//!   computed in a cold block only when some lane needs it — so the common case
//!   is cheap and `1 ± f(x)` stays accurate where gelu needs it.

#![allow(clippy::excessive_precision)]

use super::emit::Emitter;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};

impl Emitter<'_, '_> {
    fn fty(&self) -> Type {
        if self.lanes == 1 {
            types::F32
        } else {
            types::F32X4
        }
    }

    fn ity(&self) -> Type {
        if self.lanes == 1 {
            types::I32
        } else {
            types::I32X4
        }
    }

    /// An f32 constant (splatted in vector mode).
    fn fc(&mut self, v: f32) -> Value {
        if self.lanes == 1 {
            self.b.ins().f32const(v)
        } else {
            self.vconst(types::F32X4, v.to_bits() as u64)
        }
    }

    /// An i32 constant (splatted in vector mode).
    fn ic(&mut self, v: i32) -> Value {
        if self.lanes == 1 {
            self.b.ins().iconst(types::I32, v as u32 as i64)
        } else {
            self.vconst(types::I32X4, v as u32 as u64)
        }
    }

    fn bits_of(&mut self, x: Value) -> Value {
        let t = self.ity();
        self.b.ins().bitcast(t, MemFlagsData::new(), x)
    }

    fn float_of(&mut self, x: Value) -> Value {
        let t = self.fty();
        self.b.ins().bitcast(t, MemFlagsData::new(), x)
    }

    /// `(x cc y) ? a : b`, lane-wise.
    fn sel(&mut self, cc: FloatCC, x: Value, y: Value, a: Value, b: Value) -> Value {
        let c = self.b.ins().fcmp(cc, x, y);
        self.fselect(c, a, b)
    }

    /// min(x, hi) and max(x, lo) that keep NaN.
    fn clamp(&mut self, x: Value, lo: f32, hi: f32) -> Value {
        let h = self.fc(hi);
        let x = self.sel(FloatCC::LessThan, h, x, h, x);
        let l = self.fc(lo);
        self.sel(FloatCC::LessThan, x, l, l, x)
    }

    /// Horner: `((c0·x + c1)·x + c2)...`, accumulator first in each fma.
    fn horner(&mut self, x: Value, coeffs: &[f32]) -> Value {
        let mut p = self.fc(coeffs[0]);
        for &c in &coeffs[1..] {
            let k = self.fc(c);
            p = self.fma(p, x, k);
        }
        p
    }

    /// 2^n for an integer vector `n` in [-126, 127].
    fn pow2i(&mut self, n: Value) -> Value {
        let bias = self.ic(127);
        let e = self.b.ins().iadd(n, bias);
        let sh = self.b.ins().iconst(types::I32, 23);
        let bits = self.b.ins().ishl(e, sh);
        self.float_of(bits)
    }

    pub(crate) fn exp_f32(&mut self, x: Value) -> Value {
        // exp(89) overflows to inf, exp(-104) rounds to 0: no further special cases.
        let x = self.clamp(x, -104.0, 89.0);
        let magic = 12582912.0f32; // 1.5 * 2^23: adding it rounds to an integer
        let log2e = self.fc(std::f32::consts::LOG2_E);
        let m = self.fc(magic);
        let t = self.fma(x, log2e, m);
        let n = self.b.ins().fsub(t, m);
        let c1 = self.fc(-0.693359375);
        let c2 = self.fc(2.12194440e-4);
        let r = self.fma(n, c1, x);
        let r = self.fma(n, c2, r);
        let p = self.horner(
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
        let r2 = self.b.ins().fmul(r, r);
        let y = self.fma(p, r2, r);
        let one = self.fc(1.0);
        let y = self.b.ins().fadd(y, one);
        // n as an integer: the low mantissa bits of t
        let tb = self.bits_of(t);
        let mb = self.ic(magic.to_bits() as i32);
        let ni = self.b.ins().isub(tb, mb);
        let one_i = self.b.ins().iconst(types::I32, 1);
        let n1 = self.b.ins().sshr(ni, one_i);
        let n2 = self.b.ins().isub(ni, n1);
        let s1 = self.pow2i(n1);
        let s2 = self.pow2i(n2);
        let y = self.b.ins().fmul(y, s1);
        self.b.ins().fmul(y, s2)
    }

    pub(crate) fn log_f32(&mut self, x0: Value) -> Value {
        // subnormals: scale by 2^23 first
        let tiny = self.fc(f32::MIN_POSITIVE);
        let k23 = self.fc(8388608.0);
        let xs = self.b.ins().fmul(x0, k23);
        let x = self.sel(FloatCC::LessThan, x0, tiny, xs, x0);
        let zero = self.fc(0.0);
        let c23 = self.fc(23.0);
        let eadj = self.sel(FloatCC::LessThan, x0, tiny, c23, zero);
        let bits = self.bits_of(x);
        let sh = self.b.ins().iconst(types::I32, 23);
        let ei = self.b.ins().ushr(bits, sh);
        let b126 = self.ic(126);
        let ei = self.b.ins().isub(ei, b126);
        let ft = self.fty();
        let e = self.b.ins().fcvt_from_sint(ft, ei);
        let e = self.b.ins().fsub(e, eadj);
        let mmask = self.ic(0x007f_ffff);
        let half = self.ic(0x3f00_0000);
        let mb = self.b.ins().band(bits, mmask);
        let mb = self.b.ins().bor(mb, half);
        let m = self.float_of(mb); // [0.5, 1)
                                   // m < sqrt(1/2): e -= 1, m = 2m - 1; else m = m - 1
        let sqrth = self.fc(std::f32::consts::FRAC_1_SQRT_2);
        let one = self.fc(1.0);
        let lt = self.b.ins().fcmp(FloatCC::LessThan, m, sqrth);
        let dm = self.fselect(lt, m, zero);
        let de = self.fselect(lt, one, zero);
        let e = self.b.ins().fsub(e, de);
        let m = self.b.ins().fadd(m, dm);
        let m = self.b.ins().fsub(m, one);
        let z = self.b.ins().fmul(m, m);
        let p = self.horner(
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
        let pm = self.b.ins().fmul(p, m);
        let y = self.b.ins().fmul(pm, z);
        let k1 = self.fc(-2.12194440e-4);
        let y = self.fma(e, k1, y);
        let mhalf = self.fc(-0.5);
        let y = self.fma(z, mhalf, y);
        let r = self.b.ins().fadd(m, y);
        let k2 = self.fc(0.693359375);
        let r = self.fma(e, k2, r);
        // log(inf) = inf, log(±0) = -inf, log(x < 0) = log(NaN) = NaN
        let inf = self.fc(f32::INFINITY);
        let r = self.sel(FloatCC::Equal, x0, inf, inf, r);
        let ninf = self.fc(f32::NEG_INFINITY);
        let r = self.sel(FloatCC::Equal, x0, zero, ninf, r);
        let nan = self.fc(f32::NAN);
        self.sel(FloatCC::UnorderedOrLessThan, x0, zero, nan, r)
    }

    pub(crate) fn log1p_f32(&mut self, x: Value) -> Value {
        let one = self.fc(1.0);
        let u = self.b.ins().fadd(x, one);
        let d = self.b.ins().fsub(u, one);
        let l = self.log_f32(u);
        let q = self.b.ins().fdiv(x, d);
        let r = self.b.ins().fmul(l, q);
        let zero = self.fc(0.0);
        let r = self.sel(FloatCC::Equal, d, zero, x, r);
        let inf = self.fc(f32::INFINITY);
        self.sel(FloatCC::Equal, x, inf, inf, r)
    }

    pub(crate) fn expm1_f32(&mut self, x: Value) -> Value {
        let e = self.exp_f32(x);
        let one = self.fc(1.0);
        let big = self.b.ins().fsub(e, one);
        // x * (1 + x/2 + x^2/6 + ... + x^7/8!)
        let p = self.horner(
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
        let small = self.b.ins().fmul(p, x);
        let ax = self.fabs(x);
        let lim = self.fc(0.5);
        self.sel(FloatCC::LessThan, ax, lim, small, big)
    }

    /// `cond ? tail : main` lane-wise, where `tail` is only computed (in a cold
    /// block) when some lane needs it.
    fn rare(&mut self, cond: Value, main: Value, tail: impl FnOnce(&mut Self) -> Value) -> Value {
        let any = if self.lanes > 1 {
            self.b.ins().vany_true(cond)
        } else {
            cond
        };
        let (tb, join) = (self.b.create_block(), self.b.create_block());
        let ty = self.b.func.dfg.value_type(main);
        let res = self.b.append_block_param(join, ty);
        self.b.set_cold_block(tb);
        self.b.ins().brif(any, tb, &[], join, &[main.into()]);
        self.b.seal_block(tb);
        self.b.switch_to_block(tb);
        let t = tail(self);
        let v = self.fselect(cond, t, main);
        self.b.ins().jump(join, &[v.into()]);
        self.b.seal_block(join);
        self.b.switch_to_block(join);
        res
    }

    /// `|r|` with the sign of `x` (r >= 0).
    fn with_sign_of(&mut self, r: Value, x: Value) -> Value {
        let xb = self.bits_of(x);
        let sign = self.ic(i32::MIN);
        let s = self.b.ins().band(xb, sign);
        let rb = self.bits_of(r);
        let o = self.b.ins().bor(rb, s);
        self.float_of(o)
    }

    /// `x·P(x²)/Q(x²)`, coefficients from the highest degree down.
    fn odd_rational(&mut self, x: Value, p: &[f32], q: &[f32]) -> Value {
        let x2 = self.b.ins().fmul(x, x);
        let pv = self.horner(x2, p);
        let qv = self.horner(x2, q);
        let px = self.b.ins().fmul(pv, x);
        self.b.ins().fdiv(px, qv)
    }

    /// tanh: a [9/6] rational fit on |x| <= 2.5 (fit error 4e-11, f32 evaluation
    /// within 4 ulp); beyond, `1 - 2/(exp(2|x|) + 1)` (in a cold block), which
    /// rounds to exactly ±1 where tanh does.
    pub(crate) fn tanh_f32(&mut self, x: Value) -> Value {
        let r = self.odd_rational(
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
        let ax = self.fabs(x);
        let lim = self.fc(2.5);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, ax, lim);
        self.rare(big, r, |em| {
            let two = em.fc(2.0);
            let a2 = em.b.ins().fmul(ax, two);
            let e = em.exp_f32(a2);
            let one = em.fc(1.0);
            let d = em.b.ins().fadd(e, one);
            let q = em.b.ins().fdiv(two, d);
            let t = em.b.ins().fsub(one, q);
            em.with_sign_of(t, x)
        })
    }

    /// erf: on |x| <= 2.5, `x * P(x^2 - 3.125)` with P of degree 11 (a
    /// relative-error fit made for kiln with mpmath and Lawson iterations:
    /// fit error 4e-9, f32 evaluation within 2.6 ulp). No division: an
    /// AVX-512 `vdivps` costs about twenty FMAs' issue slots on Intel, and
    /// the [11/8] rational this replaces (within 4 ulp) spent most of gelu's
    /// time on it. Centring the variable keeps Horner's terms from
    /// cancelling (in `x^2` itself the f32 error was 28 ulp). Beyond 2.5,
    /// `1 - erfc` with erfc a degree-9 polynomial in `min(|x|, 4) - 3.25`
    /// (error 2e-10, in a cold block), so `1 + erf(x)` stays accurate in the
    /// tail that gelu depends on.
    pub(crate) fn erf_f32(&mut self, x: Value) -> Value {
        let x2 = self.b.ins().fmul(x, x);
        let centre = self.fc(ERF_CENTRE);
        let u = self.b.ins().fsub(x2, centre);
        let p = self.horner(u, &ERF_POLY);
        let r = self.b.ins().fmul(p, x);
        let ax = self.fabs(x);
        let lim = self.fc(2.5);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, ax, lim);
        self.rare(big, r, |em| {
            let four = em.fc(4.0);
            let a = em.sel(FloatCC::LessThan, four, ax, four, ax);
            let mid = em.fc(3.25);
            let t = em.b.ins().fsub(a, mid);
            let p = em.horner(
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
            let one = em.fc(1.0);
            let e = em.b.ins().fsub(one, p);
            em.with_sign_of(e, x)
        })
    }
}

/// erf(x) / x on |x| <= 2.5 is `P(x^2 - ERF_CENTRE)` (see `erf_f32`); the
/// wide helpers evaluate the same polynomial in the same order.
pub(crate) const ERF_CENTRE: f32 = 3.125;

/// P's coefficients, highest degree first.
pub(crate) const ERF_POLY: [f32; 12] = [
    -8.046684152329675e-11,
    1.0529733751596382e-09,
    -1.0041574682873033e-08,
    1.0387972082526176e-07,
    -1.0082603694172576e-06,
    8.699417776369955e-06,
    -6.718514487147331e-05,
    0.000462781434180215,
    -0.002833280013874173,
    0.015582581982016563,
    -0.08145319670438766,
    0.5586599707603455,
];
