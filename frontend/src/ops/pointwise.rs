//! Eager pointwise ops: unary, binary (tensor or Python-number operand),
//! comparisons, `where`, `masked_fill`, casts and copies. Each is one kernel.

use super::kernel::KernelCall;
use crate::autograd::rules::pointwise as rules;
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::infer::{self, Arg};
use kiln_ir::op::{Op, ScalarValue};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, Category, DType, Float, Result, UnaryOp};

/// A Python number operand (`x + 2.5`, `x * 3`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    pub fn category(self) -> Category {
        match self {
            Scalar::Float(_) => Category::Float,
            Scalar::Int(_) => Category::Int,
            Scalar::Bool(_) => Category::Bool,
        }
    }
    pub fn value(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(b) => b as u8 as f64,
        }
    }
}

impl From<Scalar> for ScalarValue {
    fn from(s: Scalar) -> ScalarValue {
        match s {
            Scalar::Float(v) => ScalarValue::Float(Float(v)),
            Scalar::Int(v) => ScalarValue::Int(v),
            Scalar::Bool(b) => ScalarValue::Bool(b),
        }
    }
}

impl From<ScalarValue> for Scalar {
    fn from(s: ScalarValue) -> Scalar {
        match s {
            ScalarValue::Float(v) => Scalar::Float(v.0),
            ScalarValue::Int(v) => Scalar::Int(v),
            ScalarValue::Bool(b) => Scalar::Bool(b),
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}
impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v as f64)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v as i64)
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

/// Writes `src` (broadcast to `dst`'s shape) into `dst`, converting the dtype.
pub(crate) fn copy_into(src: &Tensor, dst: &Tensor) -> Result<()> {
    // CPU kernels never see f16/bf16 (the host converts); CUDA kernels load
    // and store them natively.
    let host = !dst.device().is_cuda();
    if host && (src.dtype().is_half() || dst.dtype().is_half()) {
        trace::check_launch("copy", &[src])?;
        let l = kiln_ir::op::view::broadcast_to(src.layout(), dst.dims())?;
        kiln_runtime::convert(
            kiln_runtime::View {
                storage: &src.storage,
                layout: &l,
            },
            dst.runtime_view(),
        );
        return Ok(());
    }
    let mut k = KernelCall::new();
    let v = k.input(src, src.dtype());
    k.store_into("copy", v, dst)
}

impl Tensor {
    /// Applies a unary pointwise op (the building block of `exp`, `gelu`, ...).
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        trace::record(
            || Op::Unary(op),
            &[self],
            || {
                let sig = infer::unary(op, &self.meta())?;
                let mut k = KernelCall::new();
                let x = k.input(self, sig.compute);
                let y = k.unary(op, x, sig.compute);
                let y = k.finish(op.name(), y, &sig.dims, sig.out)?;
                rules::unary(op, self, y)
            },
        )
    }

    /// Applies a binary pointwise op with broadcasting and type promotion.
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        trace::record(
            || Op::Binary(op),
            &[self, other],
            || {
                let (ma, mb) = (self.meta(), other.meta());
                let sig = infer::binary(op, Arg::Tensor(&ma), Arg::Tensor(&mb))?;
                check_int_divisor(op, sig.compute, other)?;
                let mut k = KernelCall::new();
                let a = k.input(self, sig.compute);
                let b = k.input(other, sig.compute);
                let y = k.binary(op, a, b, sig.compute);
                let y = k.finish(op.name(), y, &sig.dims, sig.out)?;
                rules::binary(op, self, other, y)
            },
        )
    }

    /// `self op s` with a Python number; `reversed` computes `s op self`.
    pub fn binary_scalar(
        &self,
        op: BinaryOp,
        s: impl Into<Scalar>,
        reversed: bool,
    ) -> Result<Tensor> {
        let s = s.into();
        let node = || Op::BinaryScalar {
            op,
            value: s.into(),
            reversed,
        };
        trace::record(node, &[self], || {
            let m = self.meta();
            let sig = if reversed {
                infer::binary(op, Arg::Scalar(s.category()), Arg::Tensor(&m))?
            } else {
                infer::binary(op, Arg::Tensor(&m), Arg::Scalar(s.category()))?
            };
            if reversed {
                check_int_divisor(op, sig.compute, self)?;
            } else if divides(op) && is_int(sig.compute) && s.value() == 0.0 {
                bail!(
                    op.name(),
                    "ZeroDivisionError (integer division by the scalar 0; input {} {})",
                    self.dtype(),
                    fmt_dims(self.dims())
                );
            }
            let mut k = KernelCall::new();
            let a = k.input(self, sig.compute);
            let b = k.scalar(s.value(), sig.compute);
            let (l, r) = if reversed { (b, a) } else { (a, b) };
            let y = k.binary(op, l, r, sig.compute);
            let y = k.finish(op.name(), y, &sig.dims, sig.out)?;
            rules::binary_scalar(op, self, s, reversed, y)
        })
    }

    pub fn add(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, o)
    }
    pub fn sub(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, o)
    }
    pub fn mul(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, o)
    }
    pub fn div(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, o)
    }
    pub fn pow(&self, o: &Tensor) -> Result<Tensor> {
        if let Some((x, o)) = crate::amp::cast_for(crate::amp::Policy::F32, (self, o))? {
            return x.pow(&o);
        }
        self.binary(BinaryOp::Pow, o)
    }
    /// `self ** s` with a Python number, PyTorch's `x.pow(2)` (autocast
    /// runs it in f32, as `pow`).
    ///
    /// ```
    /// let x = kiln_frontend::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.pow_scalar(2.0)?.to_vec::<f32>()?, vec![1.0, 4.0, 9.0]);
    /// assert_eq!(x.div_scalar(2.0)?.to_vec::<f32>()?, vec![0.5, 1.0, 1.5]);
    /// # Ok::<(), kiln_frontend::Error>(())
    /// ```
    pub fn pow_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.pow_scalar(s);
        }
        self.binary_scalar(BinaryOp::Pow, s, false)
    }
    /// `self + s` with a Python number (`x + 1`).
    pub fn add_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Add, s, false)
    }
    /// `self - s` with a Python number (`x - 1`).
    pub fn sub_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Sub, s, false)
    }
    /// `self * s` with a Python number (`x * 2`).
    pub fn mul_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Mul, s, false)
    }
    /// `self / s` with a Python number (`x / 2`: true division, so an
    /// integer tensor gives floats, as in PyTorch).
    pub fn div_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Div, s, false)
    }
    pub fn maximum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Maximum, o)
    }
    pub fn minimum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Minimum, o)
    }
    pub fn eq(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Eq, o)
    }
    pub fn ne(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ne, o)
    }
    pub fn lt(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Lt, o)
    }
    pub fn le(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Le, o)
    }
    pub fn gt(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Gt, o)
    }
    pub fn ge(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ge, o)
    }

    /// `torch.add(self, other, alpha=alpha)`: self + alpha * other, one kernel.
    pub fn add_scaled(&self, other: &Tensor, alpha: f64, subtract: bool) -> Result<Tensor> {
        let op = if subtract {
            BinaryOp::Sub
        } else {
            BinaryOp::Add
        };
        let (ma, mb) = (self.meta(), other.meta());
        let sig = infer::binary(op, Arg::Tensor(&ma), Arg::Tensor(&mb))?;
        if trace::is_recording() {
            // no graph op scales an operand: record `other * alpha` and the sum
            let alpha = match sig.compute {
                d if d.is_float() => Scalar::Float(alpha),
                DType::Bool => Scalar::Bool(alpha != 0.0),
                _ => Scalar::Int(alpha as i64),
            };
            return self.binary(op, &other.binary_scalar(BinaryOp::Mul, alpha, false)?);
        }
        let mut k = KernelCall::new();
        let a = k.input(self, sig.compute);
        let b = k.input(other, sig.compute);
        let s = k.scalar(alpha, sig.compute);
        let bs = k.binary(BinaryOp::Mul, b, s, sig.compute);
        let y = k.binary(op, a, bs, sig.compute);
        let y = k.finish(op.name(), y, &sig.dims, sig.out)?;
        rules::add_scaled(self, other, alpha, subtract, y)
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    pub fn exp(&self) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.exp();
        }
        self.unary(UnaryOp::Exp)
    }
    pub fn log(&self) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.log();
        }
        self.unary(UnaryOp::Log)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn reciprocal(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Reciprocal)
    }
    pub fn square(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Square)
    }
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin)
    }
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// `F.gelu(x, approximate=...)`: exact (erf) unless `tanh_approx`.
    pub fn gelu(&self, tanh_approx: bool) -> Result<Tensor> {
        self.unary(if tanh_approx {
            UnaryOp::GeluTanh
        } else {
            UnaryOp::Gelu
        })
    }
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Softplus {
            beta: Float(beta),
            threshold: Float(threshold),
        })
    }
    pub fn leaky_relu(&self, slope: f64) -> Result<Tensor> {
        self.unary(UnaryOp::LeakyRelu {
            slope: Float(slope),
        })
    }
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Elu {
            alpha: Float(alpha),
        })
    }
    pub fn logical_not(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Not)
    }

    /// `torch.where(cond, self, other)`.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        trace::record(
            || Op::Where,
            &[cond, a, b],
            || {
                let (mc, ma, mb) = (cond.meta(), a.meta(), b.meta());
                let sig = infer::where_(&mc, Arg::Tensor(&ma), Arg::Tensor(&mb))?;
                let mut k = KernelCall::new();
                let c = k.input(cond, DType::Bool);
                let x = k.input(a, sig.compute);
                let y = k.input(b, sig.compute);
                let r = k.select(c, x, y, sig.compute);
                let r = k.finish("where", r, &sig.dims, sig.out)?;
                rules::where_(cond, a, Some(b), r)
            },
        )
    }

    /// `torch.where(cond, self, scalar)`.
    pub fn where_scalar(cond: &Tensor, a: &Tensor, other: impl Into<Scalar>) -> Result<Tensor> {
        let s = other.into();
        let (mc, ma) = (cond.meta(), a.meta());
        let sig = infer::where_(&mc, Arg::Tensor(&ma), Arg::Scalar(s.category()))?;
        if trace::is_recording() {
            // `where` takes tensors only: the number becomes a captured 0-dim
            // tensor of the result dtype (0-dim tensors promote like numbers)
            return Tensor::where_(cond, a, &scalar_tensor(s, sig.compute, sig.out));
        }
        let mut k = KernelCall::new();
        let c = k.input(cond, DType::Bool);
        let x = k.input(a, sig.compute);
        let y = k.scalar(s.value(), sig.compute);
        let r = k.select(c, x, y, sig.compute);
        let r = k.finish("where", r, &sig.dims, sig.out)?;
        rules::where_(cond, a, None, r)
    }

    /// `masked_fill(mask, value)`: mask must be bool and broadcast to self's shape.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            bail!(
                "masked_fill",
                "mask must be a bool tensor, got {} {}",
                mask.dtype(),
                kiln_ir::shape::fmt_dims(mask.dims())
            );
        }
        let dims = kiln_ir::shape::broadcast_shapes("masked_fill", self.dims(), mask.dims())?;
        if dims.as_slice() != self.dims() {
            bail!(
                "masked_fill",
                "mask of shape {} must broadcast to the input shape {}",
                kiln_ir::shape::fmt_dims(mask.dims()),
                kiln_ir::shape::fmt_dims(self.dims())
            );
        }
        let value = value.into();
        let node = || Op::MaskedFill {
            value: Some(value.into()),
        };
        trace::record(node, &[self, mask], || {
            let dt = self.dtype().compute();
            let mut k = KernelCall::new();
            let c = k.input(mask, DType::Bool);
            let x = k.input(self, dt);
            let v = k.scalar(value.value(), dt);
            let r = k.select(c, v, x, dt);
            let r = k.finish("masked_fill", r, self.dims(), self.dtype())?;
            rules::masked_fill(self, mask, r)
        })
    }

    /// `to(dtype)`: a converted copy (or `self` when the dtype already matches).
    /// Narrowing to f16/bf16 rounds to nearest, ties to even.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        trace::record(
            || Op::Cast(dtype),
            &[self],
            || {
                let out = Tensor::empty_on(self.dims(), dtype, self.device())?;
                copy_into(self, &out)?;
                rules::cast(self, out)
            },
        )
    }

    /// In-place copy of `src` (broadcast) into `self`, PyTorch's `copy_`.
    /// Bumps the version counter (a backward that saved `self` then fails);
    /// on a leaf that requires grad it is an error unless inside `no_grad()`.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.prepare_inplace("copy_", &[src])?;
        copy_into(src, self)
    }
}

/// Integer ops that divide: PyTorch raises ZeroDivisionError for a zero divisor.
fn divides(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::FloorDiv | BinaryOp::Remainder | BinaryOp::Fmod
    )
}

fn is_int(dt: DType) -> bool {
    !dt.is_float() && dt != DType::Bool
}

/// PyTorch's integer division check: `floor_divide`, `remainder` and
/// `fmod` computed in an integer dtype fail with "ZeroDivisionError" when
/// any divisor element is 0 (one reduction and a read; float division by 0
/// is inf/NaN, as in PyTorch, and is not checked).
fn check_int_divisor(op: BinaryOp, compute: DType, divisor: &Tensor) -> Result<()> {
    if !divides(op) || !is_int(compute) || divisor.numel() == 0 {
        return Ok(());
    }
    let zeros = trace::untraced(|| -> Result<f64> {
        let z = divisor.detach().binary_scalar(BinaryOp::Eq, 0i64, false)?;
        z.to_dtype(DType::I64)?.sum(None, false)?.item()
    })?;
    if zeros > 0.0 {
        bail!(
            op.name(),
            "ZeroDivisionError (integer division by zero: the divisor {} {} holds {zeros} zero(s))",
            divisor.dtype(),
            fmt_dims(divisor.dims())
        );
    }
    Ok(())
}

/// A 0-dim tensor of `out` holding `s` as a kernel sees it (rounded to
/// `compute` first), made on the host so nothing is recorded.
fn scalar_tensor(s: Scalar, compute: DType, out: DType) -> Tensor {
    let src = Tensor::scalar(s.value());
    let c = Tensor::empty(&[], compute);
    kiln_runtime::convert(src.runtime_view(), c.runtime_view());
    let t = Tensor::empty(&[], out);
    kiln_runtime::convert(c.runtime_view(), t.runtime_view());
    t
}

macro_rules! binop_overload {
    ($tr:ident, $m:ident, $op:ident) => {
        impl std::ops::$tr<&Tensor> for &Tensor {
            type Output = Tensor;
            /// Panics with the op's error message on bad shapes; use the method for a `Result`.
            fn $m(self, o: &Tensor) -> Tensor {
                self.binary(BinaryOp::$op, o)
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl std::ops::$tr<f64> for &Tensor {
            type Output = Tensor;
            fn $m(self, s: f64) -> Tensor {
                self.binary_scalar(BinaryOp::$op, s, false)
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        }
    };
}
binop_overload!(Add, add, Add);
binop_overload!(Sub, sub, Sub);
binop_overload!(Mul, mul, Mul);
binop_overload!(Div, div, Div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg).unwrap_or_else(|e| panic!("{e}"))
    }
}
