//! [`Op::infer`]'s rules for the extern-kernel families: matmul, linear
//! and the convolutions, the 2-D poolings, and the losses.

use super::conv;
use super::infer::{self, Meta};
use super::matmul;
use super::pool;
use super::vocab_infer::{check_shape, exactly, need, one};
use super::Op;
use crate::graph::Reduction;
use crate::shape::{fmt_dims, Dims};
use crate::{bail, DType, Result};

/// The result of a class loss (cross_entropy, nll_loss) on `input` (N, C, d...)
/// or (C) and `target`: per sample for `reduction=none`, else 0-dim.
fn class_loss(
    name: &str,
    ins: &[Meta],
    reduction: Reduction,
    has_weight: bool,
    allow_probs: bool,
) -> Result<Vec<Meta>> {
    exactly(name, ins, 2 + has_weight as usize)?;
    let (x, t) = (&ins[0], &ins[1]);
    infer::require_float(name, x)?;
    if x.dims.is_empty() {
        bail!(
            name,
            "expected an input of shape (N, C, *) or (C), got a 0-dim tensor"
        );
    }
    let cdim = usize::from(x.dims.len() >= 2);
    let c = x.dims[cdim];
    let mut per_sample = x.dims.clone();
    per_sample.remove(cdim);
    let probs = allow_probs && t.dims == x.dims && t.dtype.is_float();
    if !probs {
        if t.dims != per_sample {
            bail!(
                name,
                "target has shape {} but the input {} needs class indices of shape {}{}",
                fmt_dims(&t.dims),
                fmt_dims(&x.dims),
                fmt_dims(&per_sample),
                if allow_probs {
                    " or class probabilities of the input's shape"
                } else {
                    ""
                }
            );
        }
        if t.dtype.is_float() || t.dtype == DType::Bool {
            bail!(
                name,
                "class-index target must be an integer tensor, got {}",
                t.dtype.name()
            );
        }
    }
    if has_weight {
        check_shape(name, "weight", &ins[2], &[c])?;
    }
    one(Meta {
        dtype: x.dtype,
        dims: if reduction == Reduction::None {
            per_sample
        } else {
            Dims::new()
        },
    })
}

impl Op {
    /// Inference for matmul, linear and the convolutions.
    pub(super) fn infer_extern_kernel(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        match self {
            Op::Matmul => {
                need(&name, ins, 2)?;
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: matmul::matmul_shape(&ins[0].dims, &ins[1].dims)?,
                })
            }
            Op::Linear => {
                need(&name, ins, 2)?;
                let bias = ins.get(2).map(|b| b.dims.as_slice());
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: matmul::linear_shape(&ins[0].dims, &ins[1].dims, bias)?,
                })
            }
            Op::QuantizedLinear { .. } => one(super::quantized::quantized_linear_meta(ins)?),
            Op::Conv { params, spatial } => {
                need(&name, ins, 2)?;
                let op = if *spatial == 1 { "conv1d" } else { "conv2d" };
                let bias = ins.get(2).map(|b| b.dims.as_slice());
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: conv::conv_shape(op, &ins[0].dims, &ins[1].dims, bias, params)?,
                })
            }
            Op::ConvTranspose2d(p) => {
                need(&name, ins, 2)?;
                let bias = ins.get(2).map(|b| b.dims.as_slice());
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: conv::conv_transpose2d_shape(&ins[0].dims, &ins[1].dims, bias, p)?,
                })
            }
            Op::Conv2dWeightGrad { params, kernel } => {
                need(&name, ins, 2)?;
                let (x, dy) = (&ins[0].dims, &ins[1].dims);
                if x.len() != 4 || dy.len() != 4 || params.groups == 0 {
                    bail!(
                        name,
                        "expects 4-D input and output gradient, got {} and {}",
                        fmt_dims(x),
                        fmt_dims(dy)
                    );
                }
                if ins[0].dtype != ins[1].dtype {
                    bail!(
                        name,
                        "input is {} but the output gradient is {}",
                        ins[0].dtype,
                        ins[1].dtype
                    );
                }
                let w = [dy[1], x[1] / params.groups, kernel[0], kernel[1]];
                let g = conv::conv_geometry(&name, x, &w, None, params)?;
                if g.out_shape().as_slice() != dy.as_slice() {
                    bail!(
                        name,
                        "output gradient {} does not match the convolution's output {}",
                        fmt_dims(dy),
                        fmt_dims(&g.out_shape())
                    );
                }
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: w.iter().copied().collect(),
                })
            }
            _ => bail!(name, "not handled by the extern_kernel rule"),
        }
    }

    /// Inference for the 2-D poolings and their backward.
    pub(super) fn infer_pooling(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        match self {
            Op::MaxPool2d(p) => {
                need(&name, ins, 1)?;
                let d = pool::pool2d_shape("max_pool2d", &ins[0].dims, p)?;
                Ok(vec![
                    Meta {
                        dtype: ins[0].dtype,
                        dims: d.clone(),
                    },
                    Meta {
                        dtype: DType::I64,
                        dims: d,
                    },
                ])
            }
            Op::AvgPool2d { params, .. } => {
                need(&name, ins, 1)?;
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: pool::pool2d_shape("avg_pool2d", &ins[0].dims, params)?,
                })
            }
            Op::AvgPool2dBackward {
                input_size, params, ..
            } => {
                need(&name, ins, 1)?;
                let out = match params {
                    Some(p) => pool::pool2d_shape(&name, input_size, p)?,
                    None => {
                        let o = &ins[0].dims;
                        let hw = [o[o.len().saturating_sub(2)], o[o.len().saturating_sub(1)]];
                        pool::adaptive_pool2d_geometry(&name, input_size, hw)?.out_shape()
                    }
                };
                if out.as_slice() != ins[0].dims.as_slice() {
                    bail!(
                        name,
                        "output gradient {} does not match the pooling's output {} for input {}",
                        fmt_dims(&ins[0].dims),
                        fmt_dims(&out),
                        fmt_dims(input_size)
                    );
                }
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: input_size.iter().copied().collect(),
                })
            }
            Op::AdaptiveAvgPool2d(o) | Op::AdaptiveMaxPool2d(o) => {
                need(&name, ins, 1)?;
                let d = pool::adaptive_pool2d_shape(&name, &ins[0].dims, *o)?;
                let mut out = vec![Meta {
                    dtype: ins[0].dtype,
                    dims: d.clone(),
                }];
                if matches!(self, Op::AdaptiveMaxPool2d(_)) {
                    out.push(Meta {
                        dtype: DType::I64,
                        dims: d,
                    });
                }
                Ok(out)
            }
            _ => bail!(name, "not handled by the pooling rule"),
        }
    }

    /// Inference for the losses.
    pub(super) fn infer_loss(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        let x = ins.first();
        match self {
            Op::CrossEntropy {
                reduction,
                has_weight,
                ..
            } => class_loss(&name, ins, *reduction, *has_weight, true),
            Op::NllLoss {
                reduction,
                has_weight,
                ..
            } => class_loss(&name, ins, *reduction, *has_weight, false),
            Op::PairLoss {
                name: kind,
                reduction,
                has_weight,
                has_pos_weight,
            } => {
                if *has_weight && !kind.starts_with("bce") {
                    bail!(name, "takes no weight");
                }
                if *has_pos_weight && *kind != "bce_with_logits" {
                    bail!(name, "takes no pos_weight");
                }
                exactly(
                    &name,
                    ins,
                    2 + *has_weight as usize + *has_pos_weight as usize,
                )?;
                let dims = crate::shape::broadcast_shapes(&name, &ins[0].dims, &ins[1].dims)?;
                one(Meta {
                    dtype: x.map(|m| m.dtype).unwrap_or(DType::F32),
                    dims: if *reduction == Reduction::None {
                        dims
                    } else {
                        Dims::new()
                    },
                })
            }
            _ => bail!(name, "not handled by the loss rule"),
        }
    }
}
