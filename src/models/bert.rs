//! transformers' `BertModel` and `BertForSequenceClassification` with their
//! `BertConfig`, under Hugging Face's key names
//! (`bert.embeddings.word_embeddings.weight`,
//! `bert.encoder.layer.0.attention.self.query.weight`,
//! `bert.encoder.layer.0.output.LayerNorm.bias`, `bert.pooler.dense.weight`,
//! `classifier.weight`) so their checkpoints load as they are.
//!
//! Inputs go through `Module::forward_many` as transformers orders them:
//! `[input_ids, attention_mask, token_type_ids]`, the last two optional
//! (`None`: attend to every token; all segment 0). `attention_mask` is 1
//! for tokens to attend to and 0 for padding, in any dtype.

use super::hf::act2fn;
use crate::nn::{Activation, Dropout, Embedding, LayerNorm, Linear, Module, ModuleList, Training};
use crate::{functional as F, DType, Result, Tensor};
use kiln_ir::bail;
use kiln_ir::shape::fmt_dims;
use kiln_ir::BinaryOp;

/// The fields of `BertConfig` the architecture uses; `Default` is
/// transformers' (bert-base-uncased's sizes).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    /// `ACT2FN` name (see [`act2fn`]).
    pub hidden_act: String,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    /// `BertForSequenceClassification`'s classes.
    pub num_labels: usize,
    /// Before the classifier; None = `hidden_dropout_prob`.
    pub classifier_dropout: Option<f64>,
}

impl Default for BertConfig {
    fn default() -> BertConfig {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            initializer_range: 0.02,
            layer_norm_eps: 1e-12,
            pad_token_id: Some(0),
            num_labels: 2,
            classifier_dropout: None,
        }
    }
}

/// transformers' `_init_weights`: weights N(0, initializer_range), biases zero.
fn linear(c: &BertConfig, i: usize, o: usize) -> Result<Linear> {
    let l = Linear::new(i, o, true)?;
    crate::nn::init::normal_(&l.weight, 0.0, c.initializer_range)?;
    crate::nn::init::zeros_(l.bias.as_ref().expect("a bias"))?;
    Ok(l)
}

/// `nn.Embedding(n, hidden_size, padding_idx)` initialised N(0,
/// initializer_range), the padding row zero.
fn embedding(c: &BertConfig, n: usize, padding_idx: Option<i64>) -> Result<Embedding> {
    let e = Embedding::new(n, c.hidden_size, padding_idx)?;
    crate::nn::init::normal_(&e.weight, 0.0, c.initializer_range)?;
    if let Some(p) = padding_idx {
        let _g = crate::autograd::no_grad();
        let row = if p < 0 { p + n as i64 } else { p };
        e.weight
            .select(0, row)?
            .copy_(&Tensor::zeros(&[c.hidden_size], DType::F32))?;
    }
    Ok(e)
}

fn layer_norm(c: &BertConfig) -> LayerNorm {
    LayerNorm::new(&[c.hidden_size], c.layer_norm_eps, true)
}

/// `BertEmbeddings`: word + token type + position embeddings, LayerNorm, dropout.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertEmbeddings {
    pub word_embeddings: Embedding,
    pub position_embeddings: Embedding,
    pub token_type_embeddings: Embedding,
    #[module(name = "LayerNorm")]
    pub layer_norm: LayerNorm,
    pub dropout: Dropout,
    training: Training,
}

impl BertEmbeddings {
    fn new(c: &BertConfig) -> Result<BertEmbeddings> {
        Ok(BertEmbeddings {
            word_embeddings: embedding(c, c.vocab_size, c.pad_token_id)?,
            position_embeddings: embedding(c, c.max_position_embeddings, None)?,
            token_type_embeddings: embedding(c, c.type_vocab_size, None)?,
            layer_norm: layer_norm(c),
            dropout: Dropout::new(c.hidden_dropout_prob)?,
            training: Training::default(),
        })
    }

    /// Token ids (B, S) and optional segment ids (B, S) to (B, S, hidden).
    pub fn embed(&self, input_ids: &Tensor, token_type_ids: Option<&Tensor>) -> Result<Tensor> {
        let s = input_ids.dims()[1];
        let pos = Tensor::arange(s, DType::I64);
        let x = self.word_embeddings.forward(input_ids)?;
        let x = match token_type_ids {
            Some(t) => x.add(&self.token_type_embeddings.forward(t)?)?,
            // segment 0 for every token, as transformers' zero buffer
            None => {
                let zero = Tensor::zeros(&[1], DType::I64);
                x.add(&self.token_type_embeddings.forward(&zero)?)?
            }
        };
        let x = x.add(&self.position_embeddings.forward(&pos)?)?;
        self.dropout.forward(&self.layer_norm.forward(&x)?)
    }

    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.embed(input_ids, None)
    }
}

/// `BertSelfAttention`: multi-head scaled dot-product attention over
/// separate `query`, `key`, `value` projections.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertSelfAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub dropout: Dropout,
    #[module(skip)]
    num_heads: usize,
    training: Training,
}

impl BertSelfAttention {
    /// `x` (B, S, hidden); `mask` additive, broadcasting to (B, heads, S, S).
    pub fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, s, e) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let h = self.num_heads;
        let heads = |l: &Linear| -> Result<Tensor> {
            l.forward(x)?
                .reshape_dims(&[b, s, h, e / h])?
                .transpose(1, 2)
        };
        let (q, k, v) = (heads(&self.query)?, heads(&self.key)?, heads(&self.value)?);
        let scale = 1.0 / ((e / h) as f64).sqrt();
        let mut scores =
            F::matmul(&q, &k.transpose(2, 3)?)?.binary_scalar(BinaryOp::Mul, scale, false)?;
        if let Some(m) = mask {
            scores = scores.add(m)?;
        }
        let w = self.dropout.forward(&scores.softmax(-1)?)?;
        F::matmul(&w, &v)?.transpose(1, 2)?.reshape_dims(&[b, s, e])
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, None)
    }
}

/// `BertSelfOutput` and `BertOutput`: `LayerNorm(dropout(dense(h)) + input)`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertResidualOutput {
    pub dense: Linear,
    #[module(name = "LayerNorm")]
    pub layer_norm: LayerNorm,
    pub dropout: Dropout,
    training: Training,
}

impl BertResidualOutput {
    fn new(c: &BertConfig, width_in: usize) -> Result<BertResidualOutput> {
        Ok(BertResidualOutput {
            dense: linear(c, width_in, c.hidden_size)?,
            layer_norm: layer_norm(c),
            dropout: Dropout::new(c.hidden_dropout_prob)?,
            training: Training::default(),
        })
    }

    pub fn residual(&self, h: &Tensor, input: &Tensor) -> Result<Tensor> {
        let y = self.dropout.forward(&self.dense.forward(h)?)?;
        self.layer_norm.forward(&y.add(input)?)
    }

    /// With the input as its own residual (for a lone call; the layer uses
    /// [`BertResidualOutput::residual`]).
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        self.residual(h, h)
    }
}

/// `BertAttention`: `self` (the attention) and `output`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertAttention {
    #[module(name = "self")]
    pub self_attention: BertSelfAttention,
    pub output: BertResidualOutput,
    training: Training,
}

impl BertAttention {
    pub fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.output
            .residual(&self.self_attention.attend(x, mask)?, x)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, None)
    }
}

/// `BertIntermediate`: `intermediate_act_fn(dense(h))`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertIntermediate {
    pub dense: Linear,
    pub intermediate_act_fn: Activation,
    training: Training,
}

impl BertIntermediate {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.intermediate_act_fn.forward(&self.dense.forward(x)?)
    }
}

/// `BertLayer`: attention, then the feed-forward `intermediate` and `output`.
/// `forward_many(&[x, mask])` takes the additive mask of [`BertModel`].
#[derive(crate::nn::Module)]
#[module(crate = "crate", forward_many)]
pub struct BertLayer {
    pub attention: BertAttention,
    pub intermediate: BertIntermediate,
    pub output: BertResidualOutput,
    training: Training,
}

impl BertLayer {
    fn new(c: &BertConfig) -> Result<BertLayer> {
        let h = c.hidden_size;
        Ok(BertLayer {
            attention: BertAttention {
                self_attention: BertSelfAttention {
                    query: linear(c, h, h)?,
                    key: linear(c, h, h)?,
                    value: linear(c, h, h)?,
                    dropout: Dropout::new(c.attention_probs_dropout_prob)?,
                    num_heads: c.num_attention_heads,
                    training: Training::default(),
                },
                output: BertResidualOutput::new(c, h)?,
                training: Training::default(),
            },
            intermediate: BertIntermediate {
                dense: linear(c, h, c.intermediate_size)?,
                intermediate_act_fn: act2fn(&c.hidden_act)?,
                training: Training::default(),
            },
            output: BertResidualOutput::new(c, c.intermediate_size)?,
            training: Training::default(),
        })
    }

    pub fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let a = self.attention.attend(x, mask)?;
        self.output.residual(&self.intermediate.forward(&a)?, &a)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, None)
    }

    pub fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(x)] | [Some(x), None] => Ok(vec![self.attend(x, None)?]),
            [Some(x), Some(m)] => Ok(vec![self.attend(x, Some(m))?]),
            _ => bail!("BertLayer", "expected [hidden_states, attention_mask?]"),
        }
    }
}

/// `BertEncoder`: the `layer` list.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertEncoder {
    pub layer: ModuleList,
    training: Training,
}

impl BertEncoder {
    pub fn attend(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let mut x = x.clone();
        for l in self.layer.iter() {
            x = l.forward_many(&[Some(&x), mask])?.swap_remove(0);
        }
        Ok(x)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, None)
    }
}

/// `BertPooler`: `tanh(dense(h[:, 0]))`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct BertPooler {
    pub dense: Linear,
    pub activation: Activation,
    training: Training,
}

impl BertPooler {
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        self.activation
            .forward(&self.dense.forward(&h.select(1, 0)?)?)
    }
}

/// transformers' `BertModel`: `forward_many(&[input_ids, attention_mask?,
/// token_type_ids?])` returns `[last_hidden_state, pooler_output]` (the
/// second only with the pooler); `forward(input_ids)` the first.
///
/// ```
/// use kiln::models::bert::{BertConfig, BertModel};
/// use kiln::nn::{Module, ModuleExt};
/// let cfg = BertConfig { vocab_size: 64, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2,
///                        intermediate_size: 32, max_position_embeddings: 16, ..BertConfig::default() };
/// let m = BertModel::new(&cfg, true).unwrap();
/// let ids = kiln::Tensor::from_vec(vec![1i64, 5, 7, 0], &[1, 4]).unwrap();
/// let mask = kiln::Tensor::from_vec(vec![1i64, 1, 1, 0], &[1, 4]).unwrap();
/// let out = m.forward_many(&[Some(&ids), Some(&mask), None]).unwrap();
/// assert_eq!((out[0].dims(), out[1].dims()), (&[1, 4, 16][..], &[1, 16][..]));
/// assert!(m.state_dict().iter().any(|(k, _)| k == "encoder.layer.0.attention.self.query.weight"));
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate", forward_many)]
pub struct BertModel {
    pub embeddings: BertEmbeddings,
    pub encoder: BertEncoder,
    pub pooler: Option<BertPooler>,
    training: Training,
}

impl BertModel {
    /// `BertModel(config, add_pooling_layer)`.
    pub fn new(c: &BertConfig, add_pooling_layer: bool) -> Result<BertModel> {
        if c.num_attention_heads == 0 || c.hidden_size % c.num_attention_heads != 0 {
            bail!(
                "BertModel",
                "The hidden size ({}) is not a multiple of the number of attention heads ({})",
                c.hidden_size,
                c.num_attention_heads
            );
        }
        let mut layer = ModuleList::new();
        for _ in 0..c.num_hidden_layers {
            layer.push(BertLayer::new(c)?);
        }
        let pooler = match add_pooling_layer {
            true => Some(BertPooler {
                dense: linear(c, c.hidden_size, c.hidden_size)?,
                activation: Activation::tanh(),
                training: Training::default(),
            }),
            false => None,
        };
        Ok(BertModel {
            embeddings: BertEmbeddings::new(c)?,
            encoder: BertEncoder {
                layer,
                training: Training::default(),
            },
            pooler,
            training: Training::default(),
        })
    }

    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        Ok(self.forward_many(&[Some(input_ids)])?.swap_remove(0))
    }

    pub fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (ids, mask, types) = self.check_inputs(inputs)?;
        let x = self.embeddings.embed(ids, types)?;
        let mask = mask.map(additive_mask).transpose()?;
        let h = self.encoder.attend(&x, mask.as_ref())?;
        let mut out = vec![];
        if let Some(p) = &self.pooler {
            out.push(p.forward(&h)?);
        }
        out.insert(0, h);
        Ok(out)
    }

    /// `[input_ids, attention_mask?, token_type_ids?]`: integer ids (B, S)
    /// with S at most `max_position_embeddings`, the others (B, S).
    #[allow(clippy::type_complexity)]
    fn check_inputs<'t>(
        &self,
        inputs: &[Option<&'t Tensor>],
    ) -> Result<(&'t Tensor, Option<&'t Tensor>, Option<&'t Tensor>)> {
        let (ids, mask, types) = match *inputs {
            [Some(i)] => (i, None, None),
            [Some(i), m] => (i, m, None),
            [Some(i), m, t] => (i, m, t),
            _ => bail!(
                "BertModel",
                "expected [input_ids, attention_mask?, token_type_ids?], got {} inputs{}",
                inputs.len(),
                if inputs.first().is_some_and(|i| i.is_none()) {
                    " without input_ids"
                } else {
                    ""
                }
            ),
        };
        let max = self.embeddings.position_embeddings.weight.dims()[0];
        if ids.rank() != 2 || ids.dtype().is_float() || ids.dims()[1] > max {
            bail!(
                "BertModel",
                "expected integer input_ids (batch, seq) with seq <= max_position_embeddings ({max}), got {} {}",
                ids.dtype(),
                fmt_dims(ids.dims())
            );
        }
        for (what, t) in [("attention_mask", mask), ("token_type_ids", types)] {
            if let Some(t) = t.filter(|t| t.dims() != ids.dims()) {
                bail!(
                    "BertModel",
                    "{what} must have input_ids' shape {}, got {}",
                    fmt_dims(ids.dims()),
                    fmt_dims(t.dims())
                );
            }
        }
        Ok((ids, mask, types))
    }
}

/// A (B, S) mask of 1 (attend) and 0 (padding) as transformers' additive
/// (B, 1, 1, S) mask: 0 where attended, the dtype's minimum where not.
fn additive_mask(mask: &Tensor) -> Result<Tensor> {
    let (b, s) = (mask.dims()[0], mask.dims()[1]);
    let m = mask.to_dtype(DType::F32)?;
    let inverted = m.binary_scalar(BinaryOp::Sub, 1.0, true)?; // 1 - mask
    inverted
        .binary_scalar(BinaryOp::Mul, f32::MIN as f64, false)?
        .reshape_dims(&[b, 1, 1, s])
}

/// transformers' `BertForSequenceClassification`: the pooled output through
/// dropout and `classifier`; `forward_many(&[input_ids, attention_mask?,
/// token_type_ids?])` returns `[logits]` (B, num_labels).
///
/// ```
/// use kiln::models::bert::{BertConfig, BertForSequenceClassification};
/// use kiln::nn::{Module, ModuleExt};
/// let cfg = BertConfig { vocab_size: 64, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2,
///                        intermediate_size: 32, max_position_embeddings: 16, num_labels: 3,
///                        ..BertConfig::default() };
/// let m = BertForSequenceClassification::new(&cfg).unwrap();
/// let ids = kiln::Tensor::from_vec(vec![1i64, 5, 7, 2], &[2, 2]).unwrap();
/// assert_eq!(m.forward(&ids).unwrap().dims(), &[2, 3]);
/// assert_eq!(m.state_dict()[0].0, "bert.embeddings.word_embeddings.weight");
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate", forward_many)]
pub struct BertForSequenceClassification {
    pub bert: BertModel,
    pub dropout: Dropout,
    pub classifier: Linear,
    training: Training,
}

impl BertForSequenceClassification {
    pub fn new(c: &BertConfig) -> Result<BertForSequenceClassification> {
        Ok(BertForSequenceClassification {
            bert: BertModel::new(c, true)?,
            dropout: Dropout::new(c.classifier_dropout.unwrap_or(c.hidden_dropout_prob))?,
            classifier: linear(c, c.hidden_size, c.num_labels)?,
            training: Training::default(),
        })
    }

    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        Ok(self.forward_many(&[Some(input_ids)])?.swap_remove(0))
    }

    pub fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let pooled = self.bert.forward_many(inputs)?.swap_remove(1);
        Ok(vec![self
            .classifier
            .forward(&self.dropout.forward(&pooled)?)?])
    }
}
