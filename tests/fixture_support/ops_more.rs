//! Maps the `ops_more` suite's cases (clamps, activations, rounding,
//! predicates, special functions, bitwise/logical ops, lerp, addcmul, ...)
//! onto kiln's API.

use super::Case;
use kiln::functional as F;
use kiln::{Result, Tensor};
use serde_json::Value;

pub(super) fn role<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Option<&'a Tensor> {
    c.roles.iter().position(|x| x == r).map(|i| &inputs[i])
}

pub(super) fn req<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Result<&'a Tensor> {
    role(c, inputs, r).ok_or_else(|| kiln::Error::op(&c.op, format!("no input with role {r}")))
}

/// A number attribute (`None` for null or absent).
fn num(a: &Value, key: &str) -> Option<f64> {
    match &a[key] {
        Value::String(s) if s == "inf" => Some(f64::INFINITY),
        Value::String(s) if s == "-inf" => Some(f64::NEG_INFINITY),
        v => v.as_f64(),
    }
}

fn num_or(a: &Value, key: &str, default: f64) -> f64 {
    num(a, key).unwrap_or(default)
}

/// The case's result, or `None` when `op` is not one of this suite's ops.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let r = match unary(c, op, inputs) {
        Some(r) => r,
        None => multi(c, op, inputs)?,
    };
    Some(r.map(|t| vec![t]))
}

fn unary(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Tensor>> {
    let a = &c.attrs;
    // an op without an `input` is none of this suite's
    let x = role(c, inputs, "input")?;
    Some(match op {
        "relu6" => F::relu6(x),
        "hardswish" => F::hardswish(x),
        "hardsigmoid" => F::hardsigmoid(x),
        "mish" => F::mish(x),
        "selu" => F::selu(x),
        "logsigmoid" => F::logsigmoid(x),
        "softsign" => F::softsign(x),
        "tanhshrink" => F::tanhshrink(x),
        "hardtanh" => F::hardtanh(x, num_or(a, "min_val", -1.0), num_or(a, "max_val", 1.0)),
        "celu" => F::celu(x, num_or(a, "alpha", 1.0)),
        "threshold" => F::threshold(x, num_or(a, "threshold", 0.0), num_or(a, "value", 0.0)),
        "hardshrink" => F::hardshrink(x, num_or(a, "lambd", 0.5)),
        "softshrink" => F::softshrink(x, num_or(a, "lambd", 0.5)),
        "round" => x.round_decimals(num_or(a, "decimals", 0.0) as i64),
        "ceil" => x.ceil(),
        "floor" => x.floor(),
        "trunc" => x.trunc(),
        "frac" => x.frac(),
        "sign" => x.sign(),
        "isnan" => x.isnan(),
        "isinf" => x.isinf(),
        "isfinite" => x.isfinite(),
        "isposinf" => x.isposinf(),
        "isneginf" => x.isneginf(),
        "nan_to_num" => x.nan_to_num(num_or(a, "nan", 0.0), num(a, "posinf"), num(a, "neginf")),
        "log2" => x.log2(),
        "log10" => x.log10(),
        "exp2" => x.exp2(),
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "atan" => x.atan(),
        "erfinv" => x.erfinv(),
        "log1p" => x.log1p(),
        "expm1" => x.expm1(),
        "erf" => x.erf(),
        "erfc" => x.erfc(),
        "tan" => x.tan(),
        "logit" => x.logit(num(a, "eps")),
        "logical_not" => x.logical_not(),
        "bitwise_not" => x.bitwise_not(),
        _ => return None,
    })
}

/// Ops with tensor bounds, weights or a second operand.
fn multi(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Tensor>> {
    let a = &c.attrs;
    let x = role(c, inputs, "input")?;
    let go = || -> Result<Option<Tensor>> {
        let other = || req(c, inputs, "other");
        Ok(Some(match op {
            "clamp" | "clip" | "clamp_min" => {
                let (tmin, tmax) = (role(c, inputs, "min"), role(c, inputs, "max"));
                if tmin.is_some() || tmax.is_some() {
                    x.clamp_tensor(tmin, tmax)?
                } else {
                    x.clamp(num(a, "min"), num(a, "max"))?
                }
            }
            "atan2" => x.atan2(other()?)?,
            "hypot" => x.hypot(other()?)?,
            "copysign" => x.copysign(other()?)?,
            "xlogy" => x.xlogy(other()?)?,
            "logical_and" => x.logical_and(other()?)?,
            "logical_or" => x.logical_or(other()?)?,
            "logical_xor" => x.logical_xor(other()?)?,
            "bitwise_and" => x.bitwise_and(other()?)?,
            "bitwise_or" => x.bitwise_or(other()?)?,
            "bitwise_xor" => x.bitwise_xor(other()?)?,
            "lerp" => {
                let end = req(c, inputs, "end")?;
                match role(c, inputs, "weight") {
                    Some(w) => x.lerp_tensor(end, w)?,
                    None => x.lerp(end, num_or(a, "weight", 0.5))?,
                }
            }
            "addcmul" | "addcdiv" => {
                let (t1, t2) = (req(c, inputs, "tensor1")?, req(c, inputs, "tensor2")?);
                let v = num_or(a, "value", 1.0);
                if op == "addcmul" {
                    x.addcmul(t1, t2, v)?
                } else {
                    x.addcdiv(t1, t2, v)?
                }
            }
            "float_power" => match role(c, inputs, "exponent") {
                Some(e) => x.float_power(e)?,
                None => x.float_power_scalar(num_or(a, "exponent", 1.0))?,
            },
            _ => return Ok(None),
        }))
    };
    go().transpose()
}
