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
//! - tanh: Eigen's [13/6] rational fit on [-7.905, 7.905] (±1 outside);
//! - erf: Eigen/XLA's [13/8] rational fit on [-4, 4] (within 4.4e-7).

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
        let c = self.b.ins().f32const(v);
        if self.lanes == 1 {
            c
        } else {
            self.b.ins().splat(types::F32X4, c)
        }
    }

    /// An i32 constant (splatted in vector mode).
    fn ic(&mut self, v: i32) -> Value {
        let c = self.b.ins().iconst(types::I32, v as u32 as i64);
        if self.lanes == 1 {
            c
        } else {
            self.b.ins().splat(types::I32X4, c)
        }
    }

    fn to_bits(&mut self, x: Value) -> Value {
        let t = self.ity();
        self.b.ins().bitcast(t, MemFlagsData::new(), x)
    }

    fn from_bits(&mut self, x: Value) -> Value {
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
        self.from_bits(bits)
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
            &[1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1],
        );
        let r2 = self.b.ins().fmul(r, r);
        let y = self.fma(p, r2, r);
        let one = self.fc(1.0);
        let y = self.b.ins().fadd(y, one);
        // n as an integer: the low mantissa bits of t
        let tb = self.to_bits(t);
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
        let bits = self.to_bits(x);
        let sh = self.b.ins().iconst(types::I32, 23);
        let ei = self.b.ins().ushr(bits, sh);
        let b126 = self.ic(126);
        let ei = self.b.ins().isub(ei, b126);
        let e = self.b.ins().fcvt_from_sint(self.fty(), ei);
        let e = self.b.ins().fsub(e, eadj);
        let mmask = self.ic(0x007f_ffff);
        let half = self.ic(0x3f00_0000);
        let mb = self.b.ins().band(bits, mmask);
        let mb = self.b.ins().bor(mb, half);
        let m = self.from_bits(mb); // [0.5, 1)
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
        let ax = self.b.ins().fabs(x);
        let lim = self.fc(0.5);
        self.sel(FloatCC::LessThan, ax, lim, small, big)
    }

    pub(crate) fn tanh_f32(&mut self, x: Value) -> Value {
        let x = self.clamp(x, -7.905_311_107_635_498, 7.905_311_107_635_498);
        let x2 = self.b.ins().fmul(x, x);
        let p = self.horner(
            x2,
            &[
                -2.76076847742355e-16,
                2.00018790482477e-13,
                -8.60467152213735e-11,
                5.12229709037114e-08,
                1.48572235717979e-05,
                6.37261928875436e-04,
                4.89352455891786e-03,
            ],
        );
        let p = self.b.ins().fmul(p, x);
        let q = self.horner(x2, &[1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03]);
        self.b.ins().fdiv(p, q)
    }

    pub(crate) fn erf_f32(&mut self, x: Value) -> Value {
        let x = self.clamp(x, -4.0, 4.0);
        let x2 = self.b.ins().fmul(x, x);
        let p = self.horner(
            x2,
            &[
                -2.72614225801306e-10,
                2.77068142495902e-08,
                -2.10102402082508e-06,
                -5.69250639462346e-05,
                -7.34990630326855e-04,
                -2.95459980854025e-03,
                -1.60960333262415e-02,
            ],
        );
        let p = self.b.ins().fmul(p, x);
        let q = self.horner(
            x2,
            &[-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02],
        );
        self.b.ins().fdiv(p, q)
    }
}
