//! `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer`: attention
//! blocks plus a feed-forward block, post-norm (`norm_first=False`, BERT) or
//! pre-norm, under PyTorch's child names (`self_attn`, `linear1`, `norm1`, ...).

use super::{
    Activation, AttentionArgs, Dropout, Entry, EntryMut, LayerNorm, Linear, Module,
    MultiheadAttention, MultiheadAttentionOptions,
};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// The keyword arguments shared by both layers, PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerLayerOptions {
    pub dim_feedforward: usize,
    pub dropout: f64,
    /// `"relu"` or `"gelu"`.
    pub activation: String,
    pub layer_norm_eps: f64,
    pub batch_first: bool,
    pub norm_first: bool,
    pub bias: bool,
}

impl Default for TransformerLayerOptions {
    fn default() -> Self {
        TransformerLayerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: "relu".into(),
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

/// The parts both layers share: the feed-forward block and its settings.
struct FeedForward {
    activation: Activation,
    norm_first: bool,
}

fn activation(name: &str) -> Result<Activation> {
    match name {
        "relu" => Ok(Activation::relu()),
        "gelu" => Ok(Activation::gelu(false)),
        other => bail!(
            "TransformerLayer",
            "activation should be relu/gelu, not {other}"
        ),
    }
}

fn attention(
    d_model: usize,
    nhead: usize,
    o: &TransformerLayerOptions,
) -> Result<MultiheadAttention> {
    MultiheadAttention::with(
        d_model,
        nhead,
        MultiheadAttentionOptions {
            dropout: o.dropout,
            bias: o.bias,
            batch_first: o.batch_first,
            ..Default::default()
        },
    )
}

fn layer_norm(d_model: usize, o: &TransformerLayerOptions) -> LayerNorm {
    let mut n = LayerNorm::new(&[d_model], o.layer_norm_eps, true);
    if !o.bias {
        n.bias = None;
    }
    n
}

/// `attn(x, kv, kv, ...)` with `need_weights=False`, through `dropout`.
fn attention_block(
    attn: &MultiheadAttention,
    x: &Tensor,
    kv: &Tensor,
    mask: Option<&Tensor>,
    key_padding_mask: Option<&Tensor>,
    is_causal: bool,
    dropout: &Dropout,
) -> Result<Tensor> {
    let args = AttentionArgs {
        need_weights: false,
        average_attn_weights: true,
        is_causal,
    };
    let (y, _) = attn.forward_attn(x, kv, kv, key_padding_mask, mask, args)?;
    dropout.forward(&y)
}

/// `linear2(dropout(activation(linear1(x))))`, then `dropout_out`.
fn feed_forward_block(
    l1: &Linear,
    l2: &Linear,
    ff: &FeedForward,
    dropout: &Dropout,
    dropout_out: &Dropout,
    x: &Tensor,
) -> Result<Tensor> {
    let h = dropout.forward(&ff.activation.forward(&l1.forward(x)?)?)?;
    dropout_out.forward(&l2.forward(&h)?)
}

/// `x + block(norm(x))` (pre-norm) or `norm(x + block(x))` (post-norm).
fn residual(
    norm_first: bool,
    norm: &LayerNorm,
    x: &Tensor,
    block: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if norm_first {
        x.add(&block(&norm.forward(x)?)?)
    } else {
        norm.forward(&x.add(&block(x)?)?)
    }
}

/// `nn.TransformerEncoderLayer(d_model, nhead, ...)`.
///
/// ```
/// use kiln_frontend::nn::{ModuleExt, TransformerEncoderLayer, TransformerLayerOptions};
/// use kiln_frontend::{DType, Tensor};
/// let o = TransformerLayerOptions { dim_feedforward: 16, dropout: 0.0, batch_first: true, ..Default::default() };
/// let layer = TransformerEncoderLayer::new(8, 2, o).unwrap();
/// let y = layer.forward_src(&Tensor::zeros(&[2, 4, 8], DType::F32), None, None, false).unwrap();
/// assert_eq!(y.dims(), &[2, 4, 8]);
/// assert!(layer.state_dict().iter().any(|(k, _)| k == "self_attn.in_proj_weight"));
/// ```
pub struct TransformerEncoderLayer {
    pub self_attn: MultiheadAttention,
    pub linear1: Linear,
    pub dropout: Dropout,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    ff: FeedForward,
}

impl TransformerEncoderLayer {
    pub fn new(d_model: usize, nhead: usize, o: TransformerLayerOptions) -> Result<Self> {
        Ok(TransformerEncoderLayer {
            self_attn: attention(d_model, nhead, &o)?,
            linear1: Linear::new(d_model, o.dim_feedforward, o.bias)?,
            dropout: Dropout::new(o.dropout)?,
            linear2: Linear::new(o.dim_feedforward, d_model, o.bias)?,
            norm1: layer_norm(d_model, &o),
            norm2: layer_norm(d_model, &o),
            dropout1: Dropout::new(o.dropout)?,
            dropout2: Dropout::new(o.dropout)?,
            ff: FeedForward {
                activation: activation(&o.activation)?,
                norm_first: o.norm_first,
            },
        })
    }

    /// `layer(src, src_mask, src_key_padding_mask, is_causal)`.
    pub fn forward_src(
        &self,
        src: &Tensor,
        src_mask: Option<&Tensor>,
        src_key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        let nf = self.ff.norm_first;
        let x = residual(nf, &self.norm1, src, |x| {
            attention_block(
                &self.self_attn,
                x,
                x,
                src_mask,
                src_key_padding_mask,
                is_causal,
                &self.dropout1,
            )
        })?;
        residual(nf, &self.norm2, &x, |x| {
            feed_forward_block(
                &self.linear1,
                &self.linear2,
                &self.ff,
                &self.dropout,
                &self.dropout2,
                x,
            )
        })
    }

    fn children(&self) -> [(&'static str, &dyn Module); 8] {
        [
            ("self_attn", &self.self_attn),
            ("linear1", &self.linear1),
            ("dropout", &self.dropout),
            ("linear2", &self.linear2),
            ("norm1", &self.norm1),
            ("norm2", &self.norm2),
            ("dropout1", &self.dropout1),
            ("dropout2", &self.dropout2),
        ]
    }
}

impl Module for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| self.forward_src(x, None, None, false))
    }
    /// `[src, src_mask, src_key_padding_mask]` to `[output]`.
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(src), rest @ ..] if rest.len() <= 2 => {
                let get = |i: usize| rest.get(i).copied().flatten();
                Ok(vec![self.forward_src(src, get(0), get(1), false)?])
            }
            _ => bail!(
                "TransformerEncoderLayer",
                "forward_many takes [src, src_mask, src_key_padding_mask], got {} inputs",
                inputs.len()
            ),
        }
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, c) in self.children() {
            f(Entry::Child(n, c))
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Child("self_attn", &mut self.self_attn));
        f(EntryMut::Child("linear1", &mut self.linear1));
        f(EntryMut::Child("dropout", &mut self.dropout));
        f(EntryMut::Child("linear2", &mut self.linear2));
        f(EntryMut::Child("norm1", &mut self.norm1));
        f(EntryMut::Child("norm2", &mut self.norm2));
        f(EntryMut::Child("dropout1", &mut self.dropout1));
        f(EntryMut::Child("dropout2", &mut self.dropout2));
    }
    fn describe(&self) -> String {
        "TransformerEncoderLayer".into()
    }
}

/// `nn.TransformerDecoderLayer(d_model, nhead, ...)`: self-attention over
/// `tgt`, attention from `tgt` to `memory`, then the feed-forward block.
///
/// ```
/// use kiln_frontend::nn::{TransformerDecoderLayer, TransformerLayerOptions};
/// use kiln_frontend::{DType, Tensor};
/// let o = TransformerLayerOptions { dim_feedforward: 16, dropout: 0.0, ..Default::default() };
/// let layer = TransformerDecoderLayer::new(8, 2, o).unwrap();
/// let (tgt, mem) = (Tensor::zeros(&[4, 2, 8], DType::F32), Tensor::zeros(&[5, 2, 8], DType::F32));
/// let y = layer.forward_tgt(&tgt, &mem, Default::default()).unwrap();
/// assert_eq!(y.dims(), &[4, 2, 8]);
/// ```
pub struct TransformerDecoderLayer {
    pub self_attn: MultiheadAttention,
    pub multihead_attn: MultiheadAttention,
    pub linear1: Linear,
    pub dropout: Dropout,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub norm3: LayerNorm,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    pub dropout3: Dropout,
    ff: FeedForward,
}

/// The optional arguments of `TransformerDecoderLayer.forward`.
#[derive(Default, Clone, Copy)]
pub struct DecoderMasks<'a> {
    pub tgt_mask: Option<&'a Tensor>,
    pub memory_mask: Option<&'a Tensor>,
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    pub memory_key_padding_mask: Option<&'a Tensor>,
    pub tgt_is_causal: bool,
    pub memory_is_causal: bool,
}

impl TransformerDecoderLayer {
    pub fn new(d_model: usize, nhead: usize, o: TransformerLayerOptions) -> Result<Self> {
        Ok(TransformerDecoderLayer {
            self_attn: attention(d_model, nhead, &o)?,
            multihead_attn: attention(d_model, nhead, &o)?,
            linear1: Linear::new(d_model, o.dim_feedforward, o.bias)?,
            dropout: Dropout::new(o.dropout)?,
            linear2: Linear::new(o.dim_feedforward, d_model, o.bias)?,
            norm1: layer_norm(d_model, &o),
            norm2: layer_norm(d_model, &o),
            norm3: layer_norm(d_model, &o),
            dropout1: Dropout::new(o.dropout)?,
            dropout2: Dropout::new(o.dropout)?,
            dropout3: Dropout::new(o.dropout)?,
            ff: FeedForward {
                activation: activation(&o.activation)?,
                norm_first: o.norm_first,
            },
        })
    }

    /// `layer(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask, tgt_is_causal, memory_is_causal)`.
    pub fn forward_tgt(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        m: DecoderMasks<'_>,
    ) -> Result<Tensor> {
        let nf = self.ff.norm_first;
        let x = residual(nf, &self.norm1, tgt, |x| {
            attention_block(
                &self.self_attn,
                x,
                x,
                m.tgt_mask,
                m.tgt_key_padding_mask,
                m.tgt_is_causal,
                &self.dropout1,
            )
        })?;
        let x = residual(nf, &self.norm2, &x, |x| {
            attention_block(
                &self.multihead_attn,
                x,
                memory,
                m.memory_mask,
                m.memory_key_padding_mask,
                m.memory_is_causal,
                &self.dropout2,
            )
        })?;
        residual(nf, &self.norm3, &x, |x| {
            feed_forward_block(
                &self.linear1,
                &self.linear2,
                &self.ff,
                &self.dropout,
                &self.dropout3,
                x,
            )
        })
    }

    fn children(&self) -> [(&'static str, &dyn Module); 11] {
        [
            ("self_attn", &self.self_attn),
            ("multihead_attn", &self.multihead_attn),
            ("linear1", &self.linear1),
            ("dropout", &self.dropout),
            ("linear2", &self.linear2),
            ("norm1", &self.norm1),
            ("norm2", &self.norm2),
            ("norm3", &self.norm3),
            ("dropout1", &self.dropout1),
            ("dropout2", &self.dropout2),
            ("dropout3", &self.dropout3),
        ]
    }
}

impl Module for TransformerDecoderLayer {
    /// A decoder needs `memory`: call `forward_many` or `forward_tgt`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        bail!(
            "TransformerDecoderLayer",
            "forward takes (tgt, memory): call forward_many(&[tgt, memory, ...]) or forward_tgt (got one input {})",
            kiln_ir::shape::fmt_dims(x.dims())
        )
    }
    /// `[tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask]` to `[output]`.
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(tgt), Some(memory), rest @ ..] if rest.len() <= 4 => {
                let get = |i: usize| rest.get(i).copied().flatten();
                let m = DecoderMasks {
                    tgt_mask: get(0),
                    memory_mask: get(1),
                    tgt_key_padding_mask: get(2),
                    memory_key_padding_mask: get(3),
                    ..Default::default()
                };
                Ok(vec![self.forward_tgt(tgt, memory, m)?])
            }
            _ => bail!(
                "TransformerDecoderLayer",
                "forward_many takes [tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, \
                 memory_key_padding_mask], got {} inputs",
                inputs.len()
            ),
        }
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, c) in self.children() {
            f(Entry::Child(n, c))
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Child("self_attn", &mut self.self_attn));
        f(EntryMut::Child("multihead_attn", &mut self.multihead_attn));
        f(EntryMut::Child("linear1", &mut self.linear1));
        f(EntryMut::Child("dropout", &mut self.dropout));
        f(EntryMut::Child("linear2", &mut self.linear2));
        f(EntryMut::Child("norm1", &mut self.norm1));
        f(EntryMut::Child("norm2", &mut self.norm2));
        f(EntryMut::Child("norm3", &mut self.norm3));
        f(EntryMut::Child("dropout1", &mut self.dropout1));
        f(EntryMut::Child("dropout2", &mut self.dropout2));
        f(EntryMut::Child("dropout3", &mut self.dropout3));
    }
    fn describe(&self) -> String {
        "TransformerDecoderLayer".into()
    }
}
