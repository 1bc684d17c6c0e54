//! Snapshots of every compile stage (traced graph, rewritten, fused plan,
//! explain) for the models the issue names, and the kernel counts they imply.
//! Review a changed snapshot like a diff of generated code.

use kiln::compile::{compile, compile_fn, Compiled, Stage};
use kiln::functional as F;
use kiln::nn::{self, Module, ModuleExt};
use kiln::train::ModelKind;
use kiln::Tensor;

fn randn(dims: &[usize], seed: u64) -> Tensor {
    kiln::bench::randn(dims, seed)
}

/// Graph, rewritten graph and fusion plan, one after the other.
fn stages(c: &Compiled, args: &[Tensor]) -> String {
    let mut s = String::new();
    for st in [Stage::Graph, Stage::Rewritten, Stage::Fused] {
        s += &format!("== {} ==\n{}", st.name(), c.dump(st, args).unwrap());
    }
    s
}

/// Per-call kernels and hoisted ones, from explain().
fn kernels(c: &Compiled) -> (Vec<String>, Vec<String>) {
    let r = c.explain();
    let e = &r.entries[0];
    assert!(e.graph_break.is_none(), "{r}");
    (e.kernels.clone(), e.hoisted.clone())
}

fn no_disk_cache<'a>(c: Compiled<'a>) -> Compiled<'a> {
    // snapshots show the rewritten stage, which a cached plan skips
    c.with_options(kiln::compile::CompileOptions {
        disk_cache: false,
        ..Default::default()
    })
}

#[test]
fn w1_pointwise_chain() {
    let c = no_disk_cache(compile_fn("w1", |t: &[Tensor]| {
        let y = t[0].mul(&t[1])?.add(&t[2])?.gelu(false)?;
        Ok(vec![&(&y * 0.5) + &t[0]])
    }));
    let args = [randn(&[64], 1), randn(&[64], 2), randn(&[64], 3)];
    insta::assert_snapshot!("w1_stages", stages(&c, &args));
    insta::assert_snapshot!("w1_kernel", c.dump(Stage::Kernels, &args).unwrap());
    insta::assert_snapshot!("w1_cuda", c.dump(Stage::Cuda, &args).unwrap());
    assert_eq!(kernels(&c).0.len(), 1, "W1 is one kernel");
}

#[test]
fn softmax_fused() {
    let c = no_disk_cache(compile_fn("softmax", |t: &[Tensor]| {
        Ok(vec![t[0].softmax(-1)?])
    }));
    let args = [randn(&[4, 16], 4)];
    insta::assert_snapshot!("softmax_stages", stages(&c, &args));
    insta::assert_debug_snapshot!("softmax_kernels", kernels(&c));
    insta::assert_snapshot!("softmax_cuda", c.dump(Stage::Cuda, &args).unwrap());
    assert!(kernels(&c).0.len() <= 2, "softmax in at most 2 kernels");
}

/// softmax(x * 0.125 + mask), W2F's attention-score softmax: one kernel
/// whose row pass recomputes the prologue x*s+mask from the reduction's own
/// operands (in2, in3) and scalar argument (scalar0), so the CPU backend
/// sees that its exp is of the reduced value (`cpu/softmax_row.rs`).
#[test]
fn scaled_masked_softmax_is_one_row_kernel() {
    let c = no_disk_cache(compile_fn("scaled_softmax", |t: &[Tensor]| {
        Ok(vec![(&(&t[0] * 0.125) + &t[1]).softmax(-1)?])
    }));
    let args = [randn(&[4, 16], 4), randn(&[4, 16], 5)];
    let launched = c.dump(Stage::Kernels, &args).unwrap();
    let launches = launched
        .lines()
        .filter(|l| l.starts_with("kernel "))
        .count();
    assert_eq!(launches, 1, "one launch: {launched}");
    insta::assert_snapshot!("scaled_softmax_kernels", launched);
}

#[test]
fn layer_norm_fused() {
    let (w, b) = (randn(&[16], 6), randn(&[16], 7));
    let c = no_disk_cache(compile_fn("layer_norm", move |t: &[Tensor]| {
        Ok(vec![F::layer_norm(&t[0], &[16], Some(&w), Some(&b), 1e-5)?])
    }));
    let args = [randn(&[4, 16], 5)];
    insta::assert_snapshot!("layer_norm_stages", stages(&c, &args));
    insta::assert_debug_snapshot!("layer_norm_kernels", kernels(&c));
    insta::assert_snapshot!("layer_norm_cuda", c.dump(Stage::Cuda, &args).unwrap());
    assert!(kernels(&c).0.len() <= 2, "layer_norm in at most 2 passes");
}

#[test]
fn conv_bn_relu_eval_is_one_conv_with_an_epilogue() {
    kiln::manual_seed(1);
    let opts = nn::ConvOptions {
        padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
        ..Default::default()
    };
    let m = nn::Sequential::new()
        .add(nn::Conv::conv2d(3, 8, 3, opts).unwrap())
        .add(nn::BatchNorm::new_2d(8))
        .add(nn::Activation::relu());
    // non-trivial running statistics, so the fold is visible in the numbers
    let bufs = m.named_buffers();
    bufs[0].1.copy_(&randn(&[8], 11)).unwrap();
    bufs[1]
        .1
        .copy_(&(&randn(&[8], 12).abs().unwrap() + 0.5))
        .unwrap();
    m.eval();
    let _ng = kiln::autograd::no_grad();
    let c = no_disk_cache(compile(&m));
    let x = randn(&[2, 3, 8, 8], 13);
    let y = c.forward(&x).unwrap();
    let want = m.forward(&x).unwrap();
    for (a, b) in y.to_f64_vec().iter().zip(want.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    insta::assert_snapshot!("conv_bn_relu_stages", stages(&c, &[x]));
    let (per_call, hoisted) = kernels(&c);
    assert_eq!(
        per_call,
        ["conv2d+epilogue[relu]"],
        "BN folded, ReLU as the conv's epilogue"
    );
    assert!(!hoisted.is_empty(), "the folded weight is computed once");
}

fn model(kind: ModelKind) -> nn::Sequential {
    kiln::manual_seed(2);
    let m = kind.build().unwrap();
    m.eval();
    m
}

#[test]
fn mlp_eval() {
    let m = model(ModelKind::Mlp);
    let _ng = kiln::autograd::no_grad();
    let c = no_disk_cache(compile(&m));
    let x = randn(&[2, 1, 8, 8], 14);
    insta::assert_snapshot!("mlp_stages", stages(&c, &[x]));
    insta::assert_debug_snapshot!("mlp_kernels", kernels(&c));
}

#[test]
fn cnn_eval() {
    let m = model(ModelKind::Cnn);
    let _ng = kiln::autograd::no_grad();
    let c = no_disk_cache(compile(&m));
    let x = randn(&[2, 1, 8, 8], 15);
    insta::assert_snapshot!("cnn_stages", stages(&c, &[x]));
    insta::assert_debug_snapshot!("cnn_kernels", kernels(&c));
}

/// A training entry: the joint graph, its forward half (fused) and its
/// backward half (fused), then explain()'s kernel lists and saved bytes.
fn training_stages(c: &Compiled, args: &[Tensor]) -> String {
    let mut s = String::new();
    for (title, st) in [
        ("joint", Stage::Graph),
        ("forward (fused)", Stage::Fused),
        ("backward (fused)", Stage::Backward),
    ] {
        s += &format!("== {title} ==\n{}", c.dump_training(st, args).unwrap());
    }
    s
}

fn training_summary(c: &Compiled) -> String {
    let r = c.explain();
    let e = r
        .entries
        .iter()
        .find(|e| e.backward.is_some())
        .expect("a training entry");
    assert!(e.graph_break.is_none(), "{r}");
    let b = e.backward.as_ref().unwrap();
    format!(
        "forward kernels: {:#?}\nbackward kernels: {:#?}\nsaved: {} values, {} bytes; recomputed: {} values, {} bytes\n",
        e.kernels, b.kernels, b.saved, b.saved_bytes, b.recomputed, b.recomputed_bytes
    )
}

#[test]
fn mlp_training_step() {
    // the digits MLP without Dropout (random numbers are a graph break)
    kiln::manual_seed(2);
    let m = nn::Sequential::new()
        .add(nn::Flatten::default())
        .add(nn::Linear::new(64, 32, true).unwrap())
        .add(nn::Activation::relu())
        .add(nn::Linear::new(32, 10, true).unwrap());
    let c = no_disk_cache(compile(&m));
    let x = randn(&[4, 1, 8, 8], 16);
    insta::assert_snapshot!("mlp_training_stages", training_stages(&c, &[x]));
    insta::assert_snapshot!("mlp_training_kernels", training_summary(&c));
}

#[test]
fn cnn_training_step() {
    kiln::manual_seed(2);
    let m = ModelKind::Cnn.build().unwrap();
    let c = no_disk_cache(compile(&m));
    let x = randn(&[4, 1, 8, 8], 17);
    insta::assert_snapshot!("cnn_training_stages", training_stages(&c, &[x]));
    let summary = training_summary(&c);
    insta::assert_snapshot!("cnn_training_kernels", summary);
}
