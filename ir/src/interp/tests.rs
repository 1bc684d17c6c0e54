//! The interpreter's scalar semantics against reference values and IEEE rules.

use super::*;
use crate::scalar::{lower_binary, lower_unary};
use crate::{BinaryOp, Float, UnaryOp};
use DType::*;

fn un(op: UnaryOp, x: f64, dt: DType) -> f64 {
    let v = Interp.constant(x, dt);
    lower_unary(&mut Interp, op, v, dt).as_f64()
}
fn bin(op: BinaryOp, a: f64, b: f64, dt: DType) -> f64 {
    let (x, y) = (Interp.constant(a, dt), Interp.constant(b, dt));
    lower_binary(&mut Interp, op, x, y, dt).as_f64()
}

/// IEEE 754-2019 maximum / minimum: NaN-propagating, -0 below +0.
fn ieee_max(a: f64, b: f64) -> f64 {
    match (a.is_nan() || b.is_nan(), a == b) {
        (true, _) => f64::NAN,
        (false, true) => {
            if a.is_sign_positive() {
                a
            } else {
                b
            }
        }
        _ => a.max(b),
    }
}
fn ieee_min(a: f64, b: f64) -> f64 {
    -ieee_max(-a, -b)
}

/// The clamps, written as compares and selects, keep the NaN-propagating
/// maximum's and minimum's bits: NaN in, NaN out; signed zeros at zero
/// bounds; a NaN bound; and hardswish/hardsigmoid built on them.
#[test]
fn clamps_keep_nan_and_signed_zeros() {
    let xs = [
        -0.0,
        0.0,
        f64::NAN,
        f64::NEG_INFINITY,
        f64::INFINITY,
        -3.0,
        3.0,
        7.0,
        -1.5,
        6.0,
    ];
    let bounds = [
        (0.0, 6.0),
        (-0.0, 0.0),
        (-1.0, -0.0),
        (0.0, -0.0),
        (f64::NEG_INFINITY, 0.0),
        (f64::NAN, 1.0),
        (2.0, f64::NAN),
    ];
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for dt in [F32, F64] {
        for &(lo, hi) in &bounds {
            for &x in &xs {
                let got = un(
                    UnaryOp::Clamp {
                        min: Float(lo),
                        max: Float(hi),
                    },
                    x,
                    dt,
                );
                let want = ieee_min(ieee_max(x, lo), hi);
                assert!(
                    same(got, want),
                    "clamp({x}, {lo}, {hi}) {dt}: {got} vs {want}"
                );
            }
        }
        for &x in &xs {
            let r = ieee_min(ieee_max(x + 3.0, 0.0), 6.0);
            let got = un(UnaryOp::Hardswish, x, dt);
            assert!(same(got, x * r / 6.0), "hardswish({x}) {dt}: {got}");
            let got = un(UnaryOp::Hardsigmoid, x, dt);
            assert!(same(got, r / 6.0), "hardsigmoid({x}) {dt}: {got}");
        }
    }
}

#[test]
fn erf_values() {
    // Reference values (Abramowitz & Stegun / mpmath).
    let cases = [
        (0.0, 0.0),
        (1e-30, 1.1283791670955126e-30),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.5, 0.9661051464753108),
        (2.0, 0.9953222650189527),
        (3.0, 0.9999779095030014),
        (5.0, 0.9999999999984626),
        (7.0, 1.0),
    ];
    for (x, want) in cases {
        for s in [1.0, -1.0] {
            let got = erf(s * x);
            assert!(
                (got - s * want).abs() <= 2e-16 * want.abs().max(1e-300),
                "erf({}) = {got}",
                s * x
            );
        }
    }
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erf(f64::NEG_INFINITY), -1.0);
    assert!(erf(f64::NAN).is_nan());
    assert!(erf(-0.0).is_sign_negative());
}

#[test]
fn erf_matches_series() {
    // erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)) for moderate x.
    for i in 0..=200 {
        let x = -2.0 + 4.0 * i as f64 / 200.0;
        let mut term = x;
        let mut sum = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        let want = sum * 2.0 / std::f64::consts::PI.sqrt();
        assert!((erf(x) - want).abs() < 1e-15, "x={x}");
    }
}

#[test]
fn integer_wrapping() {
    assert_eq!(bin(BinaryOp::Add, 200.0, 100.0, U8), 44.0);
    assert_eq!(bin(BinaryOp::Sub, 0.0, 1.0, U8), 255.0);
    assert_eq!(bin(BinaryOp::Mul, 100.0, 3.0, I8), 44.0);
    assert_eq!(bin(BinaryOp::Add, 127.0, 1.0, I8), -128.0);
    assert_eq!(
        bin(BinaryOp::Add, i32::MAX as f64, 1.0, I32),
        i32::MIN as f64
    );
    assert_eq!(bin(BinaryOp::Div, 7.0, 0.0, I32), 0.0);
    assert_eq!(bin(BinaryOp::Fmod, 7.0, 0.0, I64), 0.0);
    assert_eq!(bin(BinaryOp::Div, -7.0, 2.0, I64), -3.0);
    assert_eq!(bin(BinaryOp::FloorDiv, -7.0, 2.0, I64), -4.0);
    assert_eq!(bin(BinaryOp::Remainder, -7.0, 3.0, I64), 2.0);
    assert_eq!(bin(BinaryOp::Remainder, 7.0, -3.0, I32), -2.0);
    assert_eq!(bin(BinaryOp::Fmod, -7.0, 3.0, I64), -1.0);
    assert_eq!(bin(BinaryOp::Pow, 3.0, 4.0, I64), 81.0);
    assert_eq!(bin(BinaryOp::Pow, 2.0, 9.0, U8), 0.0);
    assert_eq!(bin(BinaryOp::Pow, 2.0, -1.0, I64), 0.0);
    assert_eq!(bin(BinaryOp::Maximum, 200.0, 100.0, U8), 200.0);
    assert_eq!(un(UnaryOp::Neg, -128.0, I8), -128.0);
    assert_eq!(un(UnaryOp::Abs, -5.0, I16), 5.0);
    let m = Interp.constant(i64::MIN as f64, I64);
    let n1 = Interp.constant(-1.0, I64);
    assert_eq!(Interp.binary(Prim2::Div, m, n1, I64), Val::I(i64::MIN));
    assert_eq!(Interp.binary(Prim2::Fmod, m, n1, I64), Val::I(0));
}

#[test]
fn float_rounding_f32() {
    // 0.1 + 0.2 in f32 arithmetic
    let want = 0.1f32 + 0.2f32;
    assert_eq!(bin(BinaryOp::Add, 0.1, 0.2, F32), want as f64);
    assert_eq!(bin(BinaryOp::Div, 1.0, 3.0, F32), (1.0f32 / 3.0) as f64);
    assert_eq!(un(UnaryOp::Exp, 1.0, F32), std::f32::consts::E as f64);
    assert_eq!(un(UnaryOp::Exp, 100.0, F32), f64::INFINITY);
    assert_eq!(un(UnaryOp::Exp, 100.0, F64), 100f64.exp());
    assert_eq!(bin(BinaryOp::Mul, 1e30, 1e30, F32), f64::INFINITY);
}

#[test]
fn nan_semantics() {
    let nan = f64::NAN;
    assert!(un(UnaryOp::Relu, nan, F32).is_nan());
    assert_eq!(un(UnaryOp::Relu, -2.0, F32), 0.0);
    assert!(bin(BinaryOp::Maximum, nan, 1.0, F32).is_nan());
    assert!(bin(BinaryOp::Minimum, 1.0, nan, F64).is_nan());
    assert_eq!(
        bin(BinaryOp::Maximum, -0.0, 0.0, F32).to_bits(),
        0.0f64.to_bits()
    );
    assert_eq!(
        bin(BinaryOp::Minimum, 0.0, -0.0, F32).to_bits(),
        (-0.0f64).to_bits()
    );
    assert_eq!(bin(BinaryOp::Lt, nan, 1.0, F32), 0.0);
    assert_eq!(bin(BinaryOp::Ne, nan, nan, F32), 1.0);
    assert!(un(UnaryOp::Sigmoid, nan, F32).is_nan());
    assert_eq!(un(UnaryOp::Sigmoid, -1000.0, F32), 0.0);
    assert_eq!(un(UnaryOp::Sigmoid, 1000.0, F32), 1.0);
    assert!(un(UnaryOp::Log, -1.0, F32).is_nan());
    assert_eq!(un(UnaryOp::Log, 0.0, F32), f64::NEG_INFINITY);
}

#[test]
fn composites() {
    let g = un(UnaryOp::Gelu, 1.0, F64);
    assert!((g - 0.8413447460685429).abs() < 1e-15);
    let gt = un(UnaryOp::GeluTanh, 1.0, F64);
    assert!((gt - 0.8411919906082768).abs() < 1e-15);
    let sp = UnaryOp::Softplus {
        beta: Float(1.0),
        threshold: Float(20.0),
    };
    assert!((un(sp, 0.0, F64) - 2f64.ln()).abs() < 1e-15);
    assert_eq!(un(sp, 30.0, F64), 30.0);
    let elu = UnaryOp::Elu { alpha: Float(1.0) };
    assert!((un(elu, -1.0, F64) - (-1f64).exp_m1()).abs() < 1e-15);
    assert_eq!(bin(BinaryOp::Remainder, -7.5, 2.0, F64), 0.5);
    assert_eq!(bin(BinaryOp::FloorDiv, -7.5, 2.0, F64), -4.0);
    assert_eq!(bin(BinaryOp::FloorDiv, 7.5, -2.0, F32), -4.0);
    // torch.floor_divide of floats by zero is IEEE a / b, not nan
    assert_eq!(bin(BinaryOp::FloorDiv, 1.0, 0.0, F32), f64::INFINITY);
    assert_eq!(bin(BinaryOp::FloorDiv, -1.0, 0.0, F64), f64::NEG_INFINITY);
    assert_eq!(bin(BinaryOp::FloorDiv, 3.0, -0.0, F32), f64::NEG_INFINITY);
    assert!(bin(BinaryOp::FloorDiv, 0.0, 0.0, F32).is_nan());
    // a zero quotient takes a / b's sign, as torch's copysign(0, a / b)
    assert!(bin(BinaryOp::FloorDiv, -0.0, 2.0, F32).is_sign_negative());
    assert!(bin(BinaryOp::FloorDiv, -0.0, -2.0, F64).is_sign_positive());
    // found by the differential test: in f32, (a - fmod(a, b)) / b is
    // -30.000002 here, one ulp below the integer; floor alone gave -32
    let (a, b) = (-44.88129425048828f32 as f64, 1.4892146587371826f32 as f64);
    assert_eq!(bin(BinaryOp::FloorDiv, a, b, F32), -31.0);
    assert_eq!(bin(BinaryOp::FloorDiv, a, b, F64), -31.0);
}

#[test]
fn casts() {
    let c = |x: Val, f: DType, t: DType| Interp.cast(x, f, t);
    assert_eq!(c(Val::F(-2.7), F32, I32), Val::I(-2));
    assert_eq!(c(Val::F(300.0), F32, U8), Val::I(44));
    assert_eq!(c(Val::F(-1.0), F64, U8), Val::I(255));
    assert_eq!(c(Val::F(f64::NAN), F32, I64), Val::I(0));
    assert_eq!(c(Val::F(1e30), F32, I64), Val::I(i64::MAX));
    assert_eq!(c(Val::F(f64::NAN), F32, Bool), Val::I(1));
    assert_eq!(c(Val::F(-0.0), F32, Bool), Val::I(0));
    assert_eq!(c(Val::I(257), I64, U8), Val::I(1));
    assert_eq!(c(Val::I(-1), I8, U8), Val::I(255));
    assert_eq!(c(Val::I(255), U8, I8), Val::I(-1));
    assert_eq!(c(Val::I(16777217), I64, F32), Val::F(16777216.0));
    assert_eq!(c(Val::F(0.1), F64, F32), Val::F(0.1f32 as f64));
    assert_eq!(c(Val::I(1), Bool, F64), Val::F(1.0));
}

#[test]
fn bytes_roundtrip() {
    for dt in DType::ALL {
        let mut b = [0u8; 8];
        let v = if dt.is_float() {
            Val::F(1.5)
        } else {
            Val::I(1)
        };
        v.write_le_bytes(dt, &mut b);
        assert_eq!(Val::from_le_bytes(&b, dt), v, "{dt}");
    }
    assert_eq!(
        Val::from_arg_bits(0.1f64.to_bits(), F32),
        Val::F(0.1f32 as f64)
    );
    assert_eq!(Val::from_arg_bits((-1i64) as u64, U8), Val::I(255));
}
