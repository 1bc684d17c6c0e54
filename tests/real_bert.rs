//! `kiln::models::bert::BertForSequenceClassification` against transformers'
//! (vocab 128, hidden 32, 2 layers, 4 heads, intermediate 64, 3 labels;
//! tests/fixtures/real/bert_tiny, made by scripts/gen-real-bert.py), with an
//! attention mask padding the second sequence and two token-type segments:
//! eval and train logits, the loss, every gradient and the state after one
//! SGD step, eager and compiled (`real bert_tiny eager: P/T`,
//! `real bert_tiny compiled: P/T`).

#[allow(dead_code)] // run_protocol: this model takes several inputs
mod real_models;

use kiln::models::bert::{BertConfig, BertForSequenceClassification};
use kiln::{ClassLossOpts, Tensor};

/// The fixture's configuration, as `kiln::models::catalog` builds it.
fn config() -> BertConfig {
    kiln::models::catalog::bert_tiny_config()
}

fn run(compiled: bool) {
    let t = real_models::load("bert_tiny");
    let model = BertForSequenceClassification::new(&config()).unwrap();
    let inputs: Vec<Tensor> = ["input_ids", "attention_mask", "token_type_ids"]
        .iter()
        .map(|k| t[&format!("input/{k}")].clone())
        .collect();
    let target = Tensor::from_vec(vec![2i64, 0], &[2]).unwrap();
    let loss = |out: &Tensor| {
        kiln::functional::cross_entropy(out, &target, None, ClassLossOpts::default())
    };
    let tally = real_models::run_protocol_many("bert_tiny", &t, &model, &inputs, loss, compiled);
    // 3 outputs, 41 gradients, 41 state entries after the step
    assert_eq!(tally.total, 85, "checks run");
    assert!(
        tally.failed.is_empty(),
        "bert_tiny failed:\n{}",
        tally.failed.join("\n")
    );
}

#[test]
fn real_bert_tiny_eager() {
    run(false);
}

#[test]
fn real_bert_tiny_compiled() {
    run(true);
}

#[test]
fn bad_inputs_are_errors_naming_what_is_wrong() {
    let model = BertForSequenceClassification::new(&config()).unwrap();
    let ids = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
    let mask = Tensor::from_vec(vec![1i64, 1, 1], &[1, 3]).unwrap();
    let e = model
        .forward_many(&[Some(&ids), Some(&mask)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("attention_mask must have input_ids' shape"),
        "{e}"
    );
    let float_ids = Tensor::zeros(&[2, 2], kiln::DType::F32);
    let e = model.forward(&float_ids).unwrap_err().to_string();
    assert!(e.contains("expected integer input_ids"), "{e}");
    let long = Tensor::zeros(&[1, 33], kiln::DType::I64);
    let e = model.forward(&long).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings (32)"), "{e}");
    let e = model.forward_many(&[None]).unwrap_err().to_string();
    assert!(e.contains("without input_ids"), "{e}");
    let heads = BertConfig {
        num_attention_heads: 5,
        ..config()
    };
    assert!(BertForSequenceClassification::new(&heads).is_err());
}
