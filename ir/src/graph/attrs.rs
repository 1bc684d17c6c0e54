//! How each [`Op`] appears in the text form: its name ([`op_name`]), its
//! attributes ([`attrs`], sorted by name) and how many operands it takes
//! ([`arity`]). The parser's inverse is `from_text.rs`; a round-trip test
//! covers every variant.
//!
//! Attribute names are PyTorch's keyword names where a PyTorch function has
//! the argument (`kernel_size`, `negative_slope`, `num_groups`, `end`).

use super::{Reduction, ScalarValue};
use crate::op::conv::Padding;
use crate::op::pool::Pool2dParams;
use crate::op::Op;
use crate::Float;
use std::fmt;

/// An attribute value of the text form.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    Float(Float),
    Ints(Vec<i64>),
    Floats(Vec<Float>),
    /// A bare word: a dtype (`f32`), a scalar kind (`float`), a padding mode (`same`).
    Word(String),
    /// An absent optional (`start=none`).
    None,
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, xs: &[T]) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in xs.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{x}")?;
            }
            f.write_str("]")
        }
        match self {
            AttrValue::Bool(b) => write!(f, "{b}"),
            AttrValue::Int(i) => write!(f, "{i}"),
            AttrValue::Float(x) => write!(f, "{x}"),
            AttrValue::Ints(xs) => list(f, xs),
            AttrValue::Floats(xs) => list(f, xs),
            AttrValue::Word(w) => f.write_str(w),
            AttrValue::None => f.write_str("none"),
        }
    }
}

fn ints<T: Copy + TryInto<i64>>(xs: &[T]) -> AttrValue {
    AttrValue::Ints(
        xs.iter()
            .map(|&x| x.try_into().unwrap_or(i64::MAX))
            .collect(),
    )
}

fn int(x: usize) -> AttrValue {
    AttrValue::Int(i64::try_from(x).unwrap_or(i64::MAX))
}

fn opt(x: Option<i64>) -> AttrValue {
    x.map_or(AttrValue::None, AttrValue::Int)
}

/// `true`, `2` or `2.0`: the parser reads the kind back from the spelling.
fn scalar(v: ScalarValue) -> AttrValue {
    match v {
        ScalarValue::Bool(b) => AttrValue::Bool(b),
        ScalarValue::Int(i) => AttrValue::Int(i),
        ScalarValue::Float(x) => AttrValue::Float(x),
    }
}

fn reduction(r: Reduction) -> AttrValue {
    AttrValue::Word(r.name().into())
}

/// `PairLoss` kinds and their printed (PyTorch) names.
pub(crate) const PAIR_LOSSES: [(&str, &str); 6] = [
    ("mse", "mse_loss"),
    ("l1", "l1_loss"),
    ("smooth_l1", "smooth_l1_loss"),
    ("huber", "huber_loss"),
    ("bce", "binary_cross_entropy"),
    ("bce_with_logits", "binary_cross_entropy_with_logits"),
];

/// The op's name in the text form. Unlike [`Op::name`] it tells apart every
/// variant: `add` vs `add_scalar`, `conv1d` vs `conv2d`.
pub fn op_name(op: &Op) -> String {
    match op {
        Op::BinaryScalar { op, .. } => format!("{}_scalar", op.name()),
        Op::LogSumExp { .. } => "logsumexp".into(),
        Op::LseParts { .. } => "lse_parts".into(),
        Op::Moments { .. } => "moments".into(),
        Op::Conv { spatial, .. } => format!("conv{spatial}d"),
        Op::PairLoss { name, .. } => match PAIR_LOSSES.iter().find(|(k, _)| k == name) {
            Some((_, printed)) => (*printed).into(),
            None => format!("{name}_loss"),
        },
        other => other.name(),
    }
}

fn pool(p: &Pool2dParams) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("ceil_mode", AttrValue::Bool(p.ceil_mode)),
        ("dilation", ints(&p.dilation)),
        ("kernel_size", ints(&p.kernel)),
        ("padding", ints(&p.padding)),
        ("stride", ints(&p.stride)),
    ]
}

/// The op's non-tensor arguments, sorted by name.
#[rustfmt::skip]
pub fn attrs(op: &Op) -> Vec<(&'static str, AttrValue)> {
    use AttrValue::{Bool, Float as F, Word};
    let mut a = match op {
        Op::Unary(u) => u.attrs().into_iter().map(|(_, k, v)| (k, F(v))).collect(),
        Op::Binary(_) | Op::Where | Op::Matmul | Op::Linear | Op::Embedding => vec![],
        Op::BinaryScalar { value, reversed, .. } => vec![("reversed", Bool(*reversed)), ("value", scalar(*value))],
        Op::MaskedFill { value } => vec![("value", value.map_or(AttrValue::None, scalar))],
        Op::QuantizedLinear { relu } => vec![("relu", Bool(*relu))],
        Op::CrossEntropy { reduction: r, ignore_index, label_smoothing, has_weight } => vec![
            ("has_weight", Bool(*has_weight)), ("ignore_index", AttrValue::Int(*ignore_index)),
            ("label_smoothing", F(*label_smoothing)), ("reduction", reduction(*r)),
        ],
        Op::NllLoss { reduction: r, ignore_index, has_weight } => vec![
            ("has_weight", Bool(*has_weight)), ("ignore_index", AttrValue::Int(*ignore_index)),
            ("reduction", reduction(*r)),
        ],
        Op::Cast(d) => vec![("dtype", Word(d.name().into()))],
        Op::Reduce { dims, keepdim, .. } | Op::Mean { dims, keepdim } | Op::LogSumExp { dims, keepdim } => {
            vec![("dims", ints(dims)), ("keepdim", Bool(*keepdim))]
        }
        Op::LseParts { dims } => vec![("dims", ints(dims))],
        Op::Moments { dims, eps } => vec![("dims", ints(dims)), ("eps", F(*eps))],
        Op::Var { dims, correction, keepdim } | Op::Std { dims, correction, keepdim } => vec![
            ("correction", F(*correction)), ("dims", ints(dims)), ("keepdim", Bool(*keepdim)),
        ],
        Op::Softmax { dim } | Op::LogSoftmax { dim } | Op::Cat { dim } | Op::IndexSelect { dim }
        | Op::Gather { dim } => vec![("dim", AttrValue::Int(*dim))],
        Op::LayerNorm { normalized_shape, eps, has_weight, has_bias } => vec![
            ("eps", F(*eps)), ("has_bias", Bool(*has_bias)), ("has_weight", Bool(*has_weight)),
            ("normalized_shape", ints(normalized_shape)),
        ],
        Op::GroupNorm { groups, eps, has_weight, has_bias } => vec![
            ("eps", F(*eps)), ("has_bias", Bool(*has_bias)), ("has_weight", Bool(*has_weight)),
            ("num_groups", int(*groups)),
        ],
        Op::BatchNorm { training, momentum, eps, has_running_stats, has_weight, has_bias } => vec![
            ("eps", F(*eps)), ("has_bias", Bool(*has_bias)), ("has_running_stats", Bool(*has_running_stats)),
            ("has_weight", Bool(*has_weight)), ("momentum", F(*momentum)), ("training", Bool(*training)),
        ],
        Op::Conv { params: p, .. } => vec![
            ("dilation", ints(&p.dilation)),
            ("groups", int(p.groups)),
            ("padding", match &p.padding {
                Padding::Explicit(v) => ints(v),
                Padding::Same => Word("same".into()),
                Padding::Valid => Word("valid".into()),
            }),
            ("stride", ints(&p.stride)),
        ],
        Op::ConvTranspose2d(p) => vec![
            ("dilation", ints(&p.dilation)), ("groups", int(p.groups)),
            ("output_padding", ints(&p.output_padding)), ("padding", ints(&p.padding)),
            ("stride", ints(&p.stride)),
        ],
        Op::Conv2dWeightGrad { params: p, kernel } => vec![
            ("dilation", ints(&p.dilation)),
            ("groups", int(p.groups)),
            ("kernel", ints(kernel)),
            ("padding", match &p.padding {
                Padding::Explicit(v) => ints(v),
                Padding::Same => Word("same".into()),
                Padding::Valid => Word("valid".into()),
            }),
            ("stride", ints(&p.stride)),
        ],
        Op::AvgPool2dBackward { input_size, params, count_include_pad } => {
            let mut v = params.as_ref().map(pool).unwrap_or_default();
            v.push(("adaptive", Bool(params.is_none())));
            v.push(("count_include_pad", Bool(*count_include_pad)));
            v.push(("input_size", ints(input_size)));
            v.sort_by_key(|(k, _)| *k);
            v
        }
        Op::ScatterAdd { dim, size } => vec![("dim", AttrValue::Int(*dim)), ("size", ints(size))],
        Op::Attention(p) | Op::AttentionBackward(p) => vec![
            ("is_causal", Bool(p.is_causal)), ("mask", Word(p.mask.name().into())), ("scale", F(p.scale)),
        ],
        Op::MaxPool2d(p) => pool(p),
        Op::AvgPool2d { params, count_include_pad } => {
            let mut v = pool(params);
            v.push(("count_include_pad", Bool(*count_include_pad)));
            v
        }
        Op::AdaptiveAvgPool2d(o) | Op::AdaptiveMaxPool2d(o) => vec![("output_size", ints(o))],
        Op::View(s) => vec![("shape", ints(s))],
        Op::Permute(p) => vec![("dims", ints(p))],
        Op::Expand(s) => vec![("size", ints(s))],
        Op::Slice { dim, start, stop, step } => vec![
            ("dim", AttrValue::Int(*dim)), ("end", opt(*stop)), ("start", opt(*start)),
            ("step", AttrValue::Int(*step)),
        ],
        Op::Select { dim, index } => vec![("dim", AttrValue::Int(*dim)), ("index", AttrValue::Int(*index))],
        Op::IndexBounds { op, dim, size } => vec![
            ("dim", AttrValue::Int(*dim as i64)), ("op", Word((*op).into())), ("size", AttrValue::Int(*size as i64)),
        ],
        Op::Diagonal { offset, dim1, dim2 } => vec![
            ("dim1", AttrValue::Int(*dim1)), ("dim2", AttrValue::Int(*dim2)), ("offset", AttrValue::Int(*offset)),
        ],
        Op::Unfold { dim, size, step } => vec![
            ("dim", AttrValue::Int(*dim)), ("size", AttrValue::Int(*size as i64)), ("step", AttrValue::Int(*step as i64)),
        ],
        Op::PairLoss { name, reduction: r, has_weight, has_pos_weight } => {
            // only the bce losses take weights, so only they print the flags
            let mut v = vec![("reduction", reduction(*r))];
            if name.starts_with("bce") {
                v.push(("has_weight", Bool(*has_weight)));
            }
            if *name == "bce_with_logits" {
                v.push(("has_pos_weight", Bool(*has_pos_weight)));
            }
            v
        }
    };
    a.sort_by_key(|(k, _)| *k);
    a
}

/// How many operands the op takes, `(min, max)`; optional tensors (bias,
/// norm weights, loss weights) come after the required ones, in order. Where
/// more than one is optional the op's `has_*` flags say which are present
/// (checked by [`Op::infer`]).
#[rustfmt::skip]
pub fn arity(op: &Op) -> (usize, usize) {
    match op {
        Op::Unary(_) | Op::BinaryScalar { .. } | Op::Cast(_) | Op::Reduce { .. } | Op::Mean { .. }
        | Op::Var { .. } | Op::Std { .. } | Op::LogSumExp { .. } | Op::Softmax { .. }
        | Op::LseParts { .. } | Op::Moments { .. }
        | Op::LogSoftmax { .. } | Op::MaxPool2d(_) | Op::AvgPool2d { .. } | Op::AvgPool2dBackward { .. }
        | Op::AdaptiveAvgPool2d(_) | Op::AdaptiveMaxPool2d(_) | Op::View(_) | Op::Permute(_)
        | Op::Expand(_) | Op::Slice { .. } | Op::Select { .. } | Op::Diagonal { .. }
        | Op::Unfold { .. } | Op::IndexBounds { .. } => (1, 1),
        Op::Binary(_) | Op::Matmul | Op::Embedding | Op::IndexSelect { .. } | Op::Gather { .. } => (2, 2),
        Op::Where => (3, 3),
        // x, then weight and bias
        Op::LayerNorm { .. } | Op::GroupNorm { .. } => (1, 3),
        // x, running_mean, running_var, weight, bias
        Op::BatchNorm { .. } => (1, 5),
        // input, weight, then bias
        Op::Linear | Op::Conv { .. } | Op::ConvTranspose2d(_) => (2, 3),
        Op::Conv2dWeightGrad { .. } | Op::ScatterAdd { .. } => (2, 2),
        // input, weight, weight_scale, then bias
        Op::QuantizedLinear { .. } => (3, 4),
        // query, key, value, then the mask the params declare (backward: out, lse, grad)
        Op::Attention(p) => (3, 3 + p.mask.present() as usize),
        Op::AttentionBackward(p) => (6, 6 + p.mask.present() as usize),
        Op::Cat { .. } => (1, usize::MAX),
        // x, mask, then a 0-dim fill tensor when there is no `value`
        Op::MaskedFill { .. } => (2, 3),
        // input, target, then class weights
        Op::CrossEntropy { .. } | Op::NllLoss { .. } => (2, 3),
        // input, target, then weight and pos_weight (bce_with_logits)
        Op::PairLoss { .. } => (2, 4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::conv::ConvParams;
    use crate::BinaryOp;

    #[test]
    fn names_tell_variants_apart() {
        let conv = |spatial| Op::Conv {
            params: ConvParams::default(),
            spatial,
        };
        assert_eq!(op_name(&conv(1)), "conv1d");
        assert_eq!(op_name(&conv(2)), "conv2d");
        let s = Op::BinaryScalar {
            op: BinaryOp::Mul,
            value: ScalarValue::Int(2),
            reversed: false,
        };
        assert_eq!(op_name(&s), "mul_scalar");
        let a: Vec<String> = attrs(&s).iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(a, ["reversed=false", "value=2"]);
        assert_eq!(op_name(&Op::Binary(BinaryOp::Mul)), "mul");
        let a: Vec<String> = attrs(&conv(2))
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(a, ["dilation=[1]", "groups=1", "padding=[0]", "stride=[1]"]);
    }
}
