//! The reference scalar interpreter: [`Interp`] implements [`ScalarOps`] on
//! plain Rust values ([`Val`]), so [`crate::scalar::lower_unary`] /
//! [`crate::scalar::lower_binary`] give every op its reference meaning. It is
//! the oracle the code generators are tested against, and it serves constant
//! folding.
//!
//! Conventions (the code generators follow them exactly):
//! - floats are carried as `f64`; an f32 (f16, bf16) result is rounded to its
//!   dtype after every primitive, so f32 arithmetic is IEEE f32 arithmetic;
//!   transcendentals are the correctly rounded-ish f64 functions of std (and
//!   [`erf`]) rounded to f32;
//! - integers are carried as `i64` holding the value of the dtype (u8 is
//!   0..=255, bool is 0/1) and wrap to the dtype's width (`u8 200 + 100 = 44`);
//! - integer `x / 0` and `x % 0` are 0 (never a trap), `i64::MIN / -1` wraps;
//! - Max/Min propagate NaN; `max(-0, +0) = +0`, `min(-0, +0) = -0`;
//! - float -> int truncates toward zero, saturating to the i64 range (NaN -> 0),
//!   then wraps to the target width; int narrowing wraps; `to bool` is `!= 0`
//!   (NaN is true).

#![allow(clippy::excessive_precision)]

use crate::scalar::{Cmp, Prim1, Prim2, ScalarOps};
use crate::DType;

/// A scalar value: a float (any float dtype) or an integer/bool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val {
    F(f64),
    I(i64),
}

impl Val {
    /// The value as an f64 (integers convert exactly up to 2^53).
    pub fn as_f64(self) -> f64 {
        match self {
            Val::F(x) => x,
            Val::I(i) => i as f64,
        }
    }

    /// The value as an i64 (floats truncate toward zero, saturating; NaN is 0).
    pub fn as_i64(self) -> i64 {
        match self {
            Val::F(x) => x as i64,
            Val::I(i) => i,
        }
    }

    /// Truthiness: `!= 0` (NaN is true).
    pub fn is_true(self) -> bool {
        match self {
            Val::F(x) => x != 0.0,
            Val::I(i) => i != 0,
        }
    }

    /// Whether the value is a float NaN.
    pub fn is_nan(self) -> bool {
        matches!(self, Val::F(x) if x.is_nan())
    }

    /// Reads one element of dtype `dt` from little-endian bytes (`bytes.len() >= dt.size()`).
    pub fn from_le_bytes(bytes: &[u8], dt: DType) -> Val {
        let mut b = [0u8; 8];
        b[..dt.size()].copy_from_slice(&bytes[..dt.size()]);
        match dt {
            DType::Bool => Val::I((b[0] != 0) as i64),
            DType::U8 => Val::I(b[0] as i64),
            DType::I8 => Val::I(b[0] as i8 as i64),
            DType::I16 => Val::I(i16::from_le_bytes([b[0], b[1]]) as i64),
            DType::I32 => Val::I(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
            DType::I64 => Val::I(i64::from_le_bytes(b)),
            DType::F16 => Val::F(half::f16::from_le_bytes([b[0], b[1]]).to_f64()),
            DType::BF16 => Val::F(half::bf16::from_le_bytes([b[0], b[1]]).to_f64()),
            DType::F32 => Val::F(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
            DType::F64 => Val::F(f64::from_le_bytes(b)),
        }
    }

    /// Writes the value as one element of dtype `dt` (converting with [`Interp`]'s cast rules).
    pub fn write_le_bytes(self, dt: DType, out: &mut [u8]) {
        let v = match self {
            Val::F(_) => Interp.cast(self, DType::F64, dt),
            Val::I(_) => Interp.cast(self, DType::I64, dt),
        };
        let n = dt.size();
        match (dt, v) {
            // `v` is already rounded to `dt` (by the cast above)
            (DType::F16, v) => {
                out[..n].copy_from_slice(&half::f16::from_f32(v.as_f64() as f32).to_le_bytes())
            }
            (DType::BF16, v) => {
                out[..n].copy_from_slice(&half::bf16::from_f32(v.as_f64() as f32).to_le_bytes())
            }
            (DType::F32, v) => out[..n].copy_from_slice(&(v.as_f64() as f32).to_le_bytes()),
            (DType::F64, v) => out[..n].copy_from_slice(&v.as_f64().to_le_bytes()),
            (_, v) => out[..n].copy_from_slice(&v.as_i64().to_le_bytes()[..n]),
        }
    }

    /// Decodes a kernel scalar argument (8 bytes: an f64 for float dtypes, an i64 otherwise)
    /// into a value of dtype `dt`.
    pub fn from_arg_bits(bits: u64, dt: DType) -> Val {
        if dt.is_float() {
            Interp.cast(Val::F(f64::from_bits(bits)), DType::F64, dt)
        } else {
            Interp.cast(Val::I(bits as i64), DType::I64, dt)
        }
    }

    /// Encodes a value of dtype `dt` as a kernel scalar argument.
    pub fn to_arg_bits(self, dt: DType) -> u64 {
        if dt.is_float() {
            self.as_f64().to_bits()
        } else {
            self.as_i64() as u64
        }
    }
}

/// Wraps an integer to the width of `dt` (u8: 0..=255, bool: 0/1 as `!= 0`).
pub fn wrap(v: i64, dt: DType) -> i64 {
    match dt {
        DType::Bool => (v != 0) as i64,
        DType::U8 => v as u8 as i64,
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        _ => v,
    }
}

/// Rounds an f64 to the precision of the float dtype `dt` (identity for f64).
/// f16 and bf16 round the f32 nearest `v` (twice rounded, as PyTorch's
/// `c10::Half(float)` and the runtime's `convert`): crate `half`'s own f64
/// conversion differs by machine (through f32 with F16C, else it ignores the
/// low 32 bits of the f64 mantissa).
pub fn round_to(v: f64, dt: DType) -> f64 {
    match dt {
        DType::F32 => v as f32 as f64,
        DType::F16 => half::f16::from_f32(v as f32).to_f64(),
        DType::BF16 => half::bf16::from_f32(v as f32).to_f64(),
        _ => v,
    }
}

/// Wrapping integer power; negative exponents give `1/a^|b|` truncated (0 unless |a| = 1).
pub fn ipow(a: i64, b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 => {
                if b & 1 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut e, mut r) = (a, b as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    r
}

/// NaN-propagating maximum; `max(-0, +0) = +0`.
pub fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        f64::from_bits(a.to_bits() & b.to_bits())
    } else if a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum; `min(-0, +0) = -0`.
pub fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        f64::from_bits(a.to_bits() | b.to_bits())
    } else if a < b {
        a
    } else {
        b
    }
}

/// Evaluates a unary op on a value of compute dtype `dt` (for constant folding).
pub fn eval_unary(op: crate::UnaryOp, x: Val, dt: DType) -> Val {
    crate::scalar::lower_unary(&mut Interp, op, x, dt)
}

/// Evaluates a binary op on values of compute dtype `dt` (comparisons give bool 0/1).
pub fn eval_binary(op: crate::BinaryOp, a: Val, b: Val, dt: DType) -> Val {
    crate::scalar::lower_binary(&mut Interp, op, a, b, dt)
}

/// The reference interpreter (stateless).
#[derive(Debug, Default, Clone, Copy)]
pub struct Interp;

impl Interp {
    fn fval(v: f64, dt: DType) -> Val {
        Val::F(round_to(v, dt))
    }
}

fn x_f(i: i64) -> f64 {
    i as f64
}

impl ScalarOps for Interp {
    type V = Val;

    fn constant(&mut self, value: f64, dt: DType) -> Val {
        match dt.category() {
            crate::Category::Float => Interp::fval(value, dt),
            _ => Val::I(wrap(value as i64, dt)),
        }
    }

    fn unary(&mut self, op: Prim1, x: Val, dt: DType) -> Val {
        if let (Val::I(i), false) = (x, dt.is_float()) {
            match op {
                Prim1::Neg => return Val::I(wrap(i.wrapping_neg(), dt)),
                Prim1::Abs => return Val::I(wrap(i.wrapping_abs(), dt)),
                Prim1::Floor | Prim1::Ceil | Prim1::Trunc | Prim1::Round => return x,
                Prim1::Not => return Val::I((i == 0) as i64),
                // Float-only primitives on integers (not produced by valid kernels):
                // compute in f64 and convert back.
                _ => {
                    let r = self.unary(op, Val::F(i as f64), DType::F64);
                    return self.cast(r, DType::F64, dt);
                }
            }
        }
        let v = x.as_f64();
        let r = match op {
            Prim1::Neg => -v,
            Prim1::Abs => v.abs(),
            Prim1::Sqrt => v.sqrt(),
            Prim1::Floor => v.floor(),
            Prim1::Exp => v.exp(),
            Prim1::Log => v.ln(),
            Prim1::Log1p => v.ln_1p(),
            Prim1::Expm1 => v.exp_m1(),
            Prim1::Tanh => v.tanh(),
            Prim1::Erf => erf(v),
            Prim1::Sin => v.sin(),
            Prim1::Cos => v.cos(),
            Prim1::Not => return Val::I((v == 0.0) as i64),
            Prim1::Ceil => v.ceil(),
            Prim1::Trunc => v.trunc(),
            Prim1::Round => v.round_ties_even(),
            Prim1::Tan => v.tan(),
            Prim1::Asin => v.asin(),
            Prim1::Acos => v.acos(),
            Prim1::Atan => v.atan(),
            Prim1::Sinh => v.sinh(),
            Prim1::Cosh => v.cosh(),
        };
        Interp::fval(r, dt)
    }

    fn binary(&mut self, op: Prim2, a: Val, b: Val, dt: DType) -> Val {
        let bitwise = matches!(op, Prim2::And | Prim2::Or | Prim2::Xor);
        if bitwise && (dt == DType::Bool || dt.is_float()) {
            let r = match op {
                Prim2::And => a.is_true() && b.is_true(),
                Prim2::Or => a.is_true() || b.is_true(),
                _ => a.is_true() != b.is_true(),
            };
            return Val::I(r as i64);
        }
        if !dt.is_float() {
            let (x, y) = (a.as_i64(), b.as_i64());
            let r = match op {
                Prim2::Add => x.wrapping_add(y),
                Prim2::Sub => x.wrapping_sub(y),
                Prim2::Mul => x.wrapping_mul(y),
                Prim2::Div => {
                    if y == 0 {
                        0
                    } else {
                        x.wrapping_div(y)
                    }
                }
                Prim2::Fmod => {
                    if y == 0 {
                        0
                    } else {
                        x.wrapping_rem(y)
                    }
                }
                Prim2::Max => x.max(y),
                Prim2::Min => x.min(y),
                Prim2::Pow => ipow(x, y),
                Prim2::And => x & y,
                Prim2::Or => x | y,
                Prim2::Xor => x ^ y,
                // float-only primitives on integers: in f64, truncated back
                Prim2::Atan2 => x_f(x).atan2(x_f(y)) as i64,
                Prim2::Hypot => x_f(x).hypot(x_f(y)) as i64,
            };
            return Val::I(wrap(r, dt));
        }
        let (x, y) = (a.as_f64(), b.as_f64());
        let r = match op {
            Prim2::Add => x + y,
            Prim2::Sub => x - y,
            Prim2::Mul => x * y,
            Prim2::Div => x / y,
            Prim2::Max => fmax(x, y),
            Prim2::Min => fmin(x, y),
            Prim2::Pow => x.powf(y),
            Prim2::Fmod => x % y,
            Prim2::Atan2 => x.atan2(y),
            Prim2::Hypot => x.hypot(y),
            Prim2::And | Prim2::Or | Prim2::Xor => unreachable!("handled above"),
        };
        Interp::fval(r, dt)
    }

    fn compare(&mut self, op: Cmp, a: Val, b: Val, dt: DType) -> Val {
        let r = if dt.is_float() {
            let (x, y) = (a.as_f64(), b.as_f64());
            match op {
                Cmp::Eq => x == y,
                Cmp::Ne => x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
            }
        } else {
            let (x, y) = (a.as_i64(), b.as_i64());
            match op {
                Cmp::Eq => x == y,
                Cmp::Ne => x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
            }
        };
        Val::I(r as i64)
    }

    fn select(&mut self, cond: Val, a: Val, b: Val, _dt: DType) -> Val {
        if cond.is_true() {
            a
        } else {
            b
        }
    }

    fn cast(&mut self, x: Val, from: DType, to: DType) -> Val {
        let _ = from;
        if to == DType::Bool {
            return Val::I(x.is_true() as i64);
        }
        if to.is_float() {
            return match x {
                Val::F(v) => Interp::fval(v, to),
                // i64 -> f32 rounds once (as the hardware conversion does).
                Val::I(i) if to == DType::F32 => Val::F(i as f32 as f64),
                Val::I(i) => Interp::fval(i as f64, to),
            };
        }
        Val::I(wrap(x.as_i64(), to))
    }
}

/// erf in f64, from the `libm` crate (a port of FreeBSD's s_erf.c, < 1 ulp).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

#[cfg(test)]
mod tests;
