//! `kiln::models::gpt2::Gpt2LMHeadModel` against transformers'
//! GPT2LMHeadModel(vocab 256, n_positions 32, n_embd 64, n_layer 2, n_head 4)
//! with its tied lm_head (tests/fixtures/real/gpt2_tiny): eval and train
//! logits, the next-token loss, every gradient and the state after one SGD
//! step, eager and compiled (`real gpt2_tiny eager: P/T`,
//! `real gpt2_tiny compiled: P/T`).

mod real_models;

use kiln::models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use kiln::nn::ModuleExt;
use kiln::{ClassLossOpts, Tensor};

/// The fixture's configuration, as `kiln::models::catalog` builds it.
fn config() -> Gpt2Config {
    kiln::models::catalog::gpt2_tiny_config()
}

fn run(compiled: bool) {
    let t = real_models::load("gpt2_tiny");
    let model = Gpt2LMHeadModel::new(&config()).unwrap();
    let ids = t["input/input_ids"].clone();
    // next-token loss: logits[:, :-1] against input_ids[:, 1:]
    let (b, s) = (ids.dims()[0], ids.dims()[1]);
    let target = ids
        .narrow(1, 1, s - 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(&[-1])
        .unwrap();
    let loss = |out: &Tensor| {
        let logits = out
            .narrow(1, 0, s - 1)?
            .reshape(&[(b * (s - 1)) as i64, 256])?;
        kiln::functional::cross_entropy(&logits, &target, None, ClassLossOpts::default())
    };
    let tally = real_models::run_protocol("gpt2_tiny", &t, &model, &ids, loss, compiled);
    assert!(tally.total > 55, "only {} checks ran", tally.total);
    assert!(
        tally.failed.is_empty(),
        "gpt2_tiny failed:\n{}",
        tally.failed.join("\n")
    );
    // the head stays tied through load_state_dict and the optimizer step
    assert!(model.lm_head.weight.is_same(&model.transformer.wte.weight));
    assert_eq!(model.parameters().len(), 28);
}

#[test]
fn real_gpt2_tiny_eager() {
    run(false);
}

#[test]
fn real_gpt2_tiny_compiled() {
    run(true);
}

/// A transformers `save_pretrained` file has no `lm_head.weight` (tied):
/// strict `load_state_dict` reports it missing, `load_hf_state_dict` ties
/// it to `transformer.wte.weight` and loads everything else strictly.
#[test]
fn save_pretrained_state_without_the_tied_head_loads() {
    let t = real_models::load("gpt2_tiny");
    let sd: Vec<(String, Tensor)> = real_models::group(&t, "state")
        .into_iter()
        .filter(|(k, _)| k != "lm_head.weight")
        .collect();
    let model = Gpt2LMHeadModel::new(&config()).unwrap();
    let err = model.load_state_dict(&sd, true).unwrap_err().to_string();
    assert!(err.contains("missing keys: lm_head.weight"), "{err}");
    let report = model.load_hf_state_dict(&sd, true).unwrap();
    assert_eq!(report, kiln::nn::LoadReport::default());
    assert!(model.lm_head.weight.is_same(&model.transformer.wte.weight));
    assert_eq!(
        model.lm_head.weight.to_vec::<f32>().unwrap(),
        t["state/transformer.wte.weight"].to_vec::<f32>().unwrap()
    );
    // an unexpected key still fails the strict load
    let mut extra = sd.clone();
    extra.push((
        "lm_head.bias".to_string(),
        Tensor::zeros(&[256], kiln::DType::F32),
    ));
    let err = model
        .load_hf_state_dict(&extra, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unexpected keys: lm_head.bias"), "{err}");
}
