//! f16 and bf16 in CUDA C without `cuda_fp16.h` (NVRTC from PyPI ships no
//! headers, and the CPU shim has none either).
//!
//! - In memory a half is its 16 bits, `unsigned short` ([`super::c_storage_type`]).
//! - As a value it is a `float` holding a number the half type represents:
//!   loads widen exactly, arithmetic happens in float, and every result of
//!   dtype f16/bf16 (a primitive computed "in f16", a cast to f16) is rounded
//!   to the half type and widened back — as the reference interpreter rounds
//!   after every primitive. A load or rounding keeps the bits it came from
//!   ([`CudaC::half_bits`]) so storing the value again costs no conversion.
//! - Rounding is to nearest, ties to even, as crate `half` and PyTorch round;
//!   NaN stays a (quiet) NaN, overflow gives inf, subnormals are kept.
//!
//! The helpers are plain C bit manipulation, so the shim runs exactly what
//! the fallback computes; on the GPU the f32 conversions are single PTX `cvt`
//! instructions instead (same results). f64 rounds to f32 first, then to the
//! half type, as PyTorch (`c10::Half(float)`), the runtime's `convert` and
//! the interpreter (`kiln_ir::interp::round_to`) do.

use super::scalar::Helper;
use super::{CudaC, Cv};
use kiln_ir::DType;

/// `kiln_f16_to_f32(unsigned short)` and `kiln_f32_to_f16(float)`.
pub(crate) const F16: &str =
    "// f16 <-> f32, the f16 as its bits: round to nearest even, NaN stays NaN,
// overflow gives inf, subnormals are kept.
__device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
  float f;
  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));
  return f;
#else
  const unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
  const unsigned int ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (ex == 0x1fu) return __int_as_float((int)(sign | 0x7f800000u | (man << 13)));
  if (ex != 0u) return __int_as_float((int)(sign | ((ex + 112u) << 23) | (man << 13)));
  // zero or subnormal: man * 2^-24, exact in f32
  const float f = (float)man * 5.9604644775390625e-8f;
  return sign ? -f : f;
#endif
}
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
  unsigned short h;
  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));
  return h;
#else
  const unsigned int x = (unsigned int)__float_as_int(f);
  const unsigned int sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a & 0x7fffffu) >> 13));
  // 65520 and above (half way from the largest f16 to 2^16) round to inf
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // normal: rebias the exponent (127 - 15), round off 13 bits; a carry bumps the exponent
    const unsigned int r = a - 0x38000000u;
    return (unsigned short)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // 2^-25 and below round to zero (2^-25 itself is a tie with the even 0)
  if (a <= 0x33000000u) return (unsigned short)sign;
  // subnormal: the 24-bit significand in units of 2^-24, shifted by 14..24 bits
  const unsigned int s = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
  const unsigned int q = m >> s, rem = m & ((1u << s) - 1u), tie = 1u << (s - 1u);
  return (unsigned short)(sign | (q + (rem > tie || (rem == tie && (q & 1u)))));
#endif
}
";

/// `kiln_bf16_to_f32(unsigned short)` and `kiln_f32_to_bf16(float)`.
pub(crate) const BF16: &str =
    "// bf16 <-> f32, the bf16 as its bits (the top half of an f32): round to
// nearest even, NaN stays a quiet NaN, overflow gives inf.
__device__ __forceinline__ float kiln_bf16_to_f32(unsigned short b) {
  return __int_as_float((int)((unsigned int)b << 16));
}
__device__ __forceinline__ unsigned short kiln_f32_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short h;
  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));
  return h;
#else
  const unsigned int x = (unsigned int)__float_as_int(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}
";

/// `f16` or `bf16`: the helpers' infix for the half dtype `dt`.
fn infix(dt: DType) -> &'static str {
    match dt {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => unreachable!("{dt} is not a half dtype"),
    }
}

impl CudaC {
    fn need_half(&mut self, dt: DType) {
        self.helpers.insert(if dt == DType::F16 {
            Helper::F16
        } else {
            Helper::BF16
        });
    }

    /// The value a half load gives: `elem` (an lvalue of `unsigned short`,
    /// e.g. `p1[o1]`) read once and widened to float.
    pub(crate) fn load_half(&mut self, elem: &str, dt: DType) -> Cv {
        let b = self.tmp_c("unsigned short", elem.to_string());
        self.widen_half(b, dt)
    }

    /// The float held by the bits `b` of half dtype `dt` (remembering `b`).
    fn widen_half(&mut self, b: Cv, dt: DType) -> Cv {
        self.need_half(dt);
        let e = format!("kiln_{}_to_f32({})", infix(dt), self.name(b));
        let v = self.tmp(dt, e);
        self.half_bits.insert(v, b);
        v
    }

    /// `x` (of dtype `from`) rounded to the half dtype `to`, as a float.
    pub(crate) fn round_half(&mut self, x: Cv, from: DType, to: DType) -> Cv {
        let bits = self.half_bits_expr(x, from, to);
        let b = self.tmp_c("unsigned short", bits);
        self.widen_half(b, to)
    }

    /// A C expression for the bits of `x` (of dtype `from`) rounded to the
    /// half dtype `to`: the remembered bits when `x` already is such a half.
    pub(crate) fn half_bits_expr(&mut self, x: Cv, from: DType, to: DType) -> String {
        if from == to {
            if let Some(&b) = self.half_bits.get(&x) {
                return self.name(b).to_string();
            }
        }
        self.need_half(to);
        let (h, a) = (infix(to), self.name(x).to_string());
        // f64 via f32 (rounding twice, as PyTorch does); i64 as the interpreter's `i as f64`
        let a = match from {
            DType::F32 | DType::F16 | DType::BF16 => a,
            DType::I64 => format!("(float)(double){a}"),
            _ => format!("(float){a}"),
        };
        format!("kiln_f32_to_{h}({a})")
    }
}
