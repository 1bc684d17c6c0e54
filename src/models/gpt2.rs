//! transformers' `GPT2LMHeadModel` with its `GPT2Config`, under Hugging
//! Face's key names (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`,
//! ..., `lm_head.weight`) so its checkpoints load as they are. `lm_head`
//! is tied to `transformer.wte`: one tensor, listed once by `parameters()`.

use crate::nn::{
    Activation, Dropout, Embedding, Entry, EntryMut, LayerNorm, LoadReport, Module, ModuleExt,
    ModuleList, Training,
};
use crate::{functional as F, DType, Result, Tensor};
use kiln_ir::bail;
use kiln_ir::shape::fmt_dims;

/// The fields of `GPT2Config` the architecture uses, transformers' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// MLP width; None = 4 * n_embd.
    pub n_inner: Option<usize>,
    /// `"gelu_new"` (tanh approximation), `"gelu"`, `"relu"` (see [`super::hf::act2fn`]).
    pub activation_function: String,
    pub resid_pdrop: f64,
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub layer_norm_epsilon: f64,
    pub initializer_range: f64,
}

impl Default for Gpt2Config {
    fn default() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: None,
            activation_function: "gelu_new".into(),
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
        }
    }
}

/// transformers' `Conv1D`: a linear layer whose weight is stored (in, out),
/// `y = x @ weight + bias`.
pub struct Conv1D {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Conv1D {
    pub fn new(nx: usize, nf: usize, std: f64) -> Result<Conv1D> {
        let weight = Tensor::zeros(&[nx, nf], DType::F32).requires_grad_(true);
        crate::nn::init::normal_(&weight, 0.0, std)?;
        Ok(Conv1D {
            weight,
            bias: Tensor::zeros(&[nf], DType::F32).requires_grad_(true),
        })
    }
}

impl Module for Conv1D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::linear(x, &self.weight.t()?, Some(&self.bias))
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Param("weight", &self.weight));
        f(Entry::Param("bias", &self.bias));
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Param("weight", &mut self.weight));
        f(EntryMut::Param("bias", &mut self.bias));
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!("Conv1D(nf={}, nx={})", d[1], d[0])
    }
}

/// `GPT2Attention`: causal multi-head self-attention over a fused `c_attn`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Gpt2Attention {
    pub c_attn: Conv1D,
    pub c_proj: Conv1D,
    pub attn_dropout: Dropout,
    pub resid_dropout: Dropout,
    #[module(skip)]
    n_head: usize,
    training: Training,
}

impl Gpt2Attention {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, e) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let h = self.n_head;
        let qkv = self.c_attn.forward(x)?;
        let heads = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, (i * e) as i64, e)?
                .reshape_dims(&[b, t, h, e / h])?
                .transpose(1, 2)
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scale = 1.0 / ((e / h) as f64).sqrt();
        let scores = F::matmul(&q, &k.transpose(2, 3)?)?
            .binary_scalar(kiln_ir::BinaryOp::Mul, scale, false)?
            .add(&causal_mask(t)?)?;
        let w = self.attn_dropout.forward(&scores.softmax(-1)?)?;
        let y = F::matmul(&w, &v)?
            .transpose(1, 2)?
            .reshape_dims(&[b, t, e])?;
        self.resid_dropout.forward(&self.c_proj.forward(&y)?)
    }
}

/// (T, T): 0 on and below the diagonal, -inf above (future tokens).
fn causal_mask(t: usize) -> Result<Tensor> {
    let v: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(v, &[t, t])
}

/// `GPT2MLP`: `c_proj(act(c_fc(x)))`.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Gpt2Mlp {
    pub c_fc: Conv1D,
    pub c_proj: Conv1D,
    /// `ACT2FN[activation_function]`.
    pub act: Activation,
    pub dropout: Dropout,
    training: Training,
}

impl Gpt2Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.act.forward(&self.c_fc.forward(x)?)?;
        self.dropout.forward(&self.c_proj.forward(&h)?)
    }
}

/// `GPT2Block`: pre-norm attention and MLP with residuals.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Gpt2Block {
    pub ln_1: LayerNorm,
    pub attn: Gpt2Attention,
    pub ln_2: LayerNorm,
    pub mlp: Gpt2Mlp,
    training: Training,
}

impl Gpt2Block {
    fn new(c: &Gpt2Config) -> Result<Gpt2Block> {
        let (e, std) = (c.n_embd, c.initializer_range);
        // GPT-2's scaled init of the residual projections
        let proj_std = std / (2.0 * c.n_layer as f64).sqrt();
        let inner = c.n_inner.unwrap_or(4 * e);
        Ok(Gpt2Block {
            ln_1: LayerNorm::new(&[e], c.layer_norm_epsilon, true),
            attn: Gpt2Attention {
                c_attn: Conv1D::new(e, 3 * e, std)?,
                c_proj: Conv1D::new(e, e, proj_std)?,
                attn_dropout: Dropout::new(c.attn_pdrop)?,
                resid_dropout: Dropout::new(c.resid_pdrop)?,
                n_head: c.n_head,
                training: Training::default(),
            },
            ln_2: LayerNorm::new(&[e], c.layer_norm_epsilon, true),
            mlp: Gpt2Mlp {
                c_fc: Conv1D::new(e, inner, std)?,
                c_proj: Conv1D::new(inner, e, proj_std)?,
                act: super::hf::act2fn(&c.activation_function)?,
                dropout: Dropout::new(c.resid_pdrop)?,
                training: Training::default(),
            },
            training: Training::default(),
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}

/// `GPT2Model`: token and position embeddings, the blocks, `ln_f`.
/// Its input is token ids (int64, (B, T)); its output the hidden states.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Gpt2Model {
    pub wte: Embedding,
    pub wpe: Embedding,
    pub drop: Dropout,
    pub h: ModuleList,
    pub ln_f: LayerNorm,
    training: Training,
}

impl Gpt2Model {
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        let n_positions = self.wpe.weight.dims()[0];
        if input_ids.rank() != 2
            || input_ids.dtype().is_float()
            || input_ids.dims()[1] > n_positions
        {
            bail!(
                "GPT2Model",
                "expected integer input_ids (batch, seq) with seq <= n_positions ({n_positions}), got {} {}",
                input_ids.dtype(),
                fmt_dims(input_ids.dims())
            );
        }
        let t = input_ids.dims()[1];
        let pos = Tensor::arange(t, DType::I64);
        let x = self.wte.forward(input_ids)?.add(&self.wpe.forward(&pos)?)?;
        let mut x = self.drop.forward(&x)?;
        for block in self.h.iter() {
            x = block.forward(&x)?;
        }
        self.ln_f.forward(&x)
    }
}

/// `GPT2LMHeadModel`: [`Gpt2Model`] and the language-model head, whose
/// weight is `transformer.wte.weight` itself.
///
/// ```
/// use kiln::models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
/// use kiln::nn::ModuleExt;
/// let cfg = Gpt2Config { vocab_size: 64, n_positions: 16, n_embd: 16, n_layer: 1, n_head: 2,
///                        ..Gpt2Config::default() };
/// let m = Gpt2LMHeadModel::new(&cfg).unwrap();
/// let ids = kiln::Tensor::from_vec(vec![1i64, 5, 7, 2], &[1, 4]).unwrap();
/// assert_eq!(m.forward(&ids).unwrap().dims(), &[1, 4, 64]);
/// // tied: in the state_dict twice, a parameter once
/// assert!(m.state_dict().iter().any(|(k, _)| k == "lm_head.weight"));
/// assert!(!m.named_parameters().iter().any(|(k, _)| k == "lm_head.weight"));
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Gpt2LMHeadModel {
    pub transformer: Gpt2Model,
    /// `lm_head` (no bias), tied to `transformer.wte`.
    pub lm_head: crate::nn::Linear,
    training: Training,
}

impl Gpt2LMHeadModel {
    pub fn new(c: &Gpt2Config) -> Result<Gpt2LMHeadModel> {
        if c.n_head == 0 || c.n_embd % c.n_head != 0 {
            bail!(
                "GPT2LMHeadModel",
                "n_embd ({}) must be divisible by n_head ({})",
                c.n_embd,
                c.n_head
            );
        }
        let std = c.initializer_range;
        let wte = Embedding::new(c.vocab_size, c.n_embd, None)?;
        let wpe = Embedding::new(c.n_positions, c.n_embd, None)?;
        crate::nn::init::normal_(&wte.weight, 0.0, std)?;
        crate::nn::init::normal_(&wpe.weight, 0.0, std)?;
        let mut h = ModuleList::new();
        for _ in 0..c.n_layer {
            h.push(Gpt2Block::new(c)?);
        }
        let lm_head = crate::nn::Linear {
            weight: wte.weight.clone(),
            bias: None,
        };
        Ok(Gpt2LMHeadModel {
            transformer: Gpt2Model {
                wte,
                wpe,
                drop: Dropout::new(c.embd_pdrop)?,
                h,
                ln_f: LayerNorm::new(&[c.n_embd], c.layer_norm_epsilon, true),
                training: Training::default(),
            },
            lm_head,
            training: Training::default(),
        })
    }

    /// Token ids (B, T) to logits (B, T, vocab_size).
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(&self.transformer.forward(input_ids)?)
    }

    /// Loads a transformers checkpoint (`model.safetensors` of
    /// `save_pretrained`): that file leaves out `lm_head.weight`, which is
    /// tied to `transformer.wte.weight` (transformers' `_tied_weights_keys`),
    /// so when only the embedding is there the head takes it, as
    /// `from_pretrained` ties it. Everything else is checked as
    /// [`ModuleExt::load_state_dict`] checks it (strictly when `strict`).
    pub fn load_hf_state_dict(&self, sd: &[(String, Tensor)], strict: bool) -> Result<LoadReport> {
        let find = |k: &str| sd.iter().find(|(n, _)| n == k).map(|(_, t)| t.clone());
        match (find("lm_head.weight"), find("transformer.wte.weight")) {
            (None, Some(wte)) => {
                let mut tied = sd.to_vec();
                tied.push(("lm_head.weight".to_string(), wte));
                self.load_state_dict(&tied, strict)
            }
            _ => self.load_state_dict(sd, strict),
        }
    }
}
