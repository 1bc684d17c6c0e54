//! Snapshots of the graph text form for the blocks `compile()` cares about,
//! and text-in tests: a graph written by hand parses, re-infers and prints
//! back in canonical form.

use kiln_ir::graph::{Constant, Graph, Reduction};
use kiln_ir::op::conv::{ConvParams, Padding};
use kiln_ir::op::pool::Pool2dParams;
use kiln_ir::op::{Meta, Op};
use kiln_ir::{DType, Float, UnaryOp};

fn f32m(d: &[usize]) -> Meta {
    Meta::new(DType::F32, d)
}

/// Prints, checks the round trip and the verifier, returns the text.
fn text(g: &Graph) -> String {
    g.verify().unwrap();
    let t = g.to_text();
    let back = Graph::parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
    assert_eq!(&back, g);
    assert_eq!(back.to_text(), t);
    t
}

#[test]
fn conv_bn_relu() {
    let mut g = Graph::new("conv_bn_relu");
    let x = g.input("x", f32m(&[8, 64, 56, 56]));
    let w = g.input("conv.weight", f32m(&[64, 64, 3, 3]));
    let bn: Vec<_> = ["running_mean", "running_var", "weight", "bias"]
        .iter()
        .map(|n| g.input(format!("bn.{n}"), f32m(&[64])))
        .collect();
    let params = ConvParams {
        stride: vec![1, 1],
        padding: Padding::Explicit(vec![1, 1]),
        dilation: vec![1, 1],
        groups: 1,
    };
    let c = g.op(Op::Conv { params, spatial: 2 }, &[x, w]).unwrap();
    let bn_op = Op::BatchNorm {
        training: false,
        momentum: Float(0.1),
        eps: Float(1e-5),
        has_running_stats: true,
        has_weight: true,
        has_bias: true,
    };
    let b = g.op(bn_op, &[c, bn[0], bn[1], bn[2], bn[3]]).unwrap();
    let r = g.op(Op::Unary(UnaryOp::Relu), &[b]).unwrap();
    g.output(r).unwrap();
    insta::assert_snapshot!(text(&g));
}

#[test]
fn mlp_with_loss() {
    let mut g = Graph::new("mlp");
    let x = g.input("x", f32m(&[64, 784]));
    let t = g.input("target", Meta::new(DType::I64, &[64]));
    let w1 = g.input("fc1.weight", f32m(&[128, 784]));
    let b1 = g.input("fc1.bias", f32m(&[128]));
    let w2 = g.input("fc2.weight", f32m(&[10, 128]));
    let b2 = g.input("fc2.bias", f32m(&[10]));
    let h = g.op(Op::Linear, &[x, w1, b1]).unwrap();
    let h = g.op(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let logits = g.op(Op::Linear, &[h, w2, b2]).unwrap();
    let ce = Op::CrossEntropy {
        reduction: Reduction::Mean,
        ignore_index: -100,
        label_smoothing: Float(0.0),
        has_weight: false,
    };
    let loss = g.op(ce, &[logits, t]).unwrap();
    g.output(loss).unwrap();
    g.output(logits).unwrap();
    insta::assert_snapshot!(text(&g));
}

#[test]
fn scaled_softmax_and_layer_norm() {
    let mut g = Graph::new("attention_tail");
    let x = g.input("scores", f32m(&[8, 128, 128]));
    let v = g.input("v", f32m(&[8, 128, 64]));
    let w = g.input("ln.weight", f32m(&[64]));
    let b = g.input("ln.bias", f32m(&[64]));
    let scale = g.constant(Constant::scalar(0.125, DType::F32)).unwrap();
    let s = g
        .op(Op::Binary(kiln_ir::BinaryOp::Mul), &[x, scale])
        .unwrap();
    let p = g.op(Op::Softmax { dim: -1 }, &[s]).unwrap();
    let o = g.op(Op::Matmul, &[p, v]).unwrap();
    let ln = Op::LayerNorm {
        normalized_shape: vec![64],
        eps: Float(1e-5),
        has_weight: true,
        has_bias: true,
    };
    let y = g.op(ln, &[o, w, b]).unwrap();
    g.output(y).unwrap();
    insta::assert_snapshot!(text(&g));
}

#[test]
fn max_pool_indices_via_getitem() {
    let mut g = Graph::new("pool");
    let x = g.input("x", f32m(&[1, 3, 32, 32]));
    let t = g
        .op(Op::MaxPool2d(Pool2dParams::new([2, 2])), &[x])
        .unwrap();
    assert!(g.output(t).is_err(), "a tuple is not a graph output");
    let vals = g.project(t, 0).unwrap();
    let idx = g.project(t, 1).unwrap();
    let flat = g.op(Op::View(vec![1, -1]), &[vals]).unwrap();
    g.output(flat).unwrap();
    g.output(idx).unwrap();
    insta::assert_snapshot!(text(&g));
}

/// The example of the brief parses and prints back byte for byte.
#[test]
fn design_example_is_canonical() {
    let src = "\
graph conv_bn_relu(%0: f32[8,64,56,56], %1: f32[64,64,3,3]) {
  %2 = conv2d(%0, %1) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,64,56,56]
  %3 = relu(%2) : f32[8,64,56,56]
  return %3
}
";
    let g = Graph::parse(src).unwrap();
    g.verify().unwrap();
    assert_eq!(g.to_text(), src);
}

/// Hand-written text may use any value names, comments and spacing; printing
/// renumbers in topological order.
#[test]
fn hand_written_text_is_renumbered() {
    let src = r#"
// a residual block, written by hand
graph "res block"(%x input: f32[2,16,8,8], %w conv.weight: f32[16,16,3,3]) {
  %c = conv2d(%x, %w) {stride=[1], padding=same, dilation=[1], groups=1} : f32[2,16,8,8]
  %sum = add(%c, %x) : f32[2,16,8,8]
  %out = relu(%sum) : f32[2,16,8,8]   // epilogue
  %k = constant() {value=[1, 2]} : i64[2]
  return %out, %k
}"#;
    let g = Graph::parse(src).unwrap();
    insta::assert_snapshot!(text(&g));
}

#[test]
fn long_headers_list_one_input_per_line() {
    let mut g = Graph::new("wide");
    let ids: Vec<_> = (0..6)
        .map(|i| g.input(format!("layer{i}.weight"), f32m(&[64, 64])))
        .collect();
    let mut acc = ids[0];
    for &id in &ids[1..] {
        acc = g
            .op(Op::Binary(kiln_ir::BinaryOp::Add), &[acc, id])
            .unwrap();
    }
    g.output(acc).unwrap();
    insta::assert_snapshot!(text(&g));
}

#[test]
fn dot_output() {
    let g = Graph::parse(
        "graph g(%0 x: f32[4]) {\n  %1 = leaky_relu(%0) {negative_slope=0.2} : f32[4]\n  return %1\n}\n",
    )
    .unwrap();
    insta::assert_snapshot!(g.to_dot());
}

#[test]
fn presence_flags_and_scalar_values_are_checked() {
    let ok = "graph g(%0 x: f32[4,5], %1 w: f32[5]) {\n  %2 = layer_norm(%0, %1) {eps=1e-5, has_bias=true, has_weight=false, normalized_shape=[5]} : f32[4,5]\n  %3 = mul_scalar(%2) {reversed=false, value=3} : f32[4,5]\n  return %3\n}\n";
    let g = Graph::parse(ok).unwrap();
    assert_eq!(g.to_text(), ok);
    // the flags must agree with the operands
    let bad = ok.replace("has_bias=true", "has_bias=false");
    assert!(Graph::parse(&bad).is_err());
    // the old kind-only scalar attribute is gone
    let old = ok.replace("value=3", "scalar=int");
    assert!(Graph::parse(&old).is_err());
    // reduction=none gives one loss per sample
    let mut g = Graph::new("l");
    let x = g.input("x", f32m(&[4, 10, 7]));
    let t = g.input("t", Meta::new(DType::I64, &[4, 7]));
    let per = Op::NllLoss {
        reduction: Reduction::None,
        ignore_index: -100,
        has_weight: false,
    };
    let l = g.op(per, &[x, t]).unwrap();
    assert_eq!(g.node(l).meta().unwrap().dims.as_slice(), &[4, 7]);
}
