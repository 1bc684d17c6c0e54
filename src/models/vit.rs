//! torchvision's `VisionTransformer` (ViT), sized by its constructor
//! arguments, with torchvision's module names so its checkpoints load
//! as they are (`conv_proj`, `class_token`, `encoder.pos_embedding`,
//! `encoder.layers.encoder_layer_0.self_attention.in_proj_weight`, ...,
//! `heads.head`).

use crate::nn::{
    Activation, AttentionArgs, Conv, ConvOptions, Dropout, LayerNorm, Linear, Module, ModuleDict,
    MultiheadAttention, MultiheadAttentionOptions, Sequential, Training,
};
use crate::{DType, Result, Tensor};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, op::conv::Padding};

/// `VisionTransformer(image_size, patch_size, num_layers, num_heads,
/// hidden_dim, mlp_dim, dropout, attention_dropout, num_classes,
/// representation_size)`; `norm_layer` is torchvision's
/// `LayerNorm(eps=1e-6)` and there is no conv stem.
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    pub image_size: usize,
    pub patch_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub hidden_dim: usize,
    pub mlp_dim: usize,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub num_classes: usize,
    /// A `pre_logits` Linear + Tanh before the head when set.
    pub representation_size: Option<usize>,
}

impl VitConfig {
    /// `torchvision.models.vit_b_16()`'s architecture.
    pub fn vit_b_16() -> VitConfig {
        VitConfig {
            image_size: 224,
            patch_size: 16,
            num_layers: 12,
            num_heads: 12,
            hidden_dim: 768,
            mlp_dim: 3072,
            dropout: 0.0,
            attention_dropout: 0.0,
            num_classes: 1000,
            representation_size: None,
        }
    }
}

/// `torchvision.models.vit_b_16()` (freshly initialised; load torchvision's
/// weights with `load_state_dict`).
pub fn vit_b_16() -> Result<VisionTransformer> {
    VisionTransformer::new(&VitConfig::vit_b_16())
}

const LN_EPS: f64 = 1e-6;

/// `EncoderBlock`: pre-norm self-attention and MLP, each with a residual.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct EncoderBlock {
    pub ln_1: LayerNorm,
    pub self_attention: MultiheadAttention,
    pub dropout: Dropout,
    pub ln_2: LayerNorm,
    /// `MLPBlock`: Linear, GELU, Dropout, Linear, Dropout (keys `mlp.0`, `mlp.3`).
    pub mlp: Sequential,
    training: Training,
}

impl EncoderBlock {
    fn new(c: &VitConfig) -> Result<EncoderBlock> {
        let attn = MultiheadAttentionOptions {
            dropout: c.attention_dropout,
            batch_first: true,
            ..Default::default()
        };
        Ok(EncoderBlock {
            ln_1: LayerNorm::new(&[c.hidden_dim], LN_EPS, true),
            self_attention: MultiheadAttention::with(c.hidden_dim, c.num_heads, attn)?,
            dropout: Dropout::new(c.dropout)?,
            ln_2: LayerNorm::new(&[c.hidden_dim], LN_EPS, true),
            mlp: Sequential::new()
                .add(Linear::new(c.hidden_dim, c.mlp_dim, true)?)
                .add(Activation::gelu(false))
                .add(Dropout::new(c.dropout)?)
                .add(Linear::new(c.mlp_dim, c.hidden_dim, true)?)
                .add(Dropout::new(c.dropout)?),
            training: Training::default(),
        })
    }

    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let x = self.ln_1.forward(input)?;
        let args = AttentionArgs {
            need_weights: false,
            ..Default::default()
        };
        let (x, _) = self
            .self_attention
            .forward_attn(&x, &x, &x, None, None, args)?;
        let x = self.dropout.forward(&x)?.add(input)?;
        let y = self.mlp.forward(&self.ln_2.forward(&x)?)?;
        x.add(&y)
    }
}

/// `Encoder`: position embedding, the blocks, a final LayerNorm.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct Encoder {
    /// (1, seq_length, hidden_dim), class token included.
    pub pos_embedding: Tensor,
    pub dropout: Dropout,
    /// `encoder_layer_0`, `encoder_layer_1`, ... (each an [`EncoderBlock`]).
    pub layers: ModuleDict,
    pub ln: LayerNorm,
    #[module(skip)]
    num_layers: usize,
    training: Training,
}

impl Encoder {
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        if input.dims()[1..] != self.pos_embedding.dims()[1..] {
            bail!(
                "VisionTransformer",
                "the encoder expects (N, {}, {}) tokens, got {} (image size and patch size fix the sequence length)",
                self.pos_embedding.dims()[1],
                self.pos_embedding.dims()[2],
                fmt_dims(input.dims())
            );
        }
        let mut x = self.dropout.forward(&input.add(&self.pos_embedding)?)?;
        for i in 0..self.num_layers {
            let block = self
                .layers
                .get(&format!("encoder_layer_{i}"))
                .expect("every encoder layer is registered");
            x = block.forward(&x)?;
        }
        self.ln.forward(&x)
    }
}

/// torchvision's `VisionTransformer`.
///
/// ```
/// use kiln::models::vit::{VisionTransformer, VitConfig};
/// use kiln::nn::ModuleExt;
/// let cfg = VitConfig { image_size: 32, patch_size: 8, num_layers: 1, num_heads: 2, hidden_dim: 16,
///                       mlp_dim: 32, num_classes: 10, ..VitConfig::vit_b_16() };
/// let m = VisionTransformer::new(&cfg).unwrap();
/// let y = m.forward(&kiln::Tensor::zeros(&[2, 3, 32, 32], kiln::DType::F32)).unwrap();
/// assert_eq!(y.dims(), &[2, 10]);
/// assert!(m.state_dict().iter().any(|(k, _)| k == "encoder.layers.encoder_layer_0.mlp.3.weight"));
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct VisionTransformer {
    pub conv_proj: Conv,
    /// (1, 1, hidden_dim).
    pub class_token: Tensor,
    pub encoder: Encoder,
    /// `head` (and `pre_logits`, `act` with a representation size).
    pub heads: ModuleDict,
    #[module(skip)]
    config: VitConfig,
    training: Training,
}

impl VisionTransformer {
    /// A fresh model (PyTorch-style default initialisation; load a
    /// checkpoint with `load_state_dict` for torchvision's weights).
    pub fn new(c: &VitConfig) -> Result<VisionTransformer> {
        if c.patch_size == 0 || c.image_size % c.patch_size != 0 {
            bail!(
                "VisionTransformer",
                "input shape indivisible by patch size: image_size {} and patch_size {}",
                c.image_size,
                c.patch_size
            );
        }
        let seq = (c.image_size / c.patch_size).pow(2) + 1;
        let conv = ConvOptions {
            stride: c.patch_size,
            padding: Padding::Explicit(vec![0]),
            ..ConvOptions::default()
        };
        let mut layers = ModuleDict::new();
        for i in 0..c.num_layers {
            layers.insert(&format!("encoder_layer_{i}"), EncoderBlock::new(c)?);
        }
        let pos_embedding = Tensor::zeros(&[1, seq, c.hidden_dim], DType::F32).requires_grad_(true);
        crate::nn::init::normal_(&pos_embedding, 0.0, 0.02)?;
        let mut heads = ModuleDict::new();
        let head_in = match c.representation_size {
            Some(r) => {
                heads.insert("pre_logits", Linear::new(c.hidden_dim, r, true)?);
                heads.insert("act", Activation::tanh());
                r
            }
            None => c.hidden_dim,
        };
        heads.insert("head", Linear::new(head_in, c.num_classes, true)?);
        Ok(VisionTransformer {
            conv_proj: Conv::conv2d(3, c.hidden_dim, c.patch_size, conv)?,
            class_token: Tensor::zeros(&[1, 1, c.hidden_dim], DType::F32).requires_grad_(true),
            encoder: Encoder {
                pos_embedding,
                dropout: Dropout::new(c.dropout)?,
                layers,
                ln: LayerNorm::new(&[c.hidden_dim], LN_EPS, true),
                num_layers: c.num_layers,
                training: Training::default(),
            },
            heads,
            config: c.clone(),
            training: Training::default(),
        })
    }

    /// Images (N, 3, image_size, image_size) to logits (N, num_classes).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        if x.rank() != 4
            || x.dims()[1] != 3
            || x.dims()[2] != c.image_size
            || x.dims()[3] != c.image_size
        {
            bail!(
                "VisionTransformer",
                "expected images (N, 3, {s}, {s}), got {}",
                fmt_dims(x.dims()),
                s = c.image_size
            );
        }
        let n = x.dims()[0];
        let p = self.conv_proj.forward(x)?; // (n, hidden, n_h, n_w)
        let tokens = p.dims()[2] * p.dims()[3];
        let p = p
            .reshape_dims(&[n, c.hidden_dim, tokens])?
            .permute(&[0, 2, 1])?;
        let cls = self.class_token.expand_to(&[n, 1, c.hidden_dim])?;
        let x = Tensor::cat(&[&cls, &p], 1)?;
        let x = self.encoder.forward(&x)?.select(1, 0)?;
        let mut y = x;
        for name in ["pre_logits", "act", "head"] {
            if let Some(m) = self.heads.get(name) {
                y = m.forward(&y)?;
            }
        }
        Ok(y)
    }
}
