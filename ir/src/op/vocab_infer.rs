//! [`Op::infer`]: output types and shapes of every op, dispatching to the
//! same inference and argument checks the eager path calls directly.

use super::infer::{self, Arg, Meta};
use super::{embedding, view, Layout, Op};
use crate::shape::{fmt_dims, Dims};
use crate::{bail, DType, Result};

pub(super) fn one(m: Meta) -> Result<Vec<Meta>> {
    Ok(vec![m])
}

pub(super) fn need(op: &str, ins: &[Meta], n: usize) -> Result<()> {
    if ins.len() < n {
        bail!(op, "expected at least {n} tensor inputs, got {}", ins.len());
    }
    Ok(())
}

/// Exactly `n` operands: the required ones plus the optional ones the op's
/// presence flags declare.
pub(super) fn exactly(op: &str, ins: &[Meta], n: usize) -> Result<()> {
    if ins.len() != n {
        bail!(
            op,
            "expected {n} tensor inputs (as its has_* flags declare), got {}",
            ins.len()
        );
    }
    Ok(())
}

pub(super) fn check_shape(op: &str, what: &str, m: &Meta, want: &[usize]) -> Result<()> {
    if m.dims.as_slice() != want {
        bail!(
            op,
            "{what} has shape {} but {} was expected",
            fmt_dims(&m.dims),
            fmt_dims(want)
        );
    }
    Ok(())
}

impl Op {
    /// Output types and shapes for `ins`, with the op's argument checks
    /// (one rule per op family below).
    pub fn infer(&self, ins: &[Meta]) -> Result<Vec<Meta>> {
        let name = self.name();
        match self {
            Op::Unary { .. }
            | Op::Binary { .. }
            | Op::BinaryScalar { .. }
            | Op::Where
            | Op::Cast { .. } => self.infer_pointwise(&name, ins),
            Op::Reduce { .. }
            | Op::Mean { .. }
            | Op::Var { .. }
            | Op::Std { .. }
            | Op::LogSumExp { .. }
            | Op::LseParts { .. }
            | Op::Moments { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. } => self.infer_reduction(&name, ins),
            Op::LayerNorm { .. } | Op::GroupNorm { .. } | Op::BatchNorm { .. } => {
                self.infer_norm(&name, ins)
            }
            Op::Matmul
            | Op::Linear
            | Op::Conv { .. }
            | Op::ConvTranspose2d { .. }
            | Op::Conv2dWeightGrad { .. }
            | Op::QuantizedLinear { .. } => self.infer_extern_kernel(&name, ins),
            Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. }
            | Op::AvgPool2dBackward { .. }
            | Op::AdaptiveAvgPool2d { .. }
            | Op::AdaptiveMaxPool2d { .. } => self.infer_pooling(&name, ins),
            Op::Attention(p) => super::attention::infer_attention(p, ins),
            Op::AttentionBackward(p) => super::attention::infer_attention_backward(p, ins),
            Op::Embedding
            | Op::View { .. }
            | Op::Permute { .. }
            | Op::Expand { .. }
            | Op::Slice { .. }
            | Op::Select { .. }
            | Op::Diagonal { .. }
            | Op::Unfold { .. }
            | Op::Cat { .. }
            | Op::IndexSelect { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::IndexBounds { .. }
            | Op::MaskedFill { .. } => self.infer_data_movement(&name, ins),
            Op::CrossEntropy { .. } | Op::NllLoss { .. } | Op::PairLoss { .. } => {
                self.infer_loss(&name, ins)
            }
        }
    }

    /// Inference for unary, binary, where and cast: broadcasting and dtype promotion.
    fn infer_pointwise(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        let pw = |s: infer::PointwiseSig| {
            one(Meta {
                dtype: s.out,
                dims: s.dims,
            })
        };
        match self {
            Op::Unary(u) => {
                need(&name, ins, 1)?;
                pw(infer::unary(*u, &ins[0])?)
            }
            Op::Binary(b) => {
                need(&name, ins, 2)?;
                pw(infer::binary(
                    *b,
                    Arg::Tensor(&ins[0]),
                    Arg::Tensor(&ins[1]),
                )?)
            }
            Op::BinaryScalar {
                op,
                value,
                reversed,
            } => {
                need(&name, ins, 1)?;
                let (t, s) = (Arg::Tensor(&ins[0]), Arg::Scalar(value.category()));
                pw(if *reversed {
                    infer::binary(*op, s, t)?
                } else {
                    infer::binary(*op, t, s)?
                })
            }
            Op::Where => {
                need(&name, ins, 3)?;
                pw(infer::where_(
                    &ins[0],
                    Arg::Tensor(&ins[1]),
                    Arg::Tensor(&ins[2]),
                )?)
            }
            Op::Cast(d) => {
                need(&name, ins, 1)?;
                one(Meta {
                    dtype: *d,
                    dims: ins[0].dims.clone(),
                })
            }
            _ => bail!(name, "not handled by the pointwise rule"),
        }
    }

    /// Inference for reductions, softmax and the one-pass statistics.
    fn infer_reduction(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        match self {
            Op::Reduce {
                kind,
                dims,
                keepdim,
            } => {
                need(&name, ins, 1)?;
                let rd = infer::reduce_dims(&name, ins[0].dims.len(), Some(dims))?;
                one(infer::reduce(*kind, &ins[0], &rd, *keepdim)?)
            }
            Op::Mean { dims, keepdim }
            | Op::Var { dims, keepdim, .. }
            | Op::Std { dims, keepdim, .. }
            | Op::LogSumExp { dims, keepdim } => {
                need(&name, ins, 1)?;
                infer::require_float(&name, &ins[0])?;
                let rd = infer::reduce_dims(&name, ins[0].dims.len(), Some(dims))?;
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: infer::reduced_shape(&ins[0].dims, &rd, *keepdim),
                })
            }
            Op::LseParts { dims } | Op::Moments { dims, .. } => {
                need(&name, ins, 1)?;
                infer::require_float(&name, &ins[0])?;
                let rd = infer::reduce_dims(&name, ins[0].dims.len(), Some(dims))?;
                let m = Meta {
                    dtype: ins[0].dtype,
                    dims: infer::reduced_shape(&ins[0].dims, &rd, true),
                };
                let n = if matches!(self, Op::LseParts { .. }) {
                    2
                } else {
                    3
                };
                Ok(vec![m; n])
            }
            Op::Softmax { dim } | Op::LogSoftmax { dim } => {
                need(&name, ins, 1)?;
                infer::require_float(&name, &ins[0])?;
                crate::shape::norm_dim(&name, *dim, ins[0].dims.len())?;
                one(ins[0].clone())
            }
            _ => bail!(name, "not handled by the reduction rule"),
        }
    }

    /// Inference for layer, group and batch norm.
    fn infer_norm(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        match self {
            Op::LayerNorm {
                normalized_shape,
                has_weight,
                has_bias,
                ..
            } => {
                exactly(&name, ins, 1 + *has_weight as usize + *has_bias as usize)?;
                let d = &ins[0].dims;
                let k = normalized_shape.len();
                if k == 0 || k > d.len() || d[d.len() - k..] != normalized_shape[..] {
                    bail!(
                        name,
                        "normalized_shape {} does not match the trailing dims of input {}",
                        fmt_dims(normalized_shape),
                        fmt_dims(d)
                    );
                }
                for m in &ins[1..] {
                    check_shape(&name, "weight/bias", m, normalized_shape)?;
                }
                one(ins[0].clone())
            }
            Op::GroupNorm {
                has_weight,
                has_bias,
                ..
            } => self.channel_norm(&name, ins, 1 + *has_weight as usize + *has_bias as usize),
            Op::BatchNorm {
                training,
                has_running_stats,
                has_weight,
                has_bias,
                ..
            } => {
                if !training && !has_running_stats {
                    bail!(
                        name,
                        "running_mean and running_var are needed when training=false"
                    );
                }
                let n = 1 + 2 * *has_running_stats as usize;
                self.channel_norm(&name, ins, n + *has_weight as usize + *has_bias as usize)
            }
            _ => bail!(name, "not handled by the norm rule"),
        }
    }

    /// Inference for views, gathers, scatters, cat and masked_fill.
    fn infer_data_movement(&self, name: &str, ins: &[Meta]) -> Result<Vec<Meta>> {
        match self {
            Op::Embedding => {
                need(&name, ins, 2)?;
                one(Meta {
                    dtype: ins[1].dtype,
                    dims: embedding::embedding_shape(&ins[1].dims, &ins[0].dims, ins[0].dtype)?,
                })
            }
            Op::View(shape) => {
                need(&name, ins, 1)?;
                let dims =
                    view::infer_size("view", shape, ins[0].dims.iter().product(), &ins[0].dims)?;
                one(Meta {
                    dtype: ins[0].dtype,
                    dims,
                })
            }
            Op::Permute(p) => layout_op(ins, |l| view::permute(l, p)),
            Op::Expand(s) => layout_op(ins, |l| view::expand(l, s)),
            Op::Slice {
                dim,
                start,
                stop,
                step,
            } => layout_op(ins, |l| view::slice(l, *dim, *start, *stop, *step)),
            Op::Select { dim, index } => layout_op(ins, |l| view::select(l, *dim, *index)),
            Op::Diagonal { offset, dim1, dim2 } => {
                layout_op(ins, |l| view::diagonal(l, *offset, *dim1, *dim2))
            }
            Op::Unfold { dim, size, step } => {
                layout_op(ins, |l| view::unfold(l, *dim, *size, *step))
            }
            Op::Cat { dim } => {
                need(&name, ins, 1)?;
                let d = crate::shape::norm_dim("cat", *dim, ins[0].dims.len())?;
                let mut dims: Dims = ins[0].dims.clone();
                let mut dtype = ins[0].dtype;
                for (i, m) in ins.iter().enumerate().skip(1) {
                    if m.dims.len() != dims.len()
                        || (0..dims.len()).any(|k| k != d && m.dims[k] != dims[k])
                    {
                        bail!("cat", "tensor {i} has shape {} but tensor 0 has shape {}: sizes must match except in dim {d}", fmt_dims(&m.dims), fmt_dims(&ins[0].dims));
                    }
                    dims[d] += m.dims[d];
                    dtype = crate::promote_types(dtype, m.dtype);
                }
                one(Meta { dtype, dims })
            }
            Op::IndexSelect { dim } => {
                need(&name, ins, 2)?;
                let d = crate::shape::norm_dim(&name, *dim, ins[0].dims.len())?;
                let mut dims = ins[0].dims.clone();
                dims[d] = ins[1].dims.iter().product();
                one(Meta {
                    dtype: ins[0].dtype,
                    dims,
                })
            }
            Op::IndexBounds { op, .. } => {
                need(&name, ins, 1)?;
                if ins[0].dtype.is_float() || ins[0].dtype == DType::Bool {
                    bail!(
                        name,
                        "{op}: index must be an integer tensor, got {}",
                        ins[0].dtype
                    );
                }
                one(ins[0].clone())
            }
            Op::Gather { .. } => {
                need(&name, ins, 2)?;
                one(Meta {
                    dtype: ins[0].dtype,
                    dims: ins[1].dims.clone(),
                })
            }
            Op::ScatterAdd { dim, size } => {
                need(&name, ins, 2)?;
                let (index, src) = (&ins[0], &ins[1]);
                let d = crate::shape::norm_dim(&name, *dim, size.len())?;
                if index.dtype.is_float() || index.dtype == DType::Bool {
                    bail!(name, "index must be an integer tensor, got {}", index.dtype);
                }
                let fits = src.dims.len() == size.len()
                    && src
                        .dims
                        .iter()
                        .zip(size)
                        .enumerate()
                        .all(|(k, (s, n))| k == d || s <= n);
                if !fits {
                    bail!(
                        name,
                        "src {} does not fit a result of shape {} along dims other than {dim}",
                        fmt_dims(&src.dims),
                        fmt_dims(size)
                    );
                }
                one(Meta {
                    dtype: src.dtype,
                    dims: size.iter().copied().collect(),
                })
            }
            Op::MaskedFill { value } => {
                exactly(&name, ins, 2 + value.is_none() as usize)?;
                if ins[1].dtype != DType::Bool {
                    bail!(
                        name,
                        "mask must be a bool tensor, got {}",
                        ins[1].dtype.name()
                    );
                }
                crate::shape::broadcast_shapes(&name, &ins[1].dims, &ins[0].dims)?;
                if let Some(fill) = ins.get(2) {
                    check_shape(&name, "fill value", fill, &[])?;
                }
                one(ins[0].clone())
            }
            _ => bail!(name, "not handled by the data_movement rule"),
        }
    }

    /// group_norm / batch_norm: x (N, C, *), then `n - 1` per-channel tensors.
    fn channel_norm(&self, name: &str, ins: &[Meta], n: usize) -> Result<Vec<Meta>> {
        exactly(name, ins, n)?;
        if ins[0].dims.len() < 2 {
            bail!(
                name,
                "expected an input of shape (N, C, *), got {}",
                fmt_dims(&ins[0].dims)
            );
        }
        let c = ins[0].dims[1];
        for m in &ins[1..] {
            if m.dims.as_slice() != [c] {
                bail!(
                    name,
                    "per-channel tensor has shape {} but the input {} has {c} channels",
                    fmt_dims(&m.dims),
                    fmt_dims(&ins[0].dims)
                );
            }
        }
        one(ins[0].clone())
    }
}

fn layout_op(ins: &[Meta], f: impl FnOnce(&Layout) -> Result<Layout>) -> Result<Vec<Meta>> {
    need("view", ins, 1)?;
    let l = f(&Layout::contiguous(&ins[0].dims))?;
    one(Meta {
        dtype: ins[0].dtype,
        dims: l.dims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BinaryOp;

    #[test]
    fn infer_dispatches_to_the_shared_checks() {
        let a = Meta::new(DType::F32, &[32, 2]);
        let b = Meta::new(DType::F32, &[3]);
        let e = Op::Binary(BinaryOp::Add)
            .infer(&[a.clone(), b])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "add: shapes [32,2] and [3] cannot broadcast at dim 1 (2 vs 3)"
        );
        let m = Op::Matmul
            .infer(&[
                Meta::new(DType::F32, &[2, 5, 3]),
                Meta::new(DType::F32, &[3, 4]),
            ])
            .unwrap();
        assert_eq!(m[0].dims.as_slice(), &[2, 5, 4]);
        assert_eq!(Op::Softmax { dim: -1 }.name(), "softmax");
        assert!(Op::Softmax { dim: 2 }.infer(&[a]).is_err());
    }
}
