//! Elementwise kiln ops as ONNX nodes: unary ops (some as a short chain:
//! rsqrt, silu, gelu before opset 20) and the binary ops' ONNX names.

use super::{attr_float, unsupported, Writer};
use crate::ir::{BinaryOp, UnaryOp};
use crate::{Result, Tensor};

impl Writer<'_> {
    pub(super) fn unary(&mut self, u: &UnaryOp, x: &str, out: &str) -> Result<()> {
        let simple = match u {
            UnaryOp::Neg => Some("Neg"),
            UnaryOp::Abs => Some("Abs"),
            UnaryOp::Exp => Some("Exp"),
            UnaryOp::Log => Some("Log"),
            UnaryOp::Sqrt => Some("Sqrt"),
            UnaryOp::Reciprocal => Some("Reciprocal"),
            UnaryOp::Sin => Some("Sin"),
            UnaryOp::Cos => Some("Cos"),
            UnaryOp::Tanh => Some("Tanh"),
            UnaryOp::Erf => Some("Erf"),
            UnaryOp::Floor => Some("Floor"),
            UnaryOp::Not => Some("Not"),
            UnaryOp::Sigmoid => Some("Sigmoid"),
            UnaryOp::Relu => Some("Relu"),
            UnaryOp::Ceil => Some("Ceil"),
            UnaryOp::Sign => Some("Sign"),
            UnaryOp::Softsign => Some("Softsign"),
            UnaryOp::Selu => Some("Selu"),
            UnaryOp::Hardswish if self.opset >= 14 => Some("HardSwish"),
            UnaryOp::Tan => Some("Tan"),
            UnaryOp::Asin => Some("Asin"),
            UnaryOp::Acos => Some("Acos"),
            UnaryOp::Atan => Some("Atan"),
            UnaryOp::Sinh => Some("Sinh"),
            UnaryOp::Cosh => Some("Cosh"),
            UnaryOp::IsNan => Some("IsNaN"),
            UnaryOp::Round { decimals } if decimals.0 == 0.0 => Some("Round"),
            _ => None,
        };
        if let Some(s) = simple {
            self.node(s, &[x], &[out], vec![]);
            return Ok(());
        }
        if self.unary_with_attrs(u, x, out)? || self.unary_chain(u, x, out)? {
            return Ok(());
        }
        Err(unsupported(&format!("{u:?}").to_lowercase()))
    }

    /// Unary ops written as one ONNX op with attributes (or Clip);
    /// `Ok(false)` for others.
    fn unary_with_attrs(&mut self, u: &UnaryOp, x: &str, out: &str) -> Result<bool> {
        match u {
            UnaryOp::LeakyRelu { slope } => self.node(
                "LeakyRelu",
                &[x],
                &[out],
                vec![attr_float("alpha", slope.0)],
            ),
            UnaryOp::Elu { alpha } => {
                self.node("Elu", &[x], &[out], vec![attr_float("alpha", alpha.0)])
            }
            UnaryOp::Square => self.node("Mul", &[x, x], &[out], vec![]),
            UnaryOp::Hardsigmoid => self.node(
                "HardSigmoid",
                &[x],
                &[out],
                vec![attr_float("alpha", 1.0 / 6.0), attr_float("beta", 0.5)],
            ),
            UnaryOp::Hardswish => {
                let s = self.tmp("hardsigmoid");
                let attrs = vec![attr_float("alpha", 1.0 / 6.0), attr_float("beta", 0.5)];
                self.node("HardSigmoid", &[x], &[&s], attrs);
                self.node("Mul", &[x, &s], &[out], vec![]);
            }
            UnaryOp::Relu6 => self.clip(x, out, 0.0, 6.0)?,
            UnaryOp::Hardtanh { min_val, max_val } => self.clip(x, out, min_val.0, max_val.0)?,
            UnaryOp::Clamp { min, max } => self.clip(x, out, min.0, max.0)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Unary ops written as a short chain of ONNX ops (or one op at a
    /// later opset); `Ok(false)` for others.
    fn unary_chain(&mut self, u: &UnaryOp, x: &str, out: &str) -> Result<bool> {
        match u {
            UnaryOp::Log1p => {
                let one = self.like_const(x, 1.0)?;
                let s = self.tmp("plus_one");
                self.node("Add", &[x, &one], &[&s], vec![]);
                self.node("Log", &[&s], &[out], vec![]);
            }
            UnaryOp::Expm1 => {
                let one = self.like_const(x, 1.0)?;
                let s = self.tmp("exp");
                self.node("Exp", &[x], &[&s], vec![]);
                self.node("Sub", &[&s, &one], &[out], vec![]);
            }
            UnaryOp::Mish if self.opset >= 18 => self.node("Mish", &[x], &[out], vec![]),
            UnaryOp::Mish => {
                let (sp, th) = (self.tmp("softplus"), self.tmp("tanh"));
                self.node("Softplus", &[x], &[&sp], vec![]);
                self.node("Tanh", &[&sp], &[&th], vec![]);
                self.node("Mul", &[x, &th], &[out], vec![]);
            }
            UnaryOp::GeluTanh if self.opset >= 20 => self.node(
                "Gelu",
                &[x],
                &[out],
                vec![super::attr_string("approximate", "tanh")],
            ),
            UnaryOp::GeluTanh => {
                // x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
                let c = |w: &mut Self, v: f32| {
                    w.constant("c", &Tensor::from_vec(vec![v], &[]).unwrap())
                };
                let (k, a, one, half) = (
                    c(self, (2.0 / std::f32::consts::PI).sqrt())?,
                    c(self, 0.044715)?,
                    c(self, 1.0)?,
                    c(self, 0.5)?,
                );
                let t: Vec<String> = (0..8).map(|_| self.tmp("g")).collect();
                self.node("Mul", &[x, x], &[&t[0]], vec![]);
                self.node("Mul", &[&t[0], x], &[&t[1]], vec![]);
                self.node("Mul", &[&t[1], &a], &[&t[2]], vec![]);
                self.node("Add", &[x, &t[2]], &[&t[3]], vec![]);
                self.node("Mul", &[&t[3], &k], &[&t[4]], vec![]);
                self.node("Tanh", &[&t[4]], &[&t[5]], vec![]);
                self.node("Add", &[&t[5], &one], &[&t[6]], vec![]);
                self.node("Mul", &[x, &half], &[&t[7]], vec![]);
                self.node("Mul", &[&t[7], &t[6]], &[out], vec![]);
            }
            UnaryOp::Rsqrt => {
                let s = self.tmp("sqrt");
                self.node("Sqrt", &[x], &[&s], vec![]);
                self.node("Reciprocal", &[&s], &[out], vec![]);
            }
            UnaryOp::Silu => {
                let s = self.tmp("sigmoid");
                self.node("Sigmoid", &[x], &[&s], vec![]);
                self.node("Mul", &[x, &s], &[out], vec![]);
            }
            UnaryOp::Softplus { beta, threshold } if beta.0 == 1.0 && threshold.0 >= 20.0 => {
                self.node("Softplus", &[x], &[out], vec![]);
            }
            UnaryOp::Gelu if self.opset >= 20 => self.node("Gelu", &[x], &[out], vec![]),
            UnaryOp::Gelu => {
                // x/2 * (1 + erf(x / sqrt 2)) in f32, as the primitive chain
                let c = |w: &mut Self, v: f32| {
                    w.constant("c", &Tensor::from_vec(vec![v], &[]).unwrap())
                };
                let (r2, one, half) = (
                    c(self, std::f32::consts::FRAC_1_SQRT_2)?,
                    c(self, 1.0)?,
                    c(self, 0.5)?,
                );
                let (a, b, d, e) = (self.tmp("g"), self.tmp("g"), self.tmp("g"), self.tmp("g"));
                self.node("Mul", &[x, &r2], &[&a], vec![]);
                self.node("Erf", &[&a], &[&b], vec![]);
                self.node("Add", &[&b, &one], &[&d], vec![]);
                self.node("Mul", &[x, &half], &[&e], vec![]);
                self.node("Mul", &[&e, &d], &[out], vec![]);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Writer<'_> {
    /// A 0-d constant of `x`'s dtype (found by its name's graph value).
    fn like_const(&mut self, x: &str, v: f64) -> Result<String> {
        let dt = self.dtype_of(x);
        self.constant("c", &Tensor::from_vec(vec![v], &[])?.to_dtype(dt)?)
    }

    /// `Clip(x, min, max)`, an infinite bound left out (opset 11 takes
    /// the bounds as inputs).
    fn clip(&mut self, x: &str, out: &str, min: f64, max: f64) -> Result<()> {
        let lo = if min.is_finite() {
            self.like_const(x, min)?
        } else {
            String::new()
        };
        let hi = if max.is_finite() {
            self.like_const(x, max)?
        } else {
            String::new()
        };
        let mut ins = vec![x, lo.as_str()];
        if !hi.is_empty() {
            ins.push(&hi);
        }
        self.node("Clip", &ins, &[out], vec![]);
        Ok(())
    }
}

pub(super) fn binary_name(b: BinaryOp) -> Option<&'static str> {
    Some(match b {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Pow => "Pow",
        BinaryOp::Maximum => "Max",
        BinaryOp::Minimum => "Min",
        BinaryOp::Eq => "Equal",
        BinaryOp::Lt => "Less",
        BinaryOp::Le => "LessOrEqual",
        BinaryOp::Gt => "Greater",
        BinaryOp::Ge => "GreaterOrEqual",
        BinaryOp::And => "And",
        BinaryOp::Or => "Or",
        _ => return None,
    })
}
