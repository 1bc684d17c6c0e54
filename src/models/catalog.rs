//! The zoo by name, with an example input for each model: what `kiln
//! export --model NAME` and `kiln bench --serve` build.
//!
//! torchvision's CNNs come at their full size (ImageNet's 1000 classes,
//! 224x224 inputs); the transformers, the U-Net and the LSTM at the tiny
//! sizes of the `real` fixtures (tests/fixtures/real), whose state_dicts
//! load into them.
//!
//! ```
//! let z = kiln::models::catalog::build("lstm").unwrap();
//! let xs = (z.example)(2);
//! assert_eq!(z.model.forward_many(&[Some(&xs[0])]).unwrap()[0].dims(), &[2, 5]);
//! ```

use super::bert::{BertConfig, BertForSequenceClassification};
use super::efficientnet::{efficientnet_b0, EfficientNetOptions};
use super::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use super::lstm::{LstmClassifier, LstmClassifierConfig};
use super::mobilenetv3::{mobilenet_v3_large, mobilenet_v3_small, MobileNetV3Options};
use super::resnet::{resnet18, resnet34, resnet50};
use super::unet::{UNet, UNetConfig};
use super::vit::{VisionTransformer, VitConfig};
use crate::nn::Module;
use crate::{Result, Tensor};
use kiln_ir::bail;

/// Every name [`build`] takes.
pub const NAMES: [&str; 11] = [
    "resnet18",
    "resnet34",
    "resnet50",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "vit_tiny",
    "gpt2_tiny",
    "bert_tiny",
    "unet_tiny",
    "lstm",
];

/// A zoo model and how to make its inputs at a batch size.
pub struct ZooModel {
    pub model: Box<dyn Module>,
    /// The model's inputs at batch size `b` (the batch is dim 0 of each).
    pub example: fn(usize) -> Vec<Tensor>,
}

fn image(b: usize, hw: usize) -> Vec<Tensor> {
    vec![crate::random::randn(&[b, 3, hw, hw], None)]
}

/// Token ids `(b, seq)` in `[0, vocab)`, deterministic.
pub fn token_ids(vocab: i64, seq: usize, b: usize) -> Tensor {
    let v: Vec<i64> = (0..b * seq)
        .map(|i| (i as i64 * 37 + 11 + b as i64) % vocab)
        .collect();
    Tensor::from_vec(v, &[b, seq]).expect("b * seq ids")
}

/// `BertForSequenceClassification`'s three inputs: ids, a mask whose odd
/// rows end in two padding tokens, and token types (second half 1).
fn bert_inputs(b: usize) -> Vec<Tensor> {
    let seq = 8;
    let mask: Vec<i64> = (0..b * seq)
        .map(|i| i64::from(!((i / seq) % 2 == 1 && i % seq >= seq - 2)))
        .collect();
    let types: Vec<i64> = (0..b * seq)
        .map(|i| i64::from(i % seq >= seq / 2))
        .collect();
    vec![
        token_ids(128, seq, b),
        Tensor::from_vec(mask, &[b, seq]).expect("mask"),
        Tensor::from_vec(types, &[b, seq]).expect("token types"),
    ]
}

/// The tiny ViT of `real/vit_tiny`.
pub fn vit_tiny_config() -> VitConfig {
    VitConfig {
        image_size: 32,
        patch_size: 8,
        num_layers: 2,
        num_heads: 4,
        hidden_dim: 64,
        mlp_dim: 128,
        num_classes: 10,
        ..VitConfig::vit_b_16()
    }
}

/// The tiny GPT-2 of `real/gpt2_tiny`.
pub fn gpt2_tiny_config() -> Gpt2Config {
    Gpt2Config {
        vocab_size: 256,
        n_positions: 32,
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        resid_pdrop: 0.0,
        embd_pdrop: 0.0,
        attn_pdrop: 0.0,
        ..Gpt2Config::default()
    }
}

/// The tiny BERT of `real/bert_tiny`.
pub fn bert_tiny_config() -> BertConfig {
    BertConfig {
        vocab_size: 128,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 64,
        max_position_embeddings: 32,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        num_labels: 3,
        ..BertConfig::default()
    }
}

/// A fresh (randomly initialised) zoo model by name; see [`NAMES`].
pub fn build(name: &str) -> Result<ZooModel> {
    let mobilenet = MobileNetV3Options::default();
    let (model, example): (Box<dyn Module>, fn(usize) -> Vec<Tensor>) = match name {
        "resnet18" => (Box::new(resnet18(1000)?), |b| image(b, 224)),
        "resnet34" => (Box::new(resnet34(1000)?), |b| image(b, 224)),
        "resnet50" => (Box::new(resnet50(1000)?), |b| image(b, 224)),
        "mobilenet_v3_small" => (Box::new(mobilenet_v3_small(&mobilenet)?), |b| image(b, 224)),
        "mobilenet_v3_large" => (Box::new(mobilenet_v3_large(&mobilenet)?), |b| image(b, 224)),
        "efficientnet_b0" => (
            Box::new(efficientnet_b0(&EfficientNetOptions::default())?),
            |b| image(b, 224),
        ),
        "vit_tiny" => (Box::new(VisionTransformer::new(&vit_tiny_config())?), |b| {
            image(b, 32)
        }),
        "gpt2_tiny" => (Box::new(Gpt2LMHeadModel::new(&gpt2_tiny_config())?), |b| {
            vec![token_ids(256, 8, b)]
        }),
        "bert_tiny" => (
            Box::new(BertForSequenceClassification::new(&bert_tiny_config())?),
            bert_inputs,
        ),
        "unet_tiny" => (Box::new(UNet::new(&UNetConfig::default())?), |b| {
            image(b, 16)
        }),
        "lstm" => (
            Box::new(LstmClassifier::new(&LstmClassifierConfig::default())?),
            |b| vec![crate::random::randn(&[b, 7, 16], None)],
        ),
        other => bail!(
            "models",
            "unknown zoo model `{other}` (one of {})",
            NAMES.join(", ")
        ),
    };
    Ok(ZooModel { model, example })
}
