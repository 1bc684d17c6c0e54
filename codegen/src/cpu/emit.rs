//! [`ScalarOps`] over Cranelift values: the only place where the primitives
//! of scalar semantics become Cranelift instructions. Composite ops reach here
//! through `lower_unary`/`lower_binary`, never re-defined.
//!
//! A value is a scalar (`lanes == 1`) or a 128-bit vector (`f32x4`, `f64x2`).
//! Representations: f32/f64 as such; i64/i32/i16 as such; i8, u8 and bool as
//! `i8` (u8 with unsigned semantics, bool 0/1). In vector mode a bool is a
//! lane mask (`i32x4` next to f32x4, `i64x2` next to f64x2: all ones = true).

use super::jit::{HostFn, HostImports};
use super::wide;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, GlobalValue, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use kiln_ir::scalar::{Cmp, Prim1, Prim2, ScalarOps};
use kiln_ir::DType;

pub(crate) struct Emitter<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    /// 1 for scalar code, else the vector lane count (4 for f32, 2 for f64).
    pub lanes: u32,
    pub hosts: HostImports,
    /// Emit `fma` instructions (else multiply + add).
    pub fma: bool,
    /// The first unsupported request, reported by `compile` as an error.
    pub err: Option<String>,
    /// Vector constants (16-byte slots), emitted as a data object of the kernel.
    pub pool: Vec<u8>,
    /// The data object's symbol.
    pub pool_gv: GlobalValue,
    /// The pool's address as seen in the current loop (see `loops::for_loop`).
    pub pool_base: Option<Value>,
    /// Which kernels call the wide-vector helpers (`tiles.rs`, `rows.rs`,
    /// `softmax_row.rs`); none: plain f32x4 code.
    pub wide: wide::Uses,
}

/// The scalar Cranelift type of a (compute) dtype.
pub(crate) fn scalar_ty(dt: DType) -> Type {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => types::F32,
        DType::F64 => types::F64,
        DType::I64 => types::I64,
        DType::I32 => types::I32,
        DType::I16 => types::I16,
        DType::I8 | DType::U8 | DType::Bool => types::I8,
    }
}

fn is_unsigned(dt: DType) -> bool {
    matches!(dt, DType::U8 | DType::Bool)
}

pub(crate) fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

impl<'a, 'f> Emitter<'a, 'f> {
    pub(crate) fn new(
        b: &'a mut FunctionBuilder<'f>,
        hosts: HostImports,
        fma: bool,
        pool_gv: GlobalValue,
    ) -> Self {
        Emitter {
            b,
            lanes: 1,
            hosts,
            fma,
            err: None,
            pool: Vec::new(),
            pool_gv,
            pool_base: None,
            wide: wide::Uses::default(),
        }
    }

    /// A vector constant with every lane `lane_bits`, loaded from the kernel's
    /// constant pool. Each request gets its own slot, so each load has one use
    /// and x86 folds it into the instruction as a memory operand; the loads are
    /// pure but address the pool through a loop-carried value, so they are not
    /// hoisted out of loops (a dozen hoisted polynomial constants would not fit
    /// in the 16 xmm registers and would be spilled).
    pub(crate) fn vconst(&mut self, ty: Type, lane_bits: u64) -> Value {
        let lb = ty.lane_bits() as usize / 8;
        let off = self.pool.len();
        for _ in 0..ty.lane_count() {
            self.pool.extend_from_slice(&lane_bits.to_le_bytes()[..lb]);
        }
        let base = self.pool_base.expect("constant pool address");
        let fl = MemFlagsData::trusted().with_readonly().with_can_move();
        self.b.ins().load(ty, fl, base, off as i32)
    }

    /// The Cranelift type of a value of `dt` in the current mode.
    pub(crate) fn ty(&self, dt: DType) -> Type {
        let t = scalar_ty(dt);
        match (self.lanes, dt) {
            (1, _) => t,
            (4, DType::Bool) => types::I32X4,
            (2, DType::Bool) => types::I64X2,
            (n, _) => t.by(n).expect("vector type"),
        }
    }

    /// Records an unsupported request and returns a placeholder of the right type.
    pub(crate) fn fail(&mut self, msg: String, dt: DType) -> Value {
        self.err.get_or_insert(msg);
        let t = self.ty(dt);
        if t.is_vector() {
            let z = self.b.ins().iconst(types::I8, 0);
            let v = self.b.ins().splat(types::I8X16, z);
            return self.b.ins().bitcast(
                t,
                MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little),
                v,
            );
        }
        if t.is_float() {
            return if t == types::F32 {
                self.b.ins().f32const(0.0)
            } else {
                self.b.ins().f64const(0.0)
            };
        }
        self.b.ins().iconst(t, 0)
    }

    /// Splats a scalar when in vector mode.
    pub(crate) fn splat_if_vector(&mut self, x: Value, dt: DType) -> Value {
        if self.lanes == 1 {
            return x;
        }
        let t = self.ty(dt);
        if dt == DType::Bool {
            // 0/1 byte -> all-zeros/all-ones lane
            let lane = t.lane_type();
            let w = self.b.ins().uextend(lane, x);
            let m = self.b.ins().ineg(w);
            return self.b.ins().splat(t, m);
        }
        self.b.ins().splat(t, x)
    }

    fn int_imm(&mut self, t: Type, v: i64) -> Value {
        let bits = t.bits();
        let v = if bits >= 64 {
            v
        } else {
            v & ((1i64 << bits) - 1)
        };
        self.b.ins().iconst(t, v)
    }

    /// |x| for floats; in vector mode an `and` with a pooled mask (one instruction
    /// with a memory operand instead of three that build the mask).
    pub(crate) fn fabs(&mut self, x: Value) -> Value {
        let t = self.b.func.dfg.value_type(x);
        if !t.is_vector() {
            return self.b.ins().fabs(x);
        }
        let m = if t.lane_bits() == 32 {
            0x7fff_ffff
        } else {
            0x7fff_ffff_ffff_ffff
        };
        let c = self.vconst(t, m);
        self.b.ins().band(x, c)
    }

    /// -x for floats (vector: `xor` with a pooled sign mask).
    pub(crate) fn fneg(&mut self, x: Value) -> Value {
        let t = self.b.func.dfg.value_type(x);
        if !t.is_vector() {
            return self.b.ins().fneg(x);
        }
        let m = if t.lane_bits() == 32 {
            0x8000_0000
        } else {
            0x8000_0000_0000_0000
        };
        let c = self.vconst(t, m);
        self.b.ins().bxor(x, c)
    }

    /// `a * b + c`, the accumulator `a` first (it is usually dead afterwards).
    pub(crate) fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let m = self.b.ins().fmul(a, b);
            self.b.ins().fadd(m, c)
        }
    }

    /// Lane-wise `cond ? a : b` for float values, `cond` from `fcmp`.
    pub(crate) fn fselect(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        if t.is_vector() {
            let m = self.b.ins().bitcast(t, MemFlagsData::new(), cond);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(cond, a, b)
        }
    }

    /// Calls a host f64 function (per lane in vector mode); f32 values are widened.
    fn host(&mut self, h: HostFn, args: &[Value], dt: DType) -> Value {
        let f = self.hosts.get(self.b.func, h);
        let t = self.ty(dt);
        let wide = |em: &mut Self, x: Value| {
            if dt == DType::F32 {
                em.b.ins().fpromote(types::F64, x)
            } else {
                x
            }
        };
        if !t.is_vector() {
            let a: Vec<Value> = args.iter().map(|&x| wide(self, x)).collect();
            let call = self.b.ins().call(f, &a);
            let r = self.b.inst_results(call)[0];
            return if dt == DType::F32 {
                self.b.ins().fdemote(types::F32, r)
            } else {
                r
            };
        }
        let mut out = None;
        for lane in 0..t.lane_count() as u8 {
            let a: Vec<Value> = args
                .iter()
                .map(|&x| {
                    let e = self.b.ins().extractlane(x, lane);
                    wide(self, e)
                })
                .collect();
            let call = self.b.ins().call(f, &a);
            let mut r = self.b.inst_results(call)[0];
            if dt == DType::F32 {
                r = self.b.ins().fdemote(types::F32, r);
            }
            out = Some(match out {
                None => self.b.ins().splat(t, r),
                Some(v) => self.b.ins().insertlane(v, r, lane),
            });
        }
        out.unwrap()
    }

    fn float_unary(&mut self, op: Prim1, x: Value, dt: DType) -> Value {
        let f32 = dt == DType::F32;
        match op {
            Prim1::Neg => self.fneg(x),
            Prim1::Abs => self.fabs(x),
            Prim1::Sqrt => self.b.ins().sqrt(x),
            Prim1::Floor => self.b.ins().floor(x),
            Prim1::Exp if f32 => self.exp_f32(x),
            Prim1::Log if f32 => self.log_f32(x),
            Prim1::Log1p if f32 => self.log1p_f32(x),
            Prim1::Expm1 if f32 => self.expm1_f32(x),
            Prim1::Tanh if f32 => self.tanh_f32(x),
            Prim1::Erf if f32 => self.erf_f32(x),
            Prim1::Exp => self.host(HostFn::Exp, &[x], dt),
            Prim1::Log => self.host(HostFn::Log, &[x], dt),
            Prim1::Log1p => self.host(HostFn::Log1p, &[x], dt),
            Prim1::Expm1 => self.host(HostFn::Expm1, &[x], dt),
            Prim1::Tanh => self.host(HostFn::Tanh, &[x], dt),
            Prim1::Erf => self.host(HostFn::Erf, &[x], dt),
            Prim1::Sin => self.host(HostFn::Sin, &[x], dt),
            Prim1::Cos => self.host(HostFn::Cos, &[x], dt),
            Prim1::Not => {
                let z = self.constant(0.0, dt);
                self.compare(Cmp::Eq, x, z, dt)
            }
            Prim1::Ceil => self.b.ins().ceil(x),
            Prim1::Trunc => self.b.ins().trunc(x),
            // IEEE round-to-nearest-even: torch.round's rule
            Prim1::Round => self.b.ins().nearest(x),
            Prim1::Tan => self.host(HostFn::Tan, &[x], dt),
            Prim1::Asin => self.host(HostFn::Asin, &[x], dt),
            Prim1::Acos => self.host(HostFn::Acos, &[x], dt),
            Prim1::Atan => self.host(HostFn::Atan, &[x], dt),
            Prim1::Sinh => self.host(HostFn::Sinh, &[x], dt),
            Prim1::Cosh => self.host(HostFn::Cosh, &[x], dt),
        }
    }

    /// Integer division / remainder that never traps: `x / 0 = x % 0 = 0`,
    /// `MIN / -1` wraps to MIN.
    fn int_divrem(&mut self, rem: bool, a: Value, b: Value, dt: DType) -> Value {
        let t = scalar_ty(dt);
        let zero = self.int_imm(t, 0);
        let one = self.int_imm(t, 1);
        let bz = self.b.ins().icmp(IntCC::Equal, b, zero);
        if is_unsigned(dt) {
            let safe = self.b.ins().select(bz, one, b);
            return if rem {
                self.b.ins().urem(a, safe)
            } else {
                let q = self.b.ins().udiv(a, safe);
                self.b.ins().select(bz, zero, q)
            };
        }
        let m1 = self.int_imm(t, -1);
        let bm1 = self.b.ins().icmp(IntCC::Equal, b, m1);
        let special = self.b.ins().bor(bz, bm1);
        let safe = self.b.ins().select(special, one, b);
        if rem {
            // x % 1 == 0 covers both b == 0 and b == -1.
            return self.b.ins().srem(a, safe);
        }
        let q = self.b.ins().sdiv(a, safe);
        let na = self.b.ins().ineg(a);
        let q = self.b.ins().select(bm1, na, q);
        self.b.ins().select(bz, zero, q)
    }

    fn int_pow(&mut self, a: Value, b: Value, dt: DType) -> Value {
        let wide = |em: &mut Self, x: Value| match dt {
            DType::I64 => x,
            d if is_unsigned(d) => em.b.ins().uextend(types::I64, x),
            _ => em.b.ins().sextend(types::I64, x),
        };
        let (wa, wb) = (wide(self, a), wide(self, b));
        let f = self.hosts.get(self.b.func, HostFn::IPow);
        let call = self.b.ins().call(f, &[wa, wb]);
        let r = self.b.inst_results(call)[0];
        if dt == DType::I64 {
            r
        } else {
            self.b.ins().ireduce(scalar_ty(dt), r)
        }
    }
}

fn float_cc(op: Cmp) -> FloatCC {
    match op {
        Cmp::Eq => FloatCC::Equal,
        Cmp::Ne => FloatCC::NotEqual,
        Cmp::Lt => FloatCC::LessThan,
        Cmp::Le => FloatCC::LessThanOrEqual,
        Cmp::Gt => FloatCC::GreaterThan,
        Cmp::Ge => FloatCC::GreaterThanOrEqual,
    }
}

fn int_cc(op: Cmp, unsigned: bool) -> IntCC {
    match (op, unsigned) {
        (Cmp::Eq, _) => IntCC::Equal,
        (Cmp::Ne, _) => IntCC::NotEqual,
        (Cmp::Lt, false) => IntCC::SignedLessThan,
        (Cmp::Le, false) => IntCC::SignedLessThanOrEqual,
        (Cmp::Gt, false) => IntCC::SignedGreaterThan,
        (Cmp::Ge, false) => IntCC::SignedGreaterThanOrEqual,
        (Cmp::Lt, true) => IntCC::UnsignedLessThan,
        (Cmp::Le, true) => IntCC::UnsignedLessThanOrEqual,
        (Cmp::Gt, true) => IntCC::UnsignedGreaterThan,
        (Cmp::Ge, true) => IntCC::UnsignedGreaterThanOrEqual,
    }
}

impl ScalarOps for Emitter<'_, '_> {
    type V = Value;

    fn constant(&mut self, value: f64, dt: DType) -> Value {
        if self.lanes > 1 {
            let ty = self.ty(dt);
            let bits = match dt {
                DType::F32 => (value as f32).to_bits() as u64,
                DType::F64 => value.to_bits(),
                DType::Bool => {
                    if value != 0.0 {
                        u64::MAX
                    } else {
                        0
                    }
                }
                _ => return self.fail(format!("vector constant of {dt}"), dt),
            };
            return self.vconst(ty, bits);
        }
        let s = match dt {
            DType::F32 | DType::F16 | DType::BF16 => self.b.ins().f32const(value as f32),
            DType::F64 => self.b.ins().f64const(value),
            DType::Bool => self.b.ins().iconst(types::I8, (value != 0.0) as i64),
            _ => {
                let v = kiln_ir::interp::wrap(value as i64, dt);
                self.int_imm(scalar_ty(dt), v)
            }
        };
        self.splat_if_vector(s, dt)
    }

    fn unary(&mut self, op: Prim1, x: Value, dt: DType) -> Value {
        if dt.is_float() {
            return self.float_unary(op, x, dt);
        }
        let vector = self.lanes > 1;
        match op {
            Prim1::Neg if !vector => self.b.ins().ineg(x),
            Prim1::Abs if is_unsigned(dt) => x,
            Prim1::Abs if !vector => self.b.ins().iabs(x),
            Prim1::Floor | Prim1::Ceil | Prim1::Trunc | Prim1::Round => x,
            Prim1::Not if vector => self.b.ins().bnot(x),
            Prim1::Not => self.b.ins().icmp_imm_u(IntCC::Equal, x, 0),
            _ => self.fail(format!("{op:?} on {dt} is not supported"), dt),
        }
    }

    fn binary(&mut self, op: Prim2, a: Value, b: Value, dt: DType) -> Value {
        if dt.is_float() {
            return match op {
                Prim2::Add => self.b.ins().fadd(a, b),
                Prim2::Sub => self.b.ins().fsub(a, b),
                Prim2::Mul => self.b.ins().fmul(a, b),
                Prim2::Div => self.b.ins().fdiv(a, b),
                // Cranelift's fmax/fmin propagate NaN and order -0 < +0 (torch.maximum).
                Prim2::Max => self.b.ins().fmax(a, b),
                Prim2::Min => self.b.ins().fmin(a, b),
                Prim2::Pow => self.host(HostFn::Pow, &[a, b], dt),
                Prim2::Fmod => self.host(HostFn::Fmod, &[a, b], dt),
                Prim2::Atan2 => self.host(HostFn::Atan2, &[a, b], dt),
                Prim2::Hypot => self.host(HostFn::Hypot, &[a, b], dt),
                Prim2::And | Prim2::Or | Prim2::Xor => self.fail(format!("{op:?} on {dt}"), dt),
            };
        }
        let u = is_unsigned(dt);
        match op {
            Prim2::And => return self.b.ins().band(a, b),
            Prim2::Or => return self.b.ins().bor(a, b),
            Prim2::Xor => return self.b.ins().bxor(a, b),
            Prim2::Atan2 | Prim2::Hypot => return self.fail(format!("{op:?} on {dt}"), dt),
            _ if self.lanes > 1 => return self.fail(format!("vector {op:?} on {dt}"), dt),
            _ => {}
        }
        match op {
            // bool + bool is logical or (true + true stays 1, as in PyTorch)
            Prim2::Add if dt == DType::Bool => self.b.ins().bor(a, b),
            Prim2::Add => self.b.ins().iadd(a, b),
            Prim2::Sub => self.b.ins().isub(a, b),
            Prim2::Mul => self.b.ins().imul(a, b),
            Prim2::Div => self.int_divrem(false, a, b, dt),
            Prim2::Fmod => self.int_divrem(true, a, b, dt),
            Prim2::Max if u => self.b.ins().umax(a, b),
            Prim2::Min if u => self.b.ins().umin(a, b),
            Prim2::Max => self.b.ins().smax(a, b),
            Prim2::Min => self.b.ins().smin(a, b),
            Prim2::Pow => self.int_pow(a, b, dt),
            Prim2::And | Prim2::Or | Prim2::Xor | Prim2::Atan2 | Prim2::Hypot => unreachable!(),
        }
    }

    fn compare(&mut self, op: Cmp, a: Value, b: Value, dt: DType) -> Value {
        if dt.is_float() {
            return self.b.ins().fcmp(float_cc(op), a, b);
        }
        if self.lanes > 1 && !matches!(op, Cmp::Eq | Cmp::Ne) {
            return self.fail(format!("vector {op:?} on {dt}"), DType::Bool);
        }
        self.b.ins().icmp(int_cc(op, is_unsigned(dt)), a, b)
    }

    fn select(&mut self, cond: Value, a: Value, b: Value, dt: DType) -> Value {
        if self.lanes > 1 {
            if dt == DType::Bool {
                return self.b.ins().bitselect(cond, a, b);
            }
            return self.fselect(cond, a, b);
        }
        self.b.ins().select(cond, a, b)
    }

    fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        if from == to {
            return x;
        }
        if to == DType::Bool {
            let z = self.constant(0.0, from);
            return self.compare(Cmp::Ne, x, z, from);
        }
        if self.lanes > 1 {
            if from == DType::Bool && to.is_float() {
                // mask & bits(1.0)
                let one = self.constant(1.0, to);
                let t = self.ty(DType::Bool);
                let ob = self.b.ins().bitcast(t, MemFlagsData::new(), one);
                let m = self.b.ins().band(x, ob);
                let tt = self.ty(to);
                return self.b.ins().bitcast(tt, MemFlagsData::new(), m);
            }
            return self.fail(format!("vector cast {from} -> {to}"), to);
        }
        let tt = scalar_ty(to);
        let ft = scalar_ty(from);
        match (from.is_float(), to.is_float()) {
            (true, true) if tt.bits() > ft.bits() => self.b.ins().fpromote(tt, x),
            (true, true) if tt.bits() < ft.bits() => self.b.ins().fdemote(tt, x),
            (true, true) => x,
            (false, true) => {
                let w = match from {
                    DType::I64 => x,
                    d if is_unsigned(d) => self.b.ins().uextend(types::I64, x),
                    _ => self.b.ins().sextend(types::I64, x),
                };
                self.b.ins().fcvt_from_sint(tt, w)
            }
            (true, false) => {
                // truncate toward zero, saturating to i64 (NaN -> 0), then wrap
                let w = self.b.ins().fcvt_to_sint_sat(types::I64, x);
                if tt == types::I64 {
                    w
                } else {
                    self.b.ins().ireduce(tt, w)
                }
            }
            (false, false) if tt.bits() > ft.bits() => {
                if is_unsigned(from) {
                    self.b.ins().uextend(tt, x)
                } else {
                    self.b.ins().sextend(tt, x)
                }
            }
            (false, false) if tt.bits() < ft.bits() => self.b.ins().ireduce(tt, x),
            (false, false) => x,
        }
    }
}
