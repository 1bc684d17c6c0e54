//! [`ScalarOps`] for CUDA C: every primitive becomes one `const T tN = expr;`
//! line, so the generated text is a straight SSA listing like the KernelIR.
//!
//! Semantics follow the reference interpreter (`kiln_ir::interp::Interp`):
//!
//! - integer `+ - *` and negation wrap (computed on `unsigned long long`, so
//!   no signed overflow, then narrowed modulo 2^bits);
//! - integer division and remainder by zero give 0; `MIN / -1` wraps to `MIN`
//!   and `MIN % -1` is 0;
//! - float Max/Min propagate NaN through explicit `isnan` selects and order
//!   `-0 < +0` by bit operations (never `fmaxf`, whose NaN rule differs);
//! - float to int casts truncate toward zero saturating to i64 (NaN gives 0),
//!   then wrap to the target width — as Cranelift's `fcvt_to_sint_sat`. The
//!   one difference C allows: narrowing an i64 to a signed narrower type is
//!   implementation-defined in C++17; NVRTC (and gcc/clang) wrap modulo 2^bits;
//! - transcendental functions are CUDA's libdevice ones (`expf` within 2 ulp,
//!   `erff` within 2 ulp), not the CPU's, so compare with a tolerance. NVRTC
//!   also fuses `a * b + c` into FMA unless compiled with `--fmad=false`;
//! - f16/bf16 values are `float`s; a primitive or cast whose dtype is f16/bf16
//!   rounds its result to that type (to nearest even) and widens it back, as
//!   the interpreter rounds after every primitive (`half.rs`).

use kiln_ir::scalar::{Cmp, Prim1, Prim2, ScalarOps};
use kiln_ir::DType;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

/// A C value: an index into [`CudaC::names`] (a temporary `tN` or a named variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cv(pub(crate) u32);

/// Device helper functions, emitted before the kernel only when used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Helper {
    MaxMinF32,
    MaxMinF64,
    F2I,
    IPow,
    /// f16 <-> f32 ([`super::half::F16`]).
    F16,
    /// bf16 <-> f32 ([`super::half::BF16`]).
    BF16,
    /// `kiln_vec<T, N>`: N elements loaded or stored as one aligned access.
    Vec,
}

impl Helper {
    pub(crate) fn text(self) -> &'static str {
        match self {
            Helper::MaxMinF32 => {
                "__device__ __forceinline__ float kiln_max_f32(float a, float b) {
  if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
  if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));
  return a > b ? a : b;
}
__device__ __forceinline__ float kiln_min_f32(float a, float b) {
  if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
  if (a == b) return __int_as_float(__float_as_int(a) | __float_as_int(b));
  return a < b ? a : b;
}
"
            }
            Helper::MaxMinF64 => {
                "__device__ __forceinline__ double kiln_max_f64(double a, double b) {
  if (isnan(a) || isnan(b)) return __longlong_as_double(0x7ff8000000000000LL);
  if (a == b) return __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b));
  return a > b ? a : b;
}
__device__ __forceinline__ double kiln_min_f64(double a, double b) {
  if (isnan(a) || isnan(b)) return __longlong_as_double(0x7ff8000000000000LL);
  if (a == b) return __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b));
  return a < b ? a : b;
}
"
            }
            Helper::F2I => {
                "// float -> i64: truncate toward zero, saturate, NaN -> 0 (as fcvt_to_sint_sat).
__device__ __forceinline__ long long kiln_f2i(double x) {
  if (isnan(x)) return 0LL;
  if (x >= 9223372036854775807.0) return 9223372036854775807LL;
  if (x <= -9223372036854775808.0) return (-9223372036854775807LL - 1LL);
  return (long long)x;
}
"
            }
            Helper::IPow => {
                "// integer power with wrapping multiplication; negative exponents give 0 except for 1 and -1.
__device__ __forceinline__ long long kiln_ipow(long long a, long long b) {
  if (b < 0) return a == 1LL ? 1LL : (a == -1LL ? ((b & 1LL) ? -1LL : 1LL) : 0LL);
  unsigned long long base = (unsigned long long)a, r = 1ULL;
  unsigned long long e = (unsigned long long)b;
  while (e) {
    if (e & 1ULL) r *= base;
    base *= base;
    e >>= 1;
  }
  return (long long)r;
}
"
            }
            Helper::F16 => super::half::F16,
            Helper::BF16 => super::half::BF16,
            Helper::Vec => {
                "// N elements of T as one aligned struct, so that a copy of it is one vector access.
template <class T, int N> struct alignas(sizeof(T) * N) kiln_vec {
  T v[N];
};
"
            }
        }
    }
}

/// The C type of a value of dtype `dt`: f16 and bf16 values are `float`s
/// holding a number of the half type (see [`super::half`]).
pub fn c_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
    }
}

/// The C type of a dtype in memory: bool is one byte (read as `!= 0`), f16
/// and bf16 are their 16 bits (converted by the `kiln_*_to_*` helpers).
pub fn c_storage_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "unsigned char",
        DType::F16 | DType::BF16 => "unsigned short",
        _ => c_type(dt),
    }
}

/// A C literal for `v` in dtype `dt` (exact: Rust's shortest round-trip form;
/// an f16/bf16 literal is `v` rounded to that type, as a float).
pub fn c_literal(v: f64, dt: DType) -> String {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => {
            let f = kiln_ir::interp::round_to(v, dt) as f32;
            if f.is_finite() {
                format!("{f:?}f")
            } else {
                format!("__int_as_float(0x{:08x})", f.to_bits())
            }
        }
        DType::F64 => {
            if v.is_finite() {
                format!("{v:?}")
            } else {
                format!("__longlong_as_double(0x{:016x}LL)", v.to_bits())
            }
        }
        DType::Bool => (if v != 0.0 { "true" } else { "false" }).into(),
        _ => {
            let i = kiln_ir::interp::wrap(v as i64, dt);
            if i == i64::MIN {
                format!("(({})(-9223372036854775807LL - 1LL))", c_type(dt))
            } else {
                format!("(({}){i}LL)", c_type(dt))
            }
        }
    }
}

/// Emits C statements into `code`; see the module docs for the semantics.
#[derive(Debug, Default)]
pub struct CudaC {
    pub(crate) names: Vec<String>,
    pub(crate) code: String,
    pub(crate) indent: usize,
    pub(crate) helpers: BTreeSet<Helper>,
    /// The `unsigned short` bits a half value was widened from (loads and roundings).
    pub(crate) half_bits: HashMap<Cv, Cv>,
}

fn u64e(x: &str) -> String {
    format!("(unsigned long long)(long long){x}")
}

impl CudaC {
    pub(crate) fn name(&self, v: Cv) -> &str {
        &self.names[v.0 as usize]
    }

    /// A named variable (declared by the caller).
    pub(crate) fn named(&mut self, n: impl Into<String>) -> Cv {
        self.names.push(n.into());
        Cv(self.names.len() as u32 - 1)
    }

    pub(crate) fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.code.push_str("  ");
        }
        self.code.push_str(s);
        self.code.push('\n');
    }

    /// `const T tN = expr;`
    pub(crate) fn tmp(&mut self, dt: DType, expr: String) -> Cv {
        self.tmp_c(c_type(dt), expr)
    }

    /// `const ty tN = expr;` for any C type.
    pub(crate) fn tmp_c(&mut self, ty: &str, expr: String) -> Cv {
        let n = format!("t{}", self.names.len());
        let l = format!("const {ty} {n} = {expr};");
        self.line(&l);
        self.named(n)
    }

    /// `const T tN = expr;`, rounded to f16/bf16 when `dt` is one.
    fn result(&mut self, dt: DType, expr: String) -> Cv {
        if dt.is_half() {
            let r = self.tmp(DType::F32, expr);
            self.round_half(r, DType::F32, dt)
        } else {
            self.tmp(dt, expr)
        }
    }

    fn un_name(op: Prim1, dt: DType) -> &'static str {
        let f32 = dt != DType::F64;
        match (op, f32) {
            (Prim1::Sqrt, true) => "sqrtf",
            (Prim1::Sqrt, false) => "sqrt",
            (Prim1::Floor, true) => "floorf",
            (Prim1::Floor, false) => "floor",
            (Prim1::Exp, true) => "expf",
            (Prim1::Exp, false) => "exp",
            (Prim1::Log, true) => "logf",
            (Prim1::Log, false) => "log",
            (Prim1::Log1p, true) => "log1pf",
            (Prim1::Log1p, false) => "log1p",
            (Prim1::Expm1, true) => "expm1f",
            (Prim1::Expm1, false) => "expm1",
            (Prim1::Tanh, true) => "tanhf",
            (Prim1::Tanh, false) => "tanh",
            (Prim1::Erf, true) => "erff",
            (Prim1::Erf, false) => "erf",
            (Prim1::Sin, true) => "sinf",
            (Prim1::Sin, false) => "sin",
            (Prim1::Cos, true) => "cosf",
            (Prim1::Cos, false) => "cos",
            (Prim1::Abs, true) => "fabsf",
            (Prim1::Abs, false) => "fabs",
            (Prim1::Ceil, true) => "ceilf",
            (Prim1::Ceil, false) => "ceil",
            (Prim1::Trunc, true) => "truncf",
            (Prim1::Trunc, false) => "trunc",
            (Prim1::Round, true) => "rintf",
            (Prim1::Round, false) => "rint",
            (Prim1::Tan, true) => "tanf",
            (Prim1::Tan, false) => "tan",
            (Prim1::Asin, true) => "asinf",
            (Prim1::Asin, false) => "asin",
            (Prim1::Acos, true) => "acosf",
            (Prim1::Acos, false) => "acos",
            (Prim1::Atan, true) => "atanf",
            (Prim1::Atan, false) => "atan",
            (Prim1::Sinh, true) => "sinhf",
            (Prim1::Sinh, false) => "sinh",
            (Prim1::Cosh, true) => "coshf",
            (Prim1::Cosh, false) => "cosh",
            (Prim1::Neg | Prim1::Not, _) => unreachable!("handled inline"),
        }
    }
}

impl ScalarOps for CudaC {
    type V = Cv;

    fn constant(&mut self, value: f64, dt: DType) -> Cv {
        let lit = c_literal(value, dt);
        self.tmp(dt, lit)
    }

    fn unary(&mut self, op: Prim1, x: Cv, dt: DType) -> Cv {
        let a = self.name(x).to_string();
        let t = c_type(dt);
        if op == Prim1::Not {
            let e = if dt == DType::Bool {
                format!("!{a}")
            } else {
                format!("({t})({a} == 0)")
            };
            return self.tmp(dt, e);
        }
        if dt.is_float() {
            let e = match op {
                Prim1::Neg => format!("-{a}"),
                _ => format!("{}({a})", Self::un_name(op, dt)),
            };
            return self.result(dt, e);
        }
        match op {
            Prim1::Neg => self.tmp(dt, format!("({t})(0ULL - {})", u64e(&a))),
            Prim1::Abs => self.tmp(dt, format!("({a} < 0) ? ({t})(0ULL - {}) : {a}", u64e(&a))),
            Prim1::Floor | Prim1::Ceil | Prim1::Trunc | Prim1::Round => x,
            // Float-only primitives on integers: compute in f64 and convert back.
            _ => {
                let d = self.cast(x, dt, DType::F64);
                let r = self.unary(op, d, DType::F64);
                self.cast(r, DType::F64, dt)
            }
        }
    }

    fn binary(&mut self, op: Prim2, x: Cv, y: Cv, dt: DType) -> Cv {
        let (a, b) = (self.name(x).to_string(), self.name(y).to_string());
        let t = c_type(dt);
        if matches!(op, Prim2::And | Prim2::Or | Prim2::Xor) {
            // logical on bools (and floats), bitwise on integers
            if dt == DType::Bool || dt.is_float() {
                let o = match op {
                    Prim2::And => "&&",
                    Prim2::Or => "||",
                    _ => "!=",
                };
                return self.tmp(dt, format!("({t})(({a} != 0) {o} ({b} != 0))"));
            }
            let o = match op {
                Prim2::And => "&",
                Prim2::Or => "|",
                _ => "^",
            };
            return self.tmp(dt, format!("({t})({a} {o} {b})"));
        }
        if dt.is_float() {
            let f32 = dt != DType::F64;
            let sfx = if f32 { "f32" } else { "f64" };
            let e = match op {
                Prim2::Add => format!("{a} + {b}"),
                Prim2::Sub => format!("{a} - {b}"),
                Prim2::Mul => format!("{a} * {b}"),
                Prim2::Div => format!("{a} / {b}"),
                Prim2::Max | Prim2::Min => {
                    self.helpers.insert(if f32 {
                        Helper::MaxMinF32
                    } else {
                        Helper::MaxMinF64
                    });
                    let m = if op == Prim2::Max { "max" } else { "min" };
                    format!("kiln_{m}_{sfx}({a}, {b})")
                }
                Prim2::Pow => format!("{}({a}, {b})", if f32 { "powf" } else { "pow" }),
                Prim2::Fmod => format!("{}({a}, {b})", if f32 { "fmodf" } else { "fmod" }),
                Prim2::Atan2 => format!("{}({a}, {b})", if f32 { "atan2f" } else { "atan2" }),
                Prim2::Hypot => format!("{}({a}, {b})", if f32 { "hypotf" } else { "hypot" }),
                Prim2::And | Prim2::Or | Prim2::Xor => unreachable!(),
            };
            return self.result(dt, e);
        }
        let signed = !matches!(dt, DType::U8 | DType::Bool);
        let e = match op {
            Prim2::Add | Prim2::Sub | Prim2::Mul => {
                let o = match op {
                    Prim2::Add => "+",
                    Prim2::Sub => "-",
                    _ => "*",
                };
                format!("({t})({} {o} {})", u64e(&a), u64e(&b))
            }
            Prim2::Div if signed => format!(
                "({b} == 0) ? ({t})0 : (({b} == ({t})-1) ? ({t})(0ULL - {}) : ({t})({a} / {b}))",
                u64e(&a)
            ),
            Prim2::Fmod if signed => {
                format!("({b} == 0 || {b} == ({t})-1) ? ({t})0 : ({t})({a} % {b})")
            }
            Prim2::Div => format!("({b} == 0) ? ({t})0 : ({t})({a} / {b})"),
            Prim2::Fmod => format!("({b} == 0) ? ({t})0 : ({t})({a} % {b})"),
            Prim2::Max => format!("({a} > {b}) ? {a} : {b}"),
            Prim2::Min => format!("({a} < {b}) ? {a} : {b}"),
            Prim2::Pow => {
                self.helpers.insert(Helper::IPow);
                format!("({t})kiln_ipow((long long){a}, (long long){b})")
            }
            // float-only primitives on integers: in double, truncated back
            Prim2::Atan2 => format!("({t})atan2((double){a}, (double){b})"),
            Prim2::Hypot => format!("({t})hypot((double){a}, (double){b})"),
            Prim2::And | Prim2::Or | Prim2::Xor => unreachable!(),
        };
        self.tmp(dt, e)
    }

    fn compare(&mut self, op: Cmp, x: Cv, y: Cv, _dt: DType) -> Cv {
        let (a, b) = (self.name(x).to_string(), self.name(y).to_string());
        let o = match op {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        };
        self.tmp(DType::Bool, format!("{a} {o} {b}"))
    }

    fn select(&mut self, c: Cv, x: Cv, y: Cv, dt: DType) -> Cv {
        let e = format!("{} ? {} : {}", self.name(c), self.name(x), self.name(y));
        self.tmp(dt, e)
    }

    fn cast(&mut self, x: Cv, from: DType, to: DType) -> Cv {
        if to.is_half() {
            return self.round_half(x, from, to);
        }
        let a = self.name(x).to_string();
        let t = c_type(to);
        let e = if to == DType::Bool {
            format!("{a} != 0")
        } else if to.is_float() || !from.is_float() {
            format!("({t}){a}")
        } else {
            self.helpers.insert(Helper::F2I);
            format!("({t})kiln_f2i((double){a})")
        };
        self.tmp(to, e)
    }
}

/// Appends the used helpers, in a fixed order, to `s`.
pub(crate) fn write_helpers(s: &mut String, helpers: &BTreeSet<Helper>) {
    for h in helpers {
        let _ = write!(s, "{}", h.text());
    }
}
