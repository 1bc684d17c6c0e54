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
            _ => None,
        };
        if let Some(s) = simple {
            self.node(s, &[x], &[out], vec![]);
            return Ok(());
        }
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
            other => return Err(unsupported(&format!("{other:?}").to_lowercase())),
        }
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
