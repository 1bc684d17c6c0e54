//! `torch.nn.functional`'s pointwise activations and `torch.*`'s pointwise
//! functions as free functions (each forwards to the `Tensor` method of the
//! same name; see `ops/elementwise.rs`).
//!
//! ```
//! # use kiln_frontend::{functional as F, Tensor};
//! let x = Tensor::from_vec(vec![-7.0f32, 0.0, 7.0], &[3])?;
//! assert_eq!(F::relu6(&x)?.to_vec::<f32>()?, vec![0.0, 0.0, 6.0]);
//! # Ok::<(), kiln_ir::Error>(())
//! ```

use crate::Tensor;
use kiln_ir::Result;

macro_rules! forward_unary {
    ($($name:ident),* $(,)?) => {
        $( #[doc = concat!("`", stringify!($name), "(x)`, as `Tensor::", stringify!($name), "`.")]
        pub fn $name(x: &Tensor) -> Result<Tensor> {
            x.$name()
        } )*
    };
}

macro_rules! forward_binary {
    ($($name:ident),* $(,)?) => {
        $( #[doc = concat!("`", stringify!($name), "(a, b)`, as `Tensor::", stringify!($name), "`.")]
        pub fn $name(a: &Tensor, b: &Tensor) -> Result<Tensor> {
            a.$name(b)
        } )*
    };
}

forward_unary!(
    relu,
    relu6,
    hardswish,
    hardsigmoid,
    mish,
    selu,
    logsigmoid,
    softsign,
    tanhshrink,
    silu,
    sigmoid,
    tanh,
    round,
    ceil,
    floor,
    trunc,
    frac,
    sign,
    isnan,
    isinf,
    isfinite,
    isposinf,
    isneginf,
    log2,
    log10,
    exp2,
    sinh,
    cosh,
    tan,
    asin,
    acos,
    atan,
    erf,
    erfc,
    erfinv,
    log1p,
    expm1,
    bitwise_not,
    logical_not,
);

forward_binary!(
    atan2,
    hypot,
    copysign,
    xlogy,
    logical_and,
    logical_or,
    logical_xor,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    float_power,
);

/// `F.hardtanh(x, min_val, max_val)`.
pub fn hardtanh(x: &Tensor, min_val: f64, max_val: f64) -> Result<Tensor> {
    x.hardtanh(min_val, max_val)
}
/// `F.celu(x, alpha)`.
pub fn celu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    x.celu(alpha)
}
/// `F.threshold(x, threshold, value)`.
pub fn threshold(x: &Tensor, threshold: f64, value: f64) -> Result<Tensor> {
    x.threshold(threshold, value)
}
/// `F.hardshrink(x, lambd)`.
pub fn hardshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    x.hardshrink(lambd)
}
/// `F.softshrink(x, lambd)`.
pub fn softshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    x.softshrink(lambd)
}
/// `torch.clamp(x, min, max)` with number bounds.
pub fn clamp(x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    x.clamp(min, max)
}
/// `torch.clip`: `clamp`.
pub fn clip(x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    x.clamp(min, max)
}
/// `torch.nan_to_num(x, nan, posinf, neginf)`.
pub fn nan_to_num(
    x: &Tensor,
    nan: f64,
    posinf: Option<f64>,
    neginf: Option<f64>,
) -> Result<Tensor> {
    x.nan_to_num(nan, posinf, neginf)
}
/// `torch.logit(x, eps)`.
pub fn logit(x: &Tensor, eps: Option<f64>) -> Result<Tensor> {
    x.logit(eps)
}
/// `torch.lerp(x, end, weight)`.
pub fn lerp(x: &Tensor, end: &Tensor, weight: f64) -> Result<Tensor> {
    x.lerp(end, weight)
}
/// `torch.addcmul(x, t1, t2, value=value)`.
pub fn addcmul(x: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    x.addcmul(t1, t2, value)
}
/// `torch.addcdiv(x, t1, t2, value=value)`.
pub fn addcdiv(x: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    x.addcdiv(t1, t2, value)
}
