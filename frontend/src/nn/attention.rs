//! `nn.MultiheadAttention`: scaled dot-product attention over several heads
//! with PyTorch's parameters (`in_proj_weight`, or `q/k/v_proj_weight` when
//! `kdim`/`vdim` differ, `in_proj_bias`, `out_proj`) and mask conventions.
//!
//! Everything is composed of differentiable tensor ops (linear, matmul,
//! softmax, masked_fill), so eager autograd and `compile` both handle it.

use super::layers::param;
use super::{Dropout, Entry, EntryMut, Linear, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};

/// `nn.MultiheadAttention`'s keyword arguments, PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiheadAttentionOptions {
    pub dropout: f64,
    pub bias: bool,
    pub add_bias_kv: bool,
    pub add_zero_attn: bool,
    /// Feature size of `key` (None: `embed_dim`).
    pub kdim: Option<usize>,
    /// Feature size of `value` (None: `embed_dim`).
    pub vdim: Option<usize>,
    /// Inputs are (batch, seq, feature) instead of (seq, batch, feature).
    pub batch_first: bool,
}

impl Default for MultiheadAttentionOptions {
    fn default() -> Self {
        MultiheadAttentionOptions {
            dropout: 0.0,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            kdim: None,
            vdim: None,
            batch_first: false,
        }
    }
}

/// The non-tensor arguments of `MultiheadAttention.forward`, PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionArgs {
    /// Return the attention weights too.
    pub need_weights: bool,
    /// Average the returned weights over the heads ((N, L, S) instead of (N, H, L, S)).
    pub average_attn_weights: bool,
    /// A hint that `attn_mask` is the causal mask (it must be given, as in PyTorch).
    pub is_causal: bool,
}

impl Default for AttentionArgs {
    fn default() -> Self {
        AttentionArgs {
            need_weights: true,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

/// `nn.MultiheadAttention(embed_dim, num_heads, ...)`.
///
/// Bool masks are True = masked out (PyTorch's MHA convention, the opposite
/// of SDPA's); float masks are added to the scores.
///
/// ```
/// use kiln_frontend::nn::{AttentionArgs, MultiheadAttention, MultiheadAttentionOptions, ModuleExt};
/// use kiln_frontend::{DType, Tensor};
/// let o = MultiheadAttentionOptions { batch_first: true, ..Default::default() };
/// let mha = MultiheadAttention::with(8, 2, o).unwrap();
/// let x = Tensor::zeros(&[2, 5, 8], DType::F32);
/// let (y, w) = mha.forward_attn(&x, &x, &x, None, None, AttentionArgs::default()).unwrap();
/// assert_eq!(y.dims(), &[2, 5, 8]);
/// assert_eq!(w.unwrap().dims(), &[2, 5, 5]);
/// let keys: Vec<String> = mha.state_dict().into_iter().map(|(k, _)| k).collect();
/// assert_eq!(keys, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
/// ```
pub struct MultiheadAttention {
    /// (3E, E): W_q, W_k, W_v stacked (when kdim == vdim == embed_dim).
    pub in_proj_weight: Option<Tensor>,
    pub q_proj_weight: Option<Tensor>,
    pub k_proj_weight: Option<Tensor>,
    pub v_proj_weight: Option<Tensor>,
    /// (3E,): b_q, b_k, b_v stacked.
    pub in_proj_bias: Option<Tensor>,
    pub out_proj: Linear,
    pub embed_dim: usize,
    pub num_heads: usize,
    pub kdim: usize,
    pub vdim: usize,
    pub batch_first: bool,
    /// Dropout on the attention weights (PyTorch's `F.dropout(training=self.training)`;
    /// it also holds the module's train/eval flag).
    attn_dropout: Dropout,
}

impl MultiheadAttention {
    /// `nn.MultiheadAttention(embed_dim, num_heads)` with the other defaults.
    pub fn new(embed_dim: usize, num_heads: usize) -> Result<MultiheadAttention> {
        MultiheadAttention::with(embed_dim, num_heads, MultiheadAttentionOptions::default())
    }

    /// `nn.MultiheadAttention(embed_dim, num_heads, **o)`; weights initialised
    /// as PyTorch does (xavier_uniform projections, zero biases).
    pub fn with(
        embed_dim: usize,
        num_heads: usize,
        o: MultiheadAttentionOptions,
    ) -> Result<MultiheadAttention> {
        if num_heads == 0 || embed_dim % num_heads != 0 {
            bail!(
                "MultiheadAttention",
                "embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            );
        }
        if o.add_bias_kv || o.add_zero_attn {
            bail!(
                "MultiheadAttention",
                "add_bias_kv and add_zero_attn are not supported (got add_bias_kv={}, add_zero_attn={})",
                o.add_bias_kv,
                o.add_zero_attn
            );
        }
        let (kdim, vdim) = (o.kdim.unwrap_or(embed_dim), o.vdim.unwrap_or(embed_dim));
        let packed = kdim == embed_dim && vdim == embed_dim;
        let e = embed_dim;
        let m = MultiheadAttention {
            in_proj_weight: packed.then(|| param(&[3 * e, e])),
            q_proj_weight: (!packed).then(|| param(&[e, e])),
            k_proj_weight: (!packed).then(|| param(&[e, kdim])),
            v_proj_weight: (!packed).then(|| param(&[e, vdim])),
            in_proj_bias: o.bias.then(|| param(&[3 * e])),
            out_proj: Linear::new(e, e, o.bias)?,
            embed_dim,
            num_heads,
            kdim,
            vdim,
            batch_first: o.batch_first,
            attn_dropout: Dropout::new(o.dropout)?,
        };
        for w in [
            &m.in_proj_weight,
            &m.q_proj_weight,
            &m.k_proj_weight,
            &m.v_proj_weight,
        ]
        .into_iter()
        .flatten()
        {
            super::init::xavier_uniform_(w, 1.0)?;
        }
        for b in [&m.in_proj_bias, &m.out_proj.bias].into_iter().flatten() {
            super::init::zeros_(b)?;
        }
        Ok(m)
    }

    /// `mha(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights, is_causal)`: the attention output and, when
    /// `need_weights`, the attention weights.
    pub fn forward_attn(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        attn_mask: Option<&Tensor>,
        args: AttentionArgs,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let batched = query.rank() == 3;
        if !matches!(query.rank(), 2 | 3)
            || key.rank() != query.rank()
            || value.rank() != query.rank()
        {
            bail!(
                "MultiheadAttention",
                "query, key and value must all be 3-D (batched) or 2-D (unbatched), got {}, {} and {}",
                fmt_dims(query.dims()),
                fmt_dims(key.dims()),
                fmt_dims(value.dims())
            );
        }
        // to (N, T, features)
        let to_nte = |t: &Tensor| -> Result<Tensor> {
            match (batched, self.batch_first) {
                (false, _) => t.unsqueeze(0),
                (true, true) => Ok(t.clone()),
                (true, false) => t.transpose(0, 1),
            }
        };
        let (q, k, v) = (to_nte(query)?, to_nte(key)?, to_nte(value)?);
        let kpm = match key_padding_mask {
            Some(m) if !batched => Some(m.unsqueeze(0)?),
            m => m.cloned(),
        };
        self.check_shapes(&q, &k, &v, kpm.as_ref())?;
        let (n, l, s) = (q.dims()[0], q.dims()[1], k.dims()[1]);
        let mask = self.merged_mask(n, l, s, kpm.as_ref(), attn_mask, args, q.dtype())?;
        let (q, k, v) = self.project(&q, &k, &v)?;
        let (out, weights) = self.attend(&q, &k, &v, mask.as_ref())?;
        let out = self.out_proj.forward(&out)?;
        let out = match (batched, self.batch_first) {
            (false, _) => out.squeeze(Some(&[0]))?,
            (true, true) => out,
            (true, false) => out.transpose(0, 1)?,
        };
        let weights = match args.need_weights {
            false => None,
            true => {
                let w = match args.average_attn_weights {
                    true => weights.mean(Some(&[1]), false)?,
                    false => weights,
                };
                Some(if batched { w } else { w.squeeze(Some(&[0]))? })
            }
        };
        Ok((out, weights))
    }

    fn check_shapes(&self, q: &Tensor, k: &Tensor, v: &Tensor, kpm: Option<&Tensor>) -> Result<()> {
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        if qd[2] != self.embed_dim || kd[2] != self.kdim || vd[2] != self.vdim {
            bail!(
                "MultiheadAttention",
                "expected query/key/value features {}/{}/{}, got query {}, key {}, value {}",
                self.embed_dim,
                self.kdim,
                self.vdim,
                fmt_dims(qd),
                fmt_dims(kd),
                fmt_dims(vd)
            );
        }
        if kd[..2] != vd[..2] || kd[0] != qd[0] {
            bail!(
                "MultiheadAttention",
                "query {}, key {} and value {} disagree on batch or source length",
                fmt_dims(qd),
                fmt_dims(kd),
                fmt_dims(vd)
            );
        }
        if let Some(m) = kpm {
            if m.dims() != [kd[0], kd[1]] {
                bail!(
                    "MultiheadAttention",
                    "key_padding_mask must be (batch, source length) = [{}, {}], got {}",
                    kd[0],
                    kd[1],
                    fmt_dims(m.dims())
                );
            }
        }
        Ok(())
    }

    /// The in-projections, split into heads: (N, H, T, head_dim) each.
    fn project(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let e = self.embed_dim;
        let w = |i: usize| -> Result<Tensor> {
            match &self.in_proj_weight {
                Some(w) => w.narrow(0, (i * e) as i64, e),
                None => Ok([
                    &self.q_proj_weight,
                    &self.k_proj_weight,
                    &self.v_proj_weight,
                ][i]
                    .clone()
                    .expect("separate projection weights exist when in_proj_weight does not")),
            }
        };
        let b = |i: usize| -> Result<Option<Tensor>> {
            self.in_proj_bias
                .as_ref()
                .map(|b| b.narrow(0, (i * e) as i64, e))
                .transpose()
        };
        let heads = |x: &Tensor, i: usize| -> Result<Tensor> {
            let y = F::linear(x, &w(i)?, b(i)?.as_ref())?;
            let (n, t) = (x.dims()[0], x.dims()[1]);
            let h = self.num_heads;
            y.reshape_dims(&[n, t, h, e / h])?.transpose(1, 2)
        };
        Ok((heads(q, 0)?, heads(k, 1)?, heads(v, 2)?))
    }

    /// softmax(q k^T / sqrt(head_dim) + mask) v, merged back to (N, L, E),
    /// and the weights (N, H, L, S).
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let head_dim = q.dims()[3];
        let q = q.binary_scalar(
            kiln_ir::BinaryOp::Mul,
            (1.0 / head_dim as f64).sqrt(),
            false,
        )?;
        let mut scores = F::matmul(&q, &k.transpose(2, 3)?)?;
        if let Some(m) = mask {
            scores = scores.add(m)?;
        }
        let weights = self.attn_dropout.forward(&scores.softmax(-1)?)?;
        let out = F::matmul(&weights, v)?;
        let (n, h, l, d) = (out.dims()[0], out.dims()[1], out.dims()[2], out.dims()[3]);
        Ok((out.transpose(1, 2)?.reshape_dims(&[n, l, h * d])?, weights))
    }

    /// key_padding_mask and attn_mask as one additive float mask that
    /// broadcasts to (N, H, L, S); None when there is none.
    #[allow(clippy::too_many_arguments)]
    fn merged_mask(
        &self,
        n: usize,
        l: usize,
        s: usize,
        kpm: Option<&Tensor>,
        attn_mask: Option<&Tensor>,
        args: AttentionArgs,
        dtype: DType,
    ) -> Result<Option<Tensor>> {
        if args.is_causal && attn_mask.is_none() {
            bail!(
                "MultiheadAttention",
                "is_causal=True needs attn_mask (is_causal is a hint that attn_mask is the causal mask)"
            );
        }
        // PyTorch then drops attn_mask and runs SDPA with is_causal: the causal mask itself
        if args.is_causal && kpm.is_none() && !args.need_weights {
            return Ok(Some(causal_mask(l, s, dtype)?));
        }
        let h = self.num_heads;
        let attn = match attn_mask {
            None => None,
            Some(m) => {
                let m = additive("attn_mask", m, dtype)?;
                Some(match m.dims() {
                    [ml, ms] if (*ml, *ms) == (l, s) => m,
                    [b, ml, ms] if (*b, *ml, *ms) == (n * h, l, s) => m.reshape_dims(&[n, h, l, s])?,
                    d => bail!(
                        "MultiheadAttention",
                        "attn_mask must be (L, S) = [{l}, {s}] or (N*num_heads, L, S) = [{}, {l}, {s}], got {}",
                        n * h,
                        fmt_dims(d)
                    ),
                })
            }
        };
        let pad = kpm
            .map(|m| additive("key_padding_mask", m, dtype)?.reshape_dims(&[n, 1, 1, s]))
            .transpose()?;
        Ok(match (attn, pad) {
            (Some(a), Some(p)) => Some(a.add(&p)?),
            (a, p) => a.or(p),
        })
    }
}

/// A bool mask (True = masked out) as 0 / -inf, or a float mask as it is.
fn additive(what: &str, m: &Tensor, dtype: DType) -> Result<Tensor> {
    match m.dtype() {
        DType::Bool => Tensor::zeros(m.dims(), dtype).masked_fill(m, f64::NEG_INFINITY),
        d if d.is_float() => m.to_dtype(dtype),
        d => bail!(
            "MultiheadAttention",
            "{what} must be bool or floating point, got {d} {}",
            fmt_dims(m.dims())
        ),
    }
}

/// The (L, S) causal mask as SDPA's `is_causal` builds it: position i sees
/// sources 0..=i (top-left aligned), the rest are -inf.
pub(crate) fn causal_mask(l: usize, s: usize, dtype: DType) -> Result<Tensor> {
    let v: Vec<f32> = (0..l)
        .flat_map(|i| (0..s).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(v, &[l, s])?.to_dtype(dtype)
}

impl Module for MultiheadAttention {
    /// Self-attention: `mha(x, x, x)[0]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let args = AttentionArgs {
                need_weights: false,
                ..Default::default()
            };
            Ok(self.forward_attn(x, x, x, None, None, args)?.0)
        })
    }
    /// `[query, key, value, key_padding_mask, attn_mask]` (a missing key is
    /// the query, a missing value the key) to `[attn_output, attn_weights]`.
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let get = |i: usize| inputs.get(i).copied().flatten();
        let Some(q) = get(0) else {
            bail!("MultiheadAttention", "forward_many needs a query (input 0)");
        };
        if inputs.len() > 5 {
            bail!(
                "MultiheadAttention",
                "forward_many takes [query, key, value, key_padding_mask, attn_mask], got {} inputs",
                inputs.len()
            );
        }
        let k = get(1).unwrap_or(q);
        let v = get(2).unwrap_or(k);
        let (out, w) = self.forward_attn(q, k, v, get(3), get(4), AttentionArgs::default())?;
        Ok([Some(out), w].into_iter().flatten().collect())
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, t) in [
            ("in_proj_weight", &self.in_proj_weight),
            ("q_proj_weight", &self.q_proj_weight),
            ("k_proj_weight", &self.k_proj_weight),
            ("v_proj_weight", &self.v_proj_weight),
            ("in_proj_bias", &self.in_proj_bias),
        ] {
            if let Some(t) = t {
                f(Entry::Param(n, t))
            }
        }
        f(Entry::Child("out_proj", &self.out_proj))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        for (n, t) in [
            ("in_proj_weight", &mut self.in_proj_weight),
            ("q_proj_weight", &mut self.q_proj_weight),
            ("k_proj_weight", &mut self.k_proj_weight),
            ("v_proj_weight", &mut self.v_proj_weight),
            ("in_proj_bias", &mut self.in_proj_bias),
        ] {
            if let Some(t) = t {
                f(EntryMut::Param(n, t))
            }
        }
        f(EntryMut::Child("out_proj", &mut self.out_proj))
    }
    fn set_own_training(&self, on: bool) {
        self.attn_dropout.set_own_training(on)
    }
    fn is_training(&self) -> bool {
        self.attn_dropout.is_training()
    }
    fn describe(&self) -> String {
        "MultiheadAttention".into()
    }
}
