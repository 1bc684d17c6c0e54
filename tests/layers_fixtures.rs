//! The `layers` suite of the PyTorch fixtures (tests/fixtures/README.md,
//! "Layer cases"): MultiheadAttention, Transformer encoder/decoder layers,
//! PReLU, InstanceNorm2d, Upsample, PixelShuffle, Conv3d, Conv2d with reflect
//! padding and EmbeddingBag, each built from PyTorch's constructor arguments
//! with its `state_dict` loaded under PyTorch's key names. Forward, buffers
//! and the gradient of every parameter and input must match, eagerly
//! (`layers eager: P/T`) and through `kiln::compile` (`layers compiled: P/T`).
//! The recurrent classes are run by tests/layers_recurrent.rs.

mod fixture_support;

use fixture_support::layers::{is_recurrent, run_case};
use fixture_support::{load_suite, Fixtures};
use std::io::Write;

fn run(compiled: bool) {
    let fx = Fixtures::load();
    let cases = load_suite(&fx, "layers");
    assert!(!cases.is_empty(), "no layers cases in tests/fixtures");
    let (recurrent, ours): (Vec<_>, Vec<_>) = cases.iter().partition(|c| is_recurrent(c));
    let label = if compiled { "compiled" } else { "eager" };
    let mut failed = vec![];
    for c in &ours {
        if let Err(e) = run_case(&fx, c, compiled) {
            failed.push(format!("layers {label} {}: {e}", c.case));
        }
    }
    // Written to stderr directly (not eprintln!) so the summary shows when the test passes.
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "layers {label}: {}/{}",
        ours.len() - failed.len(),
        ours.len()
    );
    let _ = writeln!(
        err,
        "layers recurrent: {} cases handled in tests/layers_recurrent.rs",
        recurrent.len()
    );
    for f in &failed {
        let _ = writeln!(err, "{f}");
    }
    assert!(
        failed.is_empty(),
        "{} layers cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn layers_eager() {
    run(false);
}

#[test]
fn layers_compiled() {
    run(true);
}

/// The harness rejects a wrong layer: a slightly changed projection weight
/// makes an attention case fail, eager and compiled.
#[test]
fn layers_harness_rejects_a_wrong_layer() {
    use kiln::nn::ModuleExt;
    let fx = Fixtures::load();
    let cases = load_suite(&fx, "layers");
    let c = cases.iter().find(|c| c.case == "mha_seq_first").unwrap();
    let scale = |m: &dyn kiln::nn::Module| {
        let _g = kiln::autograd::no_grad();
        let (_, w) = m.named_parameters().into_iter().next().unwrap();
        let changed = w
            .binary_scalar(kiln::ir::BinaryOp::Mul, 1.001, false)
            .unwrap();
        w.copy_(&changed).unwrap();
    };
    for compiled in [false, true] {
        assert!(fixture_support::layers::run_case_with(&fx, c, compiled, scale).is_err());
        assert!(run_case(&fx, c, compiled).is_ok());
    }
}

/// Bad constructor arguments and bad inputs are errors naming the layer.
#[test]
fn layers_bad_input_is_an_error() {
    use kiln::nn::*;
    use kiln::{DType, Tensor};
    let err = |r: kiln::Result<Tensor>, what: &str| {
        let e = r.expect_err(what).to_string();
        assert!(e.contains(what), "{e:?} does not name {what}");
    };
    let z = |d: &[usize]| Tensor::zeros(d, DType::F32);
    assert!(MultiheadAttention::new(8, 3).is_err());
    let mha = MultiheadAttention::new(8, 2).unwrap();
    let args = AttentionArgs::default();
    let (q, k) = (z(&[3, 2, 8]), z(&[5, 2, 8]));
    err(
        mha.forward_attn(&z(&[3, 2, 7]), &k, &k, None, None, args)
            .map(|r| r.0),
        "MultiheadAttention",
    );
    let bad_pad = Tensor::zeros(&[2, 4], DType::Bool);
    err(
        mha.forward_attn(&q, &k, &k, Some(&bad_pad), None, args)
            .map(|r| r.0),
        "key_padding_mask",
    );
    err(
        mha.forward_attn(&q, &k, &k, None, Some(&z(&[3, 4])), args)
            .map(|r| r.0),
        "attn_mask",
    );
    let causal = AttentionArgs {
        is_causal: true,
        ..args
    };
    err(
        mha.forward_attn(&q, &k, &k, None, None, causal)
            .map(|r| r.0),
        "is_causal",
    );
    let o = TransformerLayerOptions {
        activation: "swish".into(),
        ..Default::default()
    };
    assert!(TransformerEncoderLayer::new(8, 2, o).is_err());
    let dec = TransformerDecoderLayer::new(8, 2, TransformerLayerOptions::default()).unwrap();
    err(dec.forward(&q), "TransformerDecoderLayer");
    let bag = EmbeddingBag::new(10, 3, BagMode::Mean).unwrap();
    let ids = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    err(bag.forward_bag(&ids, None, None), "EmbeddingBag");
    let off = Tensor::from_vec(vec![0i64, 1], &[2]).unwrap();
    err(
        bag.forward_bag(&ids, Some(&off), Some(&z(&[3]))),
        "per_sample_weights",
    );
    err(bag.forward_bag(&z(&[3]), Some(&off), None), "EmbeddingBag");
    assert!(UpsampleMode::from_name("bicubic").is_err());
    err(
        Upsample::scale(&[2.0], UpsampleMode::Nearest).forward(&z(&[4])),
        "Upsample",
    );
    err(
        PixelShuffle::new(2).forward(&z(&[1, 6, 2, 2])),
        "PixelShuffle",
    );
    err(
        pad_symmetric(&z(&[1, 3]), &[3], PaddingMode::Reflect),
        "reflect",
    );
    assert!(PaddingMode::from_name("mirror").is_err());
    let same = ConvOptions {
        padding: Padding::Same,
        ..Default::default()
    };
    assert!(Conv::conv3d(2, 2, 3, same).is_err());
    let c3 = Conv::conv3d(2, 2, 3, ConvOptions::default()).unwrap();
    err(c3.forward(&z(&[1, 2, 2, 8, 8])), "conv3d");
    err(
        PReLU::new(3, 0.25).unwrap().forward(&z(&[2, 4, 5])),
        "PReLU",
    );
    let inorm = InstanceNorm2d::new(3, InstanceNormOptions::default());
    err(inorm.forward(&z(&[2, 4, 5, 5])), "InstanceNorm2d");
}

/// An unbatched call (L, E) is the batched one with a batch of one,
/// for attention (output and weights).
#[test]
fn unbatched_attention_is_a_batch_of_one() {
    use kiln::nn::*;
    use kiln::Tensor;
    kiln::manual_seed(7);
    let mha = MultiheadAttention::new(8, 2).unwrap();
    let x = kiln::random::randn(&[5, 8], None);
    let args = AttentionArgs::default();
    let (y, w) = mha.forward_attn(&x, &x, &x, None, None, args).unwrap();
    let xb = x.unsqueeze(1).unwrap();
    let (yb, wb) = mha.forward_attn(&xb, &xb, &xb, None, None, args).unwrap();
    let same = |a: &Tensor, b: &Tensor| fixture_support::compare(a, b, 1e-6, 1e-7).unwrap();
    same(&y, &yb.squeeze(Some(&[1])).unwrap());
    same(&w.unwrap(), &wb.unwrap().squeeze(Some(&[0])).unwrap());
}
