//! [`Op`]: the one op vocabulary of kiln. Graph nodes (the tracer, the
//! passes) name ops with it; [`Op::infer`] dispatches to the same inference
//! and argument checks the eager path calls directly, so both agree.

use super::attention::AttentionParams;
use super::conv::{ConvParams, ConvTransposeParams};
use super::pool::Pool2dParams;
use super::{BinaryOp, Float, ReduceKind, UnaryOp};
use crate::graph::{Reduction, ScalarValue};
use crate::DType;

/// Every op kiln knows, with its non-tensor arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    // pointwise
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `x op s` (or `s op x` when `reversed`) with the Python number `value`.
    BinaryScalar {
        op: BinaryOp,
        value: ScalarValue,
        reversed: bool,
    },
    Where,
    Cast(DType),
    // reductions (dims empty = all)
    Reduce {
        kind: ReduceKind,
        dims: Vec<i64>,
        keepdim: bool,
    },
    Mean {
        dims: Vec<i64>,
        keepdim: bool,
    },
    Var {
        dims: Vec<i64>,
        correction: Float,
        keepdim: bool,
    },
    Std {
        dims: Vec<i64>,
        correction: Float,
        keepdim: bool,
    },
    LogSumExp {
        dims: Vec<i64>,
        keepdim: bool,
    },
    Softmax {
        dim: i64,
    },
    /// One-pass log-sum-exp over `dims` (kept), as the pair `(shift, logsum)`
    /// with lse = shift + logsum: what softmax and log_softmax lower to.
    LseParts {
        dims: Vec<i64>,
    },
    /// One-pass (Welford) `(mean, biased var, rsqrt(var + eps))` over `dims`
    /// (kept): what the normalisations lower to.
    Moments {
        dims: Vec<i64>,
        eps: Float,
    },
    LogSoftmax {
        dim: i64,
    },
    // normalisation (inputs: x, then the optional tensors the `has_*` flags
    // say are present, in the order the fields are listed)
    /// Inputs: x, [weight], [bias].
    LayerNorm {
        normalized_shape: Vec<usize>,
        eps: Float,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs: x, [weight], [bias].
    GroupNorm {
        groups: usize,
        eps: Float,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs: x, [running_mean, running_var], [weight], [bias].
    BatchNorm {
        training: bool,
        momentum: Float,
        eps: Float,
        has_running_stats: bool,
        has_weight: bool,
        has_bias: bool,
    },
    // extern kernels
    Matmul,
    Linear,
    Conv {
        params: ConvParams,
        spatial: usize,
    },
    ConvTranspose2d(ConvTransposeParams),
    /// A dynamically quantized Linear (fbgemm's numerics): inputs x (f32
    /// `[..., in]`), weight (i8 `[out, in]`), weight_scale (f32 `[1]` or
    /// `[out]`), then bias (f32 `[out]`). The kernel quantizes x to uint8
    /// over its whole range per call; `relu` runs in its epilogue
    /// (PyTorch's `LinearReLU`).
    QuantizedLinear {
        relu: bool,
    },
    /// The gradient of a 2-D convolution's weight: inputs x `[N, C_in, H, W]`
    /// and the output gradient `[N, C_out, OH, OW]`; result `[C_out, C_in/groups, kH, kW]`.
    Conv2dWeightGrad {
        params: ConvParams,
        kernel: [usize; 2],
    },
    MaxPool2d(Pool2dParams),
    AvgPool2d {
        params: Pool2dParams,
        count_include_pad: bool,
    },
    AdaptiveAvgPool2d([usize; 2]),
    /// The input gradient of `avg_pool2d` (`params: Some`) or of
    /// `adaptive_avg_pool2d` (`None`) on an input of shape `input_size`.
    /// Input: the output gradient.
    AvgPool2dBackward {
        input_size: Vec<usize>,
        params: Option<Pool2dParams>,
        count_include_pad: bool,
    },
    AdaptiveMaxPool2d([usize; 2]),
    Embedding,
    /// `scaled_dot_product_attention` as one fused kernel (see
    /// [`super::attention`]). Inputs: query, key, value, [mask]; results:
    /// out and each row's logsumexp.
    Attention(AttentionParams),
    /// The fused attention's gradients, recomputing the scores blockwise.
    /// Inputs: query, key, value, [mask], out, logsumexp, out's gradient;
    /// results: the gradients of query, key and value.
    AttentionBackward(AttentionParams),
    // layout and data movement
    View(Vec<i64>),
    Permute(Vec<i64>),
    Expand(Vec<i64>),
    Slice {
        dim: i64,
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    },
    Select {
        dim: i64,
        index: i64,
    },
    /// The diagonal view of dims `dim1`, `dim2` (appended last).
    Diagonal {
        offset: i64,
        dim1: i64,
        dim2: i64,
    },
    /// `x.unfold(dim, size, step)`: the sliding windows view.
    Unfold {
        dim: i64,
        size: usize,
        step: usize,
    },
    Cat {
        dim: i64,
    },
    IndexSelect {
        dim: i64,
    },
    Gather {
        dim: i64,
    },
    /// `zeros(size).scatter_add(dim, index, src)` (gather's backward).
    /// Inputs: index (integer, broadcast to src's shape), src.
    ScatterAdd {
        dim: i64,
        size: Vec<usize>,
    },
    /// The index operand of the scatter-like op `op` checked at run time:
    /// every value must lie in `0..size` (the size of dim `dim`), else the
    /// run fails with the op, the index and the size. An identity (a copy)
    /// on the index otherwise. Scatters traced as windowed comparisons need
    /// it: an out-of-range index would match no position and vanish.
    /// `op` is one of [`CHECKED_INDEX_OPS`]. Input: index (integer).
    IndexBounds {
        op: &'static str,
        dim: usize,
        size: usize,
    },
    /// Inputs: x, mask, then (when `value` is `None`) a 0-dim fill tensor.
    MaskedFill {
        value: Option<ScalarValue>,
    },
    // losses (inputs: input, target, then the weights the flags say are present)
    /// Inputs: input (N, C, d...) or (C), target (class indices, or class
    /// probabilities shaped like input), [weight (C)].
    CrossEntropy {
        reduction: Reduction,
        ignore_index: i64,
        label_smoothing: Float,
        has_weight: bool,
    },
    /// Inputs: input (N, C, d...) or (C), target (class indices), [weight (C)].
    NllLoss {
        reduction: Reduction,
        ignore_index: i64,
        has_weight: bool,
    },
    /// mse, l1, smooth_l1, huber, bce, bce_with_logits: elementwise then reduced.
    /// Inputs: input, target, [weight] (bce, bce_with_logits), [pos_weight]
    /// (bce_with_logits).
    PairLoss {
        name: &'static str,
        reduction: Reduction,
        has_weight: bool,
        has_pos_weight: bool,
    },
}

/// The ops whose indices an [`Op::IndexBounds`] node checks (its `op`).
pub const CHECKED_INDEX_OPS: [&str; 5] = [
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_add",
    "index_copy",
];

impl Op {
    pub fn name(&self) -> String {
        match self {
            Op::Unary(u) => u.name().into(),
            Op::Binary(b) | Op::BinaryScalar { op: b, .. } => b.name().into(),
            Op::Reduce { kind, .. } => kind.name().into(),
            Op::PairLoss { name, .. } => (*name).into(),
            other => {
                let s = format!("{other:?}");
                let head = s.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("");
                // CamelCase -> snake_case
                let mut out = String::new();
                for (i, ch) in head.chars().enumerate() {
                    if ch.is_uppercase() && i > 0 {
                        out.push('_');
                    }
                    out.push(ch.to_ascii_lowercase());
                }
                out
            }
        }
    }
}
