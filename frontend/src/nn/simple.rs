//! Parameter-free layers: activations, dropout, pooling, Flatten, Identity.

use super::{Entry, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::op::pool::Pool2dParams;
use kiln_ir::{bail, Float, Result, UnaryOp};
use std::sync::atomic::{AtomicBool, Ordering};

/// A pointwise activation as a module: ReLU, GELU, SiLU, Tanh, Sigmoid,
/// Hardswish, Hardsigmoid, LeakyReLU, ELU, Softplus.
pub struct Activation {
    op: UnaryOp,
}

impl Activation {
    pub fn relu() -> Self {
        Activation { op: UnaryOp::Relu }
    }
    /// `nn.GELU(approximate='none' | 'tanh')`.
    pub fn gelu(tanh_approx: bool) -> Self {
        Activation {
            op: if tanh_approx {
                UnaryOp::GeluTanh
            } else {
                UnaryOp::Gelu
            },
        }
    }
    pub fn silu() -> Self {
        Activation { op: UnaryOp::Silu }
    }
    pub fn tanh() -> Self {
        Activation { op: UnaryOp::Tanh }
    }
    pub fn sigmoid() -> Self {
        Activation {
            op: UnaryOp::Sigmoid,
        }
    }
    /// `nn.Hardswish()`: x * relu6(x + 3) / 6.
    pub fn hardswish() -> Self {
        Activation {
            op: UnaryOp::Hardswish,
        }
    }
    /// `nn.Hardsigmoid()`: relu6(x + 3) / 6.
    pub fn hardsigmoid() -> Self {
        Activation {
            op: UnaryOp::Hardsigmoid,
        }
    }
    pub fn leaky_relu(slope: f64) -> Self {
        Activation {
            op: UnaryOp::LeakyRelu {
                slope: Float(slope),
            },
        }
    }
    pub fn elu(alpha: f64) -> Self {
        Activation {
            op: UnaryOp::Elu {
                alpha: Float(alpha),
            },
        }
    }
    pub fn softplus(beta: f64, threshold: f64) -> Self {
        Activation {
            op: UnaryOp::Softplus {
                beta: Float(beta),
                threshold: Float(threshold),
            },
        }
    }
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| x.unary(self.op))
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        match self.op {
            UnaryOp::Relu => "ReLU()".into(),
            UnaryOp::Gelu => "GELU(approximate='none')".into(),
            UnaryOp::GeluTanh => "GELU(approximate='tanh')".into(),
            UnaryOp::Silu => "SiLU()".into(),
            UnaryOp::Tanh => "Tanh()".into(),
            UnaryOp::Sigmoid => "Sigmoid()".into(),
            UnaryOp::Hardswish => "Hardswish()".into(),
            UnaryOp::Hardsigmoid => "Hardsigmoid()".into(),
            UnaryOp::LeakyRelu { slope } => format!("LeakyReLU(negative_slope={slope})"),
            UnaryOp::Elu { alpha } => format!("ELU(alpha={alpha})"),
            UnaryOp::Softplus { beta, threshold } => {
                format!("Softplus(beta={beta}, threshold={threshold})")
            }
            other => format!("{other}()"),
        }
    }
}

/// `nn.Dropout(p)`: in training zeroes elements with probability `p` (from the
/// seeded default generator) and scales the rest by 1/(1-p); identity in eval.
pub struct Dropout {
    pub p: f64,
    training: AtomicBool,
}

impl Dropout {
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            bail!("Dropout", "probability must be in [0, 1], got {p}");
        }
        Ok(Dropout {
            p,
            training: AtomicBool::new(true),
        })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            if !self.training.load(Ordering::Relaxed) || self.p == 0.0 {
                return Ok(x.clone());
            }
            if self.p == 1.0 {
                return x.binary_scalar(kiln_ir::BinaryOp::Mul, 0.0, false);
            }
            // a graph input drawn afresh on every compiled call
            let keep = crate::compile::trace::random_input(
                crate::compile::trace::RandomSpec::Bernoulli {
                    dims: x.dims().to_vec(),
                    p: 1.0 - self.p,
                    dtype: x.dtype(),
                },
            )?;
            x.mul(&keep)?
                .binary_scalar(kiln_ir::BinaryOp::Mul, 1.0 / (1.0 - self.p), false)
        })
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn set_own_training(&self, on: bool) {
        self.training.store(on, Ordering::Relaxed)
    }
    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }
    fn describe(&self) -> String {
        format!("Dropout(p={}, inplace=False)", self.p)
    }
}

/// 2-D pooling layers.
pub enum Pool2d {
    Max(Pool2dParams),
    Avg {
        params: Pool2dParams,
        count_include_pad: bool,
    },
    AdaptiveAvg([usize; 2]),
    AdaptiveMax([usize; 2]),
}

impl Module for Pool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| match self {
            Pool2d::Max(p) => F::max_pool2d_values(x, p),
            Pool2d::Avg {
                params,
                count_include_pad,
            } => F::avg_pool2d(x, params, *count_include_pad, None),
            Pool2d::AdaptiveAvg(o) => F::adaptive_avg_pool2d(x, *o),
            Pool2d::AdaptiveMax(o) => Ok(F::adaptive_max_pool2d(x, *o)?.0),
        })
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        let out = |o: &[usize; 2]| {
            if o[0] == o[1] {
                o[0].to_string()
            } else {
                format!("({}, {})", o[0], o[1])
            }
        };
        match self {
            Pool2d::Max(p) => format!(
                "MaxPool2d(kernel_size={:?}, stride={:?}, padding={:?})",
                p.kernel, p.stride, p.padding
            ),
            Pool2d::Avg { params: p, .. } => format!(
                "AvgPool2d(kernel_size={:?}, stride={:?}, padding={:?})",
                p.kernel, p.stride, p.padding
            ),
            Pool2d::AdaptiveAvg(o) => format!("AdaptiveAvgPool2d(output_size={})", out(o)),
            Pool2d::AdaptiveMax(o) => format!("AdaptiveMaxPool2d(output_size={})", out(o)),
        }
    }
}

/// `nn.Flatten(start_dim=1, end_dim=-1)`.
pub struct Flatten {
    pub start: i64,
    pub end: i64,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| x.flatten(self.start, self.end))
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        format!("Flatten(start_dim={}, end_dim={})", self.start, self.end)
    }
}

/// `nn.Identity()`.
pub struct Identity;

impl Module for Identity {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| Ok(x.clone()))
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        "Identity()".into()
    }
}
