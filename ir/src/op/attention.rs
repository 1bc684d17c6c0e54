//! The fused attention op family: `scaled_dot_product_attention` as one
//! extern kernel (flash-attention style: the `[L, S]` scores are never
//! stored) and its backward, which recomputes the scores blockwise from the
//! saved `logsumexp`.
//!
//! Both ops work on rank-4 operands: query `[N, H, L, E]`, key
//! `[N, Hk, S, E]`, value `[N, Hk, S, Ev]` with `H % Hk == 0` (query head
//! `h` reads key/value head `h / (H / Hk)`, PyTorch's `enable_gqa`), and an
//! optional mask already broadcast to `[N, H, L, S]`.
//!
//! ```
//! use kiln_ir::op::attention::{AttentionParams, MaskKind};
//! use kiln_ir::op::{Meta, Op};
//! use kiln_ir::DType;
//! let m = |d: &[usize]| Meta { dtype: DType::F32, dims: d.into() };
//! let p = AttentionParams { scale: kiln_ir::op::Float(0.125), is_causal: true, mask: MaskKind::None };
//! let outs = Op::Attention(p).infer(&[m(&[2, 4, 9, 64]), m(&[2, 1, 7, 64]), m(&[2, 1, 7, 32])]).unwrap();
//! assert_eq!(outs[0].dims.as_slice(), &[2, 4, 9, 32]); // out
//! assert_eq!(outs[1].dims.as_slice(), &[2, 4, 9]);     // logsumexp of each row
//! ```

use super::infer::Meta;
use super::Float;
use crate::shape::fmt_dims;
use crate::{bail, DType, Result};

/// What the optional fourth operand of an attention op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// No mask operand.
    None,
    /// A bool mask: `true` = may attend (SDPA's polarity).
    Bool,
    /// A float mask of the query's dtype, added to the scaled scores.
    Float,
}

impl MaskKind {
    /// `none`, `bool` or `float` (the text form's `mask=` word).
    pub fn name(self) -> &'static str {
        match self {
            MaskKind::None => "none",
            MaskKind::Bool => "bool",
            MaskKind::Float => "float",
        }
    }

    /// The inverse of [`MaskKind::name`].
    pub fn from_name(s: &str) -> Option<MaskKind> {
        [MaskKind::None, MaskKind::Bool, MaskKind::Float]
            .into_iter()
            .find(|m| m.name() == s)
    }

    /// Whether the op has a mask operand.
    pub fn present(self) -> bool {
        self != MaskKind::None
    }
}

/// The non-tensor arguments of [`super::Op::Attention`] and
/// [`super::Op::AttentionBackward`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `q . k` (PyTorch's default is `1/sqrt(E)`).
    pub scale: Float,
    /// Top-left causal triangle: query `i` sees keys `j <= i`.
    pub is_causal: bool,
    pub mask: MaskKind,
}

/// The sizes one attention call works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    pub n: usize,
    pub h: usize,
    pub hk: usize,
    pub l: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
}

fn shapes(ins: &[Meta]) -> String {
    let names = ["query", "key", "value", "mask"];
    ins.iter()
        .zip(names)
        .map(|(m, n)| format!("{n} {}", fmt_dims(&m.dims)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the query, key, value (and mask) of an attention op and returns
/// its sizes. `name` prefixes the errors.
pub fn attention_dims(name: &str, p: &AttentionParams, ins: &[Meta]) -> Result<AttentionDims> {
    let want = 3 + p.mask.present() as usize;
    if ins.len() < want {
        bail!(name, "expected {want} tensor inputs, got {}", ins.len());
    }
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    if [q, k, v].iter().any(|m| m.dims.len() != 4) {
        bail!(
            name,
            "expected rank-4 query, key and value, got {}",
            shapes(&ins[..3])
        );
    }
    let [n, h, l, e] = [q.dims[0], q.dims[1], q.dims[2], q.dims[3]];
    let (hk, s, ev) = (k.dims[1], k.dims[2], v.dims[3]);
    let ok =
        k.dims[0] == n && k.dims[3] == e && v.dims[..3] == k.dims[..3] && hk > 0 && h % hk == 0;
    if !ok {
        bail!(
            name,
            "expected key [N, Hk, S, E] and value [N, Hk, S, Ev] with H divisible by Hk, got {}",
            shapes(&ins[..3])
        );
    }
    if !q.dtype.is_float() || k.dtype != q.dtype || v.dtype != q.dtype {
        bail!(
            name,
            "query, key and value must share one float dtype, got {}, {} and {}",
            q.dtype.name(),
            k.dtype.name(),
            v.dtype.name()
        );
    }
    if p.mask.present() {
        let m = &ins[3];
        if m.dims.as_slice() != [n, h, l, s] {
            bail!(
                name,
                "the mask must be broadcast to [N, H, L, S], got {}",
                shapes(ins)
            );
        }
        let want = if p.mask == MaskKind::Bool {
            DType::Bool
        } else {
            q.dtype
        };
        if m.dtype != want {
            bail!(
                name,
                "a {} mask must be {}, got {}",
                p.mask.name(),
                want.name(),
                m.dtype.name()
            );
        }
    }
    Ok(AttentionDims {
        n,
        h,
        hk,
        l,
        s,
        e,
        ev,
    })
}

/// `attention`: inputs query, key, value, [mask]; results `out [N, H, L, Ev]`
/// and the `logsumexp [N, H, L]` of each row's scores (what backward needs).
pub(super) fn infer_attention(p: &AttentionParams, ins: &[Meta]) -> Result<Vec<Meta>> {
    let name = "attention";
    let d = attention_dims(name, p, ins)?;
    let want = 3 + p.mask.present() as usize;
    if ins.len() != want {
        bail!(name, "expected {want} tensor inputs, got {}", ins.len());
    }
    let dtype = ins[0].dtype;
    Ok(vec![
        Meta {
            dtype,
            dims: [d.n, d.h, d.l, d.ev].as_slice().into(),
        },
        Meta {
            dtype,
            dims: [d.n, d.h, d.l].as_slice().into(),
        },
    ])
}

/// `attention_backward`: inputs query, key, value, [mask], out, logsumexp,
/// the output gradient; results the gradients of query, key and value.
pub(super) fn infer_attention_backward(p: &AttentionParams, ins: &[Meta]) -> Result<Vec<Meta>> {
    let name = "attention_backward";
    let d = attention_dims(name, p, ins)?;
    let base = 3 + p.mask.present() as usize;
    if ins.len() != base + 3 {
        bail!(
            name,
            "expected {} tensor inputs, got {}",
            base + 3,
            ins.len()
        );
    }
    let dtype = ins[0].dtype;
    let (o, lse, g) = (&ins[base], &ins[base + 1], &ins[base + 2]);
    let od = [d.n, d.h, d.l, d.ev];
    if o.dims.as_slice() != od || g.dims.as_slice() != od || lse.dims.as_slice() != &od[..3] {
        bail!(
            name,
            "out and its gradient must be {} and logsumexp {}, got {}, {} and {}",
            fmt_dims(&od),
            fmt_dims(&od[..3]),
            fmt_dims(&o.dims),
            fmt_dims(&g.dims),
            fmt_dims(&lse.dims)
        );
    }
    if [o, lse, g].iter().any(|m| m.dtype != dtype) {
        bail!(
            name,
            "out, logsumexp and the gradient must be {}",
            dtype.name()
        );
    }
    Ok(ins[..3].to_vec())
}
