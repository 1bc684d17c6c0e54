//! The op table's later pointwise ops as `Tensor` methods with PyTorch's
//! names: clamps, the hard/soft activations, rounding, predicates,
//! special functions, the bitwise and logical ops, and the composites
//! built from them (lerp, addcmul, addcdiv, float_power, tensor-bound
//! clamp). Every native one is a single [`UnaryOp`]/[`BinaryOp`] of the
//! table, so it fuses like relu.
//!
//! ```
//! # use kiln_frontend::Tensor;
//! let x = Tensor::from_vec(vec![-4.0f32, -1.5, 0.0, 4.0], &[4])?;
//! // hardswish: [-0.0, -0.375, 0.0, 4.0], then clamped to [-0.25, 1]
//! let y = x.hardswish()?.clamp(Some(-0.25), Some(1.0))?;
//! assert_eq!(y.to_vec::<f32>()?, vec![0.0, -0.25, 0.0, 1.0]);
//! # Ok::<(), kiln_ir::Error>(())
//! ```

use crate::Tensor;
use kiln_ir::{bail, BinaryOp, DType, Float, Result, UnaryOp};

/// The largest finite value of a float dtype (`nan_to_num`'s default for +inf).
fn dtype_max(dt: DType) -> f64 {
    match dt {
        DType::F64 => f64::MAX,
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535_5e38,
        _ => f32::MAX as f64,
    }
}

macro_rules! plain_unary {
    ($($(#[$doc:meta])* $method:ident => $op:ident;)*) => {
        impl Tensor {
            $( $(#[$doc])* pub fn $method(&self) -> Result<Tensor> {
                self.unary(UnaryOp::$op)
            } )*
        }
    };
}

macro_rules! plain_binary {
    ($($(#[$doc:meta])* $method:ident => $op:ident;)*) => {
        impl Tensor {
            $( $(#[$doc])* pub fn $method(&self, other: &Tensor) -> Result<Tensor> {
                self.binary(BinaryOp::$op, other)
            } )*
        }
    };
}

plain_unary! {
    /// `torch.nn.functional.relu6`: `min(max(x, 0), 6)`.
    relu6 => Relu6;
    /// `x * relu6(x + 3) / 6`.
    hardswish => Hardswish;
    /// `relu6(x + 3) / 6`.
    hardsigmoid => Hardsigmoid;
    /// `x * tanh(softplus(x))`.
    mish => Mish;
    /// Scaled ELU with PyTorch's fixed alpha and scale.
    selu => Selu;
    /// `log(sigmoid(x))`, computed without overflow.
    logsigmoid => LogSigmoid;
    /// `x / (1 + |x|)`.
    softsign => Softsign;
    /// `x - tanh(x)`.
    tanhshrink => Tanhshrink;
    ceil => Ceil;
    floor => Floor;
    trunc => Trunc;
    /// `x - trunc(x)`.
    frac => Frac;
    /// -1, 0 or 1 (0 for NaN).
    sign => Sign;
    isnan => IsNan;
    isinf => IsInf;
    isfinite => IsFinite;
    isposinf => IsPosInf;
    isneginf => IsNegInf;
    log1p => Log1p;
    expm1 => Expm1;
    log2 => Log2;
    log10 => Log10;
    exp2 => Exp2;
    sinh => Sinh;
    cosh => Cosh;
    tan => Tan;
    asin => Asin;
    acos => Acos;
    atan => Atan;
    erf => Erf;
    erfc => Erfc;
    erfinv => Erfinv;
    /// `~x` for integers, `logical_not` for bools.
    bitwise_not => BitwiseNot;
}

plain_binary! {
    /// `atan2(self, other)`, quadrant and signed zeros as in C.
    atan2 => Atan2;
    /// `sqrt(self^2 + other^2)` without overflow.
    hypot => Hypot;
    /// `|self|` with the sign of `other`.
    copysign => Copysign;
    /// `self * log(other)`, 0 where `self == 0`.
    xlogy => Xlogy;
    logical_and => And;
    logical_or => Or;
    logical_xor => Xor;
    bitwise_and => BitwiseAnd;
    bitwise_or => BitwiseOr;
    bitwise_xor => BitwiseXor;
}

impl Tensor {
    /// `torch.clamp(self, min, max)` with Python-number bounds (either may be
    /// absent; `min > max` gives `max` everywhere, as in PyTorch). An integer
    /// tensor with a fractional bound is promoted to f32 first.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        if min.is_none() && max.is_none() {
            bail!("clamp", "at least one of min and max must be given");
        }
        let (lo, hi) = (
            min.unwrap_or(f64::NEG_INFINITY),
            max.unwrap_or(f64::INFINITY),
        );
        let fractional = [min, max].into_iter().flatten().any(|v| v.fract() != 0.0);
        let x = if !self.dtype().is_float() && fractional {
            self.to_dtype(DType::F32)?
        } else {
            self.clone()
        };
        x.unary(UnaryOp::Clamp {
            min: Float(lo),
            max: Float(hi),
        })
    }
    /// `torch.clip`: an alias of [`Tensor::clamp`].
    pub fn clip(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        self.clamp(min, max)
    }
    /// `torch.clamp_min(self, min)`.
    pub fn clamp_min(&self, min: f64) -> Result<Tensor> {
        self.clamp(Some(min), None)
    }
    /// `torch.clamp_max(self, max)`.
    pub fn clamp_max(&self, max: f64) -> Result<Tensor> {
        self.clamp(None, Some(max))
    }
    /// `torch.clamp` with tensor bounds (broadcast): `minimum(maximum(self,
    /// min), max)`, two pointwise ops that fuse.
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        let mut y = match min {
            Some(m) => self.maximum(m)?,
            None => self.clone(),
        };
        if let Some(m) = max {
            y = y.minimum(m)?;
        }
        if min.is_none() && max.is_none() {
            bail!("clamp", "at least one of min and max must be given");
        }
        Ok(y)
    }
    /// `F.hardtanh(self, min_val, max_val)`.
    pub fn hardtanh(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Hardtanh {
            min_val: Float(min_val),
            max_val: Float(max_val),
        })
    }
    /// `F.celu(self, alpha)`: `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`.
    pub fn celu(&self, alpha: f64) -> Result<Tensor> {
        if alpha == 0.0 {
            bail!("celu", "alpha must not be 0");
        }
        self.unary(UnaryOp::Celu {
            alpha: Float(alpha),
        })
    }
    /// `F.threshold(self, threshold, value)`: `x > threshold ? x : value`.
    pub fn threshold(&self, threshold: f64, value: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Threshold {
            threshold: Float(threshold),
            value: Float(value),
        })
    }
    /// `F.hardshrink(self, lambd)`.
    pub fn hardshrink(&self, lambd: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Hardshrink {
            lambd: Float(lambd),
        })
    }
    /// `F.softshrink(self, lambd)` (`lambd` must be non-negative).
    pub fn softshrink(&self, lambd: f64) -> Result<Tensor> {
        if lambd < 0.0 {
            bail!("softshrink", "lambd must be >= 0, got {lambd}");
        }
        self.unary(UnaryOp::Softshrink {
            lambd: Float(lambd),
        })
    }
    /// Round half to even (`torch.round`).
    pub fn round(&self) -> Result<Tensor> {
        self.round_decimals(0)
    }
    /// `torch.round(self, decimals=d)`: half to even at `d` decimal digits.
    pub fn round_decimals(&self, decimals: i64) -> Result<Tensor> {
        self.unary(UnaryOp::Round {
            decimals: Float(decimals as f64),
        })
    }
    /// `torch.nan_to_num`: NaN, +inf and -inf replaced; an absent `posinf` /
    /// `neginf` is the dtype's largest / lowest finite value.
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Result<Tensor> {
        let m = dtype_max(self.dtype());
        self.unary(UnaryOp::NanToNum {
            nan: Float(nan),
            posinf: Float(posinf.unwrap_or(m)),
            neginf: Float(neginf.unwrap_or(-m)),
        })
    }
    /// `torch.logit(self, eps)`: `log(x / (1 - x))`, x first clamped to
    /// `[eps, 1 - eps]` when `eps` is given.
    pub fn logit(&self, eps: Option<f64>) -> Result<Tensor> {
        if let Some(e) = eps {
            if !(0.0..=0.5).contains(&e) {
                bail!("logit", "eps must lie in [0, 0.5], got {e}");
            }
        }
        self.unary(UnaryOp::Logit {
            eps: Float(eps.unwrap_or(-1.0)),
        })
    }
    /// `torch.lerp(self, end, weight)` with a Python-number weight, in
    /// PyTorch's two-sided form (exact at weight 0 and 1).
    pub fn lerp(&self, end: &Tensor, weight: f64) -> Result<Tensor> {
        let d = end.sub(self)?;
        if weight.abs() < 0.5 {
            self.add(&d.binary_scalar(BinaryOp::Mul, weight, false)?)
        } else {
            end.sub(&d.binary_scalar(BinaryOp::Mul, 1.0 - weight, false)?)
        }
    }
    /// `torch.lerp(self, end, weight)` with a tensor weight (broadcast).
    pub fn lerp_tensor(&self, end: &Tensor, weight: &Tensor) -> Result<Tensor> {
        let d = end.sub(self)?;
        let small = weight.abs()?.binary_scalar(BinaryOp::Lt, 0.5, false)?;
        let near = self.add(&weight.mul(&d)?)?;
        let one_minus = weight.binary_scalar(BinaryOp::Sub, 1.0, true)?;
        let far = end.sub(&d.mul(&one_minus)?)?;
        Tensor::where_(&small, &near, &far)
    }
    /// `torch.addcmul(self, t1, t2, value)`: `self + value * t1 * t2`.
    pub fn addcmul(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
        let p = t1.mul(t2)?;
        let p = if value == 1.0 {
            p
        } else {
            p.binary_scalar(BinaryOp::Mul, value, false)?
        };
        self.add(&p)
    }
    /// `torch.addcdiv(self, t1, t2, value)`: `self + value * t1 / t2`.
    pub fn addcdiv(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
        let q = t1.div(t2)?;
        let q = if value == 1.0 {
            q
        } else {
            q.binary_scalar(BinaryOp::Mul, value, false)?
        };
        self.add(&q)
    }
    /// `torch.float_power(self, exponent)`: both in f64, the result f64.
    pub fn float_power(&self, exponent: &Tensor) -> Result<Tensor> {
        self.to_dtype(DType::F64)?
            .pow(&exponent.to_dtype(DType::F64)?)
    }
    /// `torch.float_power(self, exponent)` with a Python-number exponent.
    pub fn float_power_scalar(&self, exponent: f64) -> Result<Tensor> {
        self.to_dtype(DType::F64)?
            .binary_scalar(BinaryOp::Pow, exponent, false)
    }
}
