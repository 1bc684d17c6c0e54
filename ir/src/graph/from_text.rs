//! The inverse of `attrs.rs`: rebuilds an [`Op`] from its text-form name and
//! attributes. Every attribute the printer writes is required, and an
//! attribute the op does not have is an error, so a typo never passes silently.

use super::attrs::PAIR_LOSSES;
use super::lex::Pos;
use super::{AttrValue, Reduction, ScalarValue};
use crate::op::attention::{AttentionParams, MaskKind};
use crate::op::conv::{ConvParams, ConvTransposeParams, Padding};
use crate::op::pool::Pool2dParams;
use crate::op::Op;
use crate::{BinaryOp, DType, Float, ReduceKind, Result, UnaryOp};

/// The attributes of one node, consumed by name.
pub(crate) struct Attrs {
    pub op: String,
    pub pos: Pos,
    pub items: Vec<(String, AttrValue, Pos)>,
}

impl Attrs {
    fn take(&mut self, key: &str) -> Result<(AttrValue, Pos)> {
        match self.items.iter().position(|(k, ..)| k == key) {
            Some(i) => {
                let (_, v, p) = self.items.remove(i);
                Ok((v, p))
            }
            None => Err(self
                .pos
                .error(format!("{}: missing attribute '{key}'", self.op))),
        }
    }

    fn bad<T>(&self, key: &str, p: Pos, want: &str, got: &AttrValue) -> Result<T> {
        Err(p.error(format!(
            "{}: attribute '{key}' must be {want}, got {got}",
            self.op
        )))
    }

    pub fn value(&mut self, key: &str) -> Result<AttrValue> {
        Ok(self.take(key)?.0)
    }
    pub fn int(&mut self, key: &str) -> Result<i64> {
        match self.take(key)? {
            (AttrValue::Int(i), _) => Ok(i),
            (v, p) => self.bad(key, p, "an integer", &v),
        }
    }
    pub fn usize(&mut self, key: &str) -> Result<usize> {
        match self.take(key)? {
            (AttrValue::Int(i), p) => usize::try_from(i)
                .or_else(|_| self.bad(key, p, "a non-negative integer", &AttrValue::Int(i))),
            (v, p) => self.bad(key, p, "a non-negative integer", &v),
        }
    }
    pub fn opt_int(&mut self, key: &str) -> Result<Option<i64>> {
        match self.take(key)? {
            (AttrValue::Int(i), _) => Ok(Some(i)),
            (AttrValue::None, _) => Ok(None),
            (v, p) => self.bad(key, p, "an integer or none", &v),
        }
    }
    pub fn bool(&mut self, key: &str) -> Result<bool> {
        match self.take(key)? {
            (AttrValue::Bool(b), _) => Ok(b),
            (v, p) => self.bad(key, p, "true or false", &v),
        }
    }
    pub fn float(&mut self, key: &str) -> Result<Float> {
        match self.take(key)? {
            (AttrValue::Float(x), _) => Ok(x),
            (AttrValue::Int(i), _) => Ok(Float(i as f64)),
            (v, p) => self.bad(key, p, "a number", &v),
        }
    }
    pub fn ints(&mut self, key: &str) -> Result<Vec<i64>> {
        match self.take(key)? {
            (AttrValue::Ints(v), _) => Ok(v),
            (v, p) => self.bad(key, p, "a list of integers", &v),
        }
    }
    pub fn usizes(&mut self, key: &str) -> Result<Vec<usize>> {
        let (v, p) = self.take(key)?;
        if let AttrValue::Ints(xs) = &v {
            if let Ok(u) = xs.iter().map(|&x| usize::try_from(x)).collect() {
                return Ok(u);
            }
        }
        self.bad(key, p, "a list of non-negative integers", &v)
    }
    pub fn pair(&mut self, key: &str) -> Result<[usize; 2]> {
        let (v, p) = self.take(key)?;
        if let AttrValue::Ints(xs) = &v {
            if let &[a, b] = xs.as_slice() {
                if let (Ok(a), Ok(b)) = (usize::try_from(a), usize::try_from(b)) {
                    return Ok([a, b]);
                }
            }
        }
        self.bad(key, p, "a list of two non-negative integers", &v)
    }
    /// `true`, `2` or `2.0` (kind by spelling); `none` too when `optional`.
    pub fn scalar(&mut self, key: &str, optional: bool) -> Result<Option<ScalarValue>> {
        match self.take(key)? {
            (AttrValue::Bool(b), _) => Ok(Some(ScalarValue::Bool(b))),
            (AttrValue::Int(i), _) => Ok(Some(ScalarValue::Int(i))),
            (AttrValue::Float(x), _) => Ok(Some(ScalarValue::Float(x))),
            (AttrValue::None, _) if optional => Ok(None),
            (v, p) => self.bad(key, p, "a number or true/false", &v),
        }
    }
    pub fn reduction(&mut self, key: &str) -> Result<Reduction> {
        let (v, p) = self.take(key)?;
        let w = match &v {
            AttrValue::None => "none",
            AttrValue::Word(w) => w.as_str(),
            _ => "",
        };
        match Reduction::ALL.into_iter().find(|r| r.name() == w) {
            Some(r) => Ok(r),
            None => self.bad(key, p, "none, mean or sum", &v),
        }
    }
    pub fn word(&mut self, key: &str) -> Result<(String, Pos)> {
        match self.take(key)? {
            (AttrValue::Word(w), p) => Ok((w, p)),
            (v, p) => self.bad(key, p, "a word", &v),
        }
    }
    /// Errors on an attribute nobody took.
    pub fn finish(self) -> Result<()> {
        match self.items.first() {
            None => Ok(()),
            Some((k, _, p)) => Err(p.error(format!("{}: unknown attribute '{k}'", self.op))),
        }
    }
}

const REDUCE: [ReduceKind; 8] = ReduceKind::ALL;

fn binary(name: &str) -> Option<BinaryOp> {
    BinaryOp::from_name(name)
}

fn pool(a: &mut Attrs) -> Result<Pool2dParams> {
    Ok(Pool2dParams {
        ceil_mode: a.bool("ceil_mode")?,
        dilation: a.pair("dilation")?,
        kernel: a.pair("kernel_size")?,
        padding: a.pair("padding")?,
        stride: a.pair("stride")?,
    })
}

fn attention(a: &mut Attrs) -> Result<AttentionParams> {
    let is_causal = a.bool("is_causal")?;
    let scale = a.float("scale")?;
    // `none` lexes as the none value, not a word
    let (word, pos) = match a.take("mask")? {
        (AttrValue::None, p) => ("none".to_string(), p),
        (AttrValue::Word(w), p) => (w, p),
        (v, p) => return a.bad("mask", p, "none, bool or float", &v),
    };
    let Some(mask) = MaskKind::from_name(&word) else {
        return Err(pos.error(format!(
            "{}: mask must be none, bool or float, got {word}",
            a.op
        )));
    };
    Ok(AttentionParams {
        scale,
        is_causal,
        mask,
    })
}

fn conv_params(a: &mut Attrs) -> Result<ConvParams> {
    let padding = match a.take("padding")? {
        (AttrValue::Word(w), _) if w == "same" => Padding::Same,
        (AttrValue::Word(w), _) if w == "valid" => Padding::Valid,
        (v, p) => {
            a.items.push(("padding".into(), v, p));
            Padding::Explicit(a.usizes("padding")?)
        }
    };
    Ok(ConvParams {
        dilation: a.usizes("dilation")?,
        groups: a.usize("groups")?,
        padding,
        stride: a.usizes("stride")?,
    })
}

/// The op named `name` with attributes `a`, or `None` if no op has that name.
pub(crate) fn build_op(name: &str, a: &mut Attrs) -> Result<Option<Op>> {
    if let Some(u) = UnaryOp::from_text(name, |k| a.float(k)) {
        return Ok(Some(Op::Unary(u?)));
    }
    if let Some(b) = binary(name) {
        return Ok(Some(Op::Binary(b)));
    }
    if let Some(kind) = REDUCE.into_iter().find(|r| r.name() == name) {
        let (dims, keepdim) = (a.ints("dims")?, a.bool("keepdim")?);
        return Ok(Some(Op::Reduce {
            kind,
            dims,
            keepdim,
        }));
    }
    if let Some(b) = name.strip_suffix("_scalar").and_then(binary) {
        let value = a.scalar("value", false)?.expect("not optional");
        let reversed = a.bool("reversed")?;
        return Ok(Some(Op::BinaryScalar {
            op: b,
            value,
            reversed,
        }));
    }
    if let Some((kind, _)) = PAIR_LOSSES
        .into_iter()
        .find(|(_, printed)| *printed == name)
    {
        let bce = kind.starts_with("bce");
        return Ok(Some(Op::PairLoss {
            name: kind,
            reduction: a.reduction("reduction")?,
            has_weight: bce && a.bool("has_weight")?,
            has_pos_weight: kind == "bce_with_logits" && a.bool("has_pos_weight")?,
        }));
    }
    let conv_spatial = name
        .strip_prefix("conv")
        .and_then(|s| s.strip_suffix('d'))
        .and_then(|s| s.parse::<usize>().ok());
    if let Some(spatial) = conv_spatial {
        return Ok(Some(Op::Conv {
            params: conv_params(a)?,
            spatial,
        }));
    }
    let dims_keep =
        |a: &mut Attrs| -> Result<(Vec<i64>, bool)> { Ok((a.ints("dims")?, a.bool("keepdim")?)) };
    Ok(Some(match name {
        "where" => Op::Where,
        "cast" => {
            let (w, p) = a.word("dtype")?;
            Op::Cast(DType::parse(&w).map_err(|e| p.error(e))?)
        }
        "mean" => {
            let (dims, keepdim) = dims_keep(a)?;
            Op::Mean { dims, keepdim }
        }
        "lse_parts" => Op::LseParts {
            dims: a.ints("dims")?,
        },
        "moments" => Op::Moments {
            dims: a.ints("dims")?,
            eps: a.float("eps")?,
        },
        "logsumexp" => {
            let (dims, keepdim) = dims_keep(a)?;
            Op::LogSumExp { dims, keepdim }
        }
        "var" | "std" => {
            let correction = a.float("correction")?;
            let (dims, keepdim) = dims_keep(a)?;
            if name == "var" {
                Op::Var {
                    dims,
                    correction,
                    keepdim,
                }
            } else {
                Op::Std {
                    dims,
                    correction,
                    keepdim,
                }
            }
        }
        "softmax" => Op::Softmax { dim: a.int("dim")? },
        "log_softmax" => Op::LogSoftmax { dim: a.int("dim")? },
        "layer_norm" => Op::LayerNorm {
            eps: a.float("eps")?,
            normalized_shape: a.usizes("normalized_shape")?,
            has_weight: a.bool("has_weight")?,
            has_bias: a.bool("has_bias")?,
        },
        "group_norm" => Op::GroupNorm {
            eps: a.float("eps")?,
            groups: a.usize("num_groups")?,
            has_weight: a.bool("has_weight")?,
            has_bias: a.bool("has_bias")?,
        },
        "batch_norm" => Op::BatchNorm {
            eps: a.float("eps")?,
            momentum: a.float("momentum")?,
            training: a.bool("training")?,
            has_running_stats: a.bool("has_running_stats")?,
            has_weight: a.bool("has_weight")?,
            has_bias: a.bool("has_bias")?,
        },
        _ => return build_kernel_op(name, a),
    }))
}

/// The extern-kernel, pooling, attention, data-movement and loss ops of
/// [`build_op`].
fn build_kernel_op(name: &str, a: &mut Attrs) -> Result<Option<Op>> {
    Ok(Some(match name {
        "matmul" => Op::Matmul,
        "linear" => Op::Linear,
        "quantized_linear" => Op::QuantizedLinear {
            relu: a.bool("relu")?,
        },
        "conv_transpose2d" => Op::ConvTranspose2d(ConvTransposeParams {
            dilation: a.usizes("dilation")?,
            groups: a.usize("groups")?,
            output_padding: a.usizes("output_padding")?,
            padding: a.usizes("padding")?,
            stride: a.usizes("stride")?,
        }),
        "avg_pool2d_backward" => Op::AvgPool2dBackward {
            params: if a.bool("adaptive")? {
                None
            } else {
                Some(pool(a)?)
            },
            count_include_pad: a.bool("count_include_pad")?,
            input_size: a.usizes("input_size")?,
        },
        "scatter_add" => Op::ScatterAdd {
            dim: a.int("dim")?,
            size: a.usizes("size")?,
        },
        "conv2d_weight_grad" => Op::Conv2dWeightGrad {
            kernel: a.pair("kernel")?,
            params: conv_params(a)?,
        },
        "max_pool2d" => Op::MaxPool2d(pool(a)?),
        "avg_pool2d" => Op::AvgPool2d {
            params: pool(a)?,
            count_include_pad: a.bool("count_include_pad")?,
        },
        "adaptive_avg_pool2d" => Op::AdaptiveAvgPool2d(a.pair("output_size")?),
        "adaptive_max_pool2d" => Op::AdaptiveMaxPool2d(a.pair("output_size")?),
        "embedding" => Op::Embedding,
        "attention" => Op::Attention(attention(a)?),
        "attention_backward" => Op::AttentionBackward(attention(a)?),
        "view" => Op::View(a.ints("shape")?),
        "permute" => Op::Permute(a.ints("dims")?),
        "expand" => Op::Expand(a.ints("size")?),
        "slice" => Op::Slice {
            dim: a.int("dim")?,
            start: a.opt_int("start")?,
            stop: a.opt_int("end")?,
            step: a.int("step")?,
        },
        "select" => Op::Select {
            dim: a.int("dim")?,
            index: a.int("index")?,
        },
        "diagonal" => Op::Diagonal {
            offset: a.int("offset")?,
            dim1: a.int("dim1")?,
            dim2: a.int("dim2")?,
        },
        "unfold" => Op::Unfold {
            dim: a.int("dim")?,
            size: a.int("size")? as usize,
            step: a.int("step")? as usize,
        },
        "cat" => Op::Cat { dim: a.int("dim")? },
        "index_select" => Op::IndexSelect { dim: a.int("dim")? },
        "gather" => Op::Gather { dim: a.int("dim")? },
        "index_bounds" => {
            let (w, p) = a.word("op")?;
            let Some(op) = crate::op::CHECKED_INDEX_OPS.into_iter().find(|o| *o == w) else {
                return Err(p.error(format!(
                    "index_bounds: op must be one of {}, got '{w}'",
                    crate::op::CHECKED_INDEX_OPS.join(", ")
                )));
            };
            Op::IndexBounds {
                op,
                dim: a.usize("dim")?,
                size: a.usize("size")?,
            }
        }
        "masked_fill" => Op::MaskedFill {
            value: a.scalar("value", true)?,
        },
        "cross_entropy" => Op::CrossEntropy {
            reduction: a.reduction("reduction")?,
            ignore_index: a.int("ignore_index")?,
            label_smoothing: a.float("label_smoothing")?,
            has_weight: a.bool("has_weight")?,
        },
        "nll_loss" => Op::NllLoss {
            reduction: a.reduction("reduction")?,
            ignore_index: a.int("ignore_index")?,
            has_weight: a.bool("has_weight")?,
        },
        _ => return Ok(None),
    }))
}
