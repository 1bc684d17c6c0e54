//! `F.scaled_dot_product_attention` as PyTorch's math reference:
//! `softmax(q k^T * scale + mask) v`, with a bool mask's `true` meaning
//! "may attend" (the opposite of MultiheadAttention's `key_padding_mask`), a
//! float mask added to the scores, `is_causal` the top-left lower triangle,
//! and a row with no allowed key giving zeros (PyTorch's CPU kernel) rather
//! than the NaN of a plain softmax.
//!
//! Where the shapes allow (see `attention_fused.rs`) the call runs as one
//! fused kernel that never stores the `[L, S]` scores, forward and
//! backward; [`scaled_dot_product_attention_math`] always runs the
//! composite below (PyTorch's math reference), and `KILN_SDPA=math` sends
//! every call there.

use super::{attention_fused, matmul};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result};

/// The keyword arguments of `F.scaled_dot_product_attention` past the
/// tensors (PyTorch's defaults: no dropout, not causal, `1/sqrt(E)`, no GQA).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SdpaOpts {
    pub dropout_p: f64,
    pub is_causal: bool,
    pub scale: Option<f64>,
    pub enable_gqa: bool,
}

fn shapes(q: &Tensor, k: &Tensor, v: &Tensor) -> String {
    format!(
        "query {}, key {}, value {}",
        fmt_dims(q.dims()),
        fmt_dims(k.dims()),
        fmt_dims(v.dims())
    )
}

/// `F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
/// is_causal, scale, enable_gqa)` on `(.., L, E)`, `(.., S, E)`, `(.., S, Ev)`.
/// `dropout_p > 0` runs the composite, dropping attention weights as
/// PyTorch's math path does.
///
/// ```
/// use kiln_frontend::functional::{self as F, SdpaOpts};
/// use kiln_frontend::Tensor;
/// let q = Tensor::from_vec(vec![1.0f32], &[1, 1, 1]).unwrap();
/// let k = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2, 1]).unwrap();
/// let v = Tensor::from_vec(vec![2.0f32, 4.0], &[1, 2, 1]).unwrap();
/// let y = F::scaled_dot_product_attention(&q, &k, &v, None, SdpaOpts::default()).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![3.0]);
/// ```
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    o: SdpaOpts,
) -> Result<Tensor> {
    sdpa(q, k, v, attn_mask, o, true)
}

/// [`scaled_dot_product_attention`] always as the composite of matmuls,
/// masks and a softmax (PyTorch's `_scaled_dot_product_attention_math`):
/// the reference the fused kernel is tested against.
///
/// ```
/// use kiln_frontend::functional::{self as F, SdpaOpts};
/// use kiln_frontend::Tensor;
/// let q = Tensor::from_vec(vec![1.0f32], &[1, 1, 1]).unwrap();
/// let k = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2, 1]).unwrap();
/// let v = Tensor::from_vec(vec![2.0f32, 4.0], &[1, 2, 1]).unwrap();
/// let y = F::scaled_dot_product_attention_math(&q, &k, &v, None, SdpaOpts::default()).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![3.0]);
/// ```
pub fn scaled_dot_product_attention_math(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    o: SdpaOpts,
) -> Result<Tensor> {
    sdpa(q, k, v, attn_mask, o, false)
}

fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    o: SdpaOpts,
    fused: bool,
) -> Result<Tensor> {
    let op = "scaled_dot_product_attention";
    let r = q.rank();
    if r < 2 || k.rank() != r || v.rank() != r {
        bail!(
            op,
            "expected query, key and value of the same rank >= 2, got {}",
            shapes(q, k, v)
        );
    }
    let (l, e) = (q.dims()[r - 2], q.dims()[r - 1]);
    let s = k.dims()[r - 2];
    if k.dims()[r - 1] != e || v.dims()[r - 2] != s {
        bail!(
            op,
            "expected key (.., S, {e}) and value (.., S, Ev), got {}",
            shapes(q, k, v)
        );
    }
    if !(0.0..=1.0).contains(&o.dropout_p) {
        bail!(
            op,
            "dropout probability has to be between 0 and 1, but got {}",
            o.dropout_p
        );
    }
    if o.is_causal && attn_mask.is_some() {
        bail!(op, "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True");
    }
    let scale = o.scale.unwrap_or(1.0 / (e as f64).sqrt());
    // dropout acts on the probabilities, which the fused kernel never
    // stores: such calls run the composite, as PyTorch's math path does
    if fused && o.dropout_p == 0.0 {
        let p = attention_fused::prepare(q, k, v, attn_mask, scale, o.is_causal, o.enable_gqa)?;
        if let Some(p) = p {
            let (out, _lse) =
                attention_fused::attention(&p.q, &p.k, &p.v, p.mask.as_ref(), p.params)?;
            return out.reshape_dims(&p.out_dims);
        }
    }
    let (k, v) = if o.enable_gqa && r >= 3 {
        let (hq, hk) = (q.dims()[r - 3], k.dims()[r - 3]);
        if hk == 0 || hq % hk != 0 || v.dims()[r - 3] != hk {
            bail!(
                op,
                "enable_gqa needs query heads divisible by key/value heads, got {}",
                shapes(q, k, v)
            );
        }
        let rep = hq / hk;
        (
            k.repeat_interleave(rep, Some(-3))?,
            v.repeat_interleave(rep, Some(-3))?,
        )
    } else {
        (k.clone(), v.clone())
    };
    let mut scores = matmul(q, &k.transpose(-2, -1)?)?.mul_scalar(scale)?;
    if o.is_causal {
        // top-left aligned: query i sees keys j <= i
        let above: Vec<bool> = (0..l * s).map(|i| i % s > i / s).collect();
        let above = Tensor::from_vec(above, &[l, s])?.to_device(q.device())?;
        scores = scores.masked_fill(&above, f64::NEG_INFINITY)?;
    }
    let masked = match attn_mask {
        None => false,
        Some(m) if m.dtype() == DType::Bool => {
            scores = scores.masked_fill(&m.logical_not()?, f64::NEG_INFINITY)?;
            true
        }
        Some(m) => {
            scores = scores.add(m)?;
            true
        }
    };
    let p = if masked {
        // a row with no allowed key: zeros, not softmax's NaN, and no
        // gradient either (PyTorch's `_safe_softmax`): its scores are
        // replaced before the softmax, so no NaN reaches backward
        let none = scores
            .binary_scalar(BinaryOp::Eq, f64::NEG_INFINITY, false)?
            .all(Some(&[-1]), true)?;
        let safe = scores.masked_fill(&none, 0.0)?;
        safe.softmax(-1)?.masked_fill(&none, 0.0)?
    } else {
        scores.softmax(-1)?
    };
    matmul(&dropout(&p, o.dropout_p)?, &v)
}

/// `F.dropout(p, dropout_p, training=True)` on the attention weights (SDPA
/// applies it whenever `dropout_p > 0`, with no training flag): a kept
/// weight is scaled by `1 / (1 - dropout_p)`, the mask drawn from the
/// seeded default generator (a fresh graph input under `compile`).
fn dropout(p: &Tensor, dropout_p: f64) -> Result<Tensor> {
    if dropout_p == 0.0 {
        return Ok(p.clone());
    }
    if dropout_p == 1.0 {
        return p.binary_scalar(BinaryOp::Mul, 0.0, false);
    }
    let keep = crate::compile::trace::random_input(crate::compile::trace::RandomSpec::Bernoulli {
        dims: p.dims().to_vec(),
        p: 1.0 - dropout_p,
        dtype: p.dtype(),
    })?;
    p.mul(&keep)?
        .binary_scalar(BinaryOp::Mul, 1.0 / (1.0 - dropout_p), false)
}
