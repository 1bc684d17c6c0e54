//! The text form round-trips every `Op` variant: print(parse(print(g))) ==
//! print(g), and parse(print(g)) == g. `variant` has no wildcard arm, so a new
//! variant fails to compile here until the graph below covers it, and
//! `variant` names every field, so a new field does too (add a case for it
//! below, then add it to the pattern).

use kiln_ir::graph::{Constant, Graph, Reduction, ScalarValue};
use kiln_ir::op::attention::{AttentionParams, MaskKind};
use kiln_ir::op::conv::{ConvParams, ConvTransposeParams, Padding};
use kiln_ir::op::pool::Pool2dParams;
use kiln_ir::op::{Domain, Meta, Op};
use kiln_ir::{BinaryOp, DType, Float, NodeId, ReduceKind, UnaryOp};

const VARIANTS: usize = 47;

fn variant(op: &Op) -> usize {
    match op {
        Op::Unary(_) => 0,
        Op::Binary(_) => 1,
        Op::BinaryScalar {
            op: _,
            value: _,
            reversed: _,
        } => 2,
        Op::Where => 3,
        Op::Cast(_) => 4,
        Op::Reduce { .. } => 5,
        Op::Mean { .. } => 6,
        Op::Var { .. } => 7,
        Op::Std { .. } => 8,
        Op::LogSumExp { .. } => 9,
        Op::Softmax { .. } => 10,
        Op::LogSoftmax { .. } => 11,
        Op::LayerNorm {
            normalized_shape: _,
            eps: _,
            has_weight: _,
            has_bias: _,
        } => 12,
        Op::GroupNorm {
            groups: _,
            eps: _,
            has_weight: _,
            has_bias: _,
        } => 13,
        Op::BatchNorm {
            training: _,
            momentum: _,
            eps: _,
            has_running_stats: _,
            has_weight: _,
            has_bias: _,
        } => 14,
        Op::Matmul => 15,
        Op::Linear => 16,
        Op::Conv { .. } => 17,
        Op::ConvTranspose2d(_) => 18,
        Op::Conv2dWeightGrad { .. } => 38,
        Op::ScatterAdd { .. } => 39,
        Op::AvgPool2dBackward { .. } => 40,
        Op::MaxPool2d(_) => 19,
        Op::AvgPool2d { .. } => 20,
        Op::AdaptiveAvgPool2d(_) => 21,
        Op::AdaptiveMaxPool2d(_) => 22,
        Op::Embedding => 23,
        Op::View(_) => 24,
        Op::Permute(_) => 25,
        Op::Expand(_) => 26,
        Op::Slice { .. } => 27,
        Op::Select { .. } => 28,
        Op::Cat { .. } => 29,
        Op::IndexSelect { .. } => 30,
        Op::Gather { .. } => 31,
        Op::MaskedFill { value: _ } => 32,
        Op::CrossEntropy {
            reduction: _,
            ignore_index: _,
            label_smoothing: _,
            has_weight: _,
        } => 33,
        Op::NllLoss {
            reduction: _,
            ignore_index: _,
            has_weight: _,
        } => 34,
        Op::PairLoss {
            name: _,
            reduction: _,
            has_weight: _,
            has_pos_weight: _,
        } => 35,
        Op::LseParts { dims: _ } => 36,
        Op::Moments { dims: _, eps: _ } => 37,
        Op::Diagonal {
            offset: _,
            dim1: _,
            dim2: _,
        } => 41,
        Op::Unfold {
            dim: _,
            size: _,
            step: _,
        } => 42,
        Op::IndexBounds {
            op: _,
            dim: _,
            size: _,
        } => 43,
        Op::QuantizedLinear { relu: _ } => 44,
        Op::Attention(_) => 45,
        Op::AttentionBackward(_) => 46,
    }
}

fn f32m(d: &[usize]) -> Meta {
    Meta::new(DType::F32, d)
}

#[rustfmt::skip]
fn every_op() -> Graph {
    use ScalarValue as S;
    let mut g = Graph::new("every_op");
    let x = g.input("x", f32m(&[2, 3, 8, 8]));
    let w = g.input("conv.weight", f32m(&[4, 3, 3, 3]));
    let b = g.input("conv.bias", f32m(&[4]));
    let c3 = g.input("c3", f32m(&[3]));
    let seq = g.input("seq", f32m(&[2, 3, 8]));
    let w1 = g.input("w1", f32m(&[4, 3, 3]));
    let wt = g.input("wt", f32m(&[3, 4, 3, 3]));
    let m = g.input("m", f32m(&[4, 5]));
    let m2 = g.input("m2", f32m(&[5, 6]));
    let lw = g.input("fc.weight", f32m(&[6, 5]));
    let lb = g.input("fc.bias", f32m(&[6]));
    let v5 = g.input("v5", f32m(&[5]));
    let idx = g.input("idx", Meta::new(DType::I64, &[3]));
    let idx2 = g.input("idx2", Meta::new(DType::I64, &[4, 2]));
    let emb = g.input("emb", f32m(&[10, 4]));
    let mask = g.input("mask", Meta::new(DType::Bool, &[4, 5]));
    let tgt = g.input("target", Meta::new(DType::I64, &[4]));
    let y = g.input("y", f32m(&[4, 5]));
    let h = g.input("odd name", Meta::new(DType::BF16, &[4, 5]));
    let t0 = g.input("t0", Meta::new(DType::I64, &[]));
    let dy = g.input("dy", f32m(&[2, 4, 4, 4]));
    let s42 = g.input("s42", f32m(&[4, 2]));
    let qw = g.input("q.weight", Meta::new(DType::I8, &[6, 5]));
    let qs = g.input("q.weight_scale", f32m(&[6]));
    let (aq, ak) = (g.input("aq", f32m(&[2, 4, 3, 8])), g.input("ak", f32m(&[2, 2, 5, 8])));
    let av = g.input("av", f32m(&[2, 2, 5, 6]));
    let amask = g.input("amask", Meta::new(DType::Bool, &[2, 4, 3, 5]));
    let (ao, alse) = (g.input("ao", f32m(&[2, 4, 3, 6])), g.input("alse", f32m(&[2, 4, 3])));

    let mut outs: Vec<NodeId> = Vec::new();
    let mut add = |g: &mut Graph, op: Op, ins: &[NodeId]| -> NodeId {
        let id = g.op(op.clone(), ins).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        outs.push(id);
        id
    };
    let f = Float;
    add_pointwise(&mut g, &mut add, [m, y, idx, idx2, mask, h]);
    add(&mut g, Op::Where, &[mask, m, y]);
    add(&mut g, Op::Cast(DType::F16), &[m]);
    add(&mut g, Op::Cast(DType::I32), &[m]);
    for kind in ReduceKind::ALL {
        add(&mut g, Op::Reduce { kind, dims: vec![-1], keepdim: true }, &[m]);
    }
    add(&mut g, Op::Reduce { kind: ReduceKind::Sum, dims: vec![], keepdim: false }, &[idx]);
    add(&mut g, Op::Mean { dims: vec![0, 1], keepdim: false }, &[m]);
    add(&mut g, Op::Var { dims: vec![1], correction: f(1.0), keepdim: true }, &[m]);
    add(&mut g, Op::Std { dims: vec![], correction: f(0.0), keepdim: false }, &[m]);
    add(&mut g, Op::LogSumExp { dims: vec![-1], keepdim: false }, &[m]);
    let lse = add(&mut g, Op::LseParts { dims: vec![-1] }, &[m]);
    let mo = add(&mut g, Op::Moments { dims: vec![0], eps: f(1e-5) }, &[m]);
    add(&mut g, Op::Softmax { dim: -1 }, &[m]);
    add(&mut g, Op::LogSoftmax { dim: 0 }, &[m]);
    let ln = |shape: Vec<usize>, eps, has_weight, has_bias| Op::LayerNorm { normalized_shape: shape, eps, has_weight, has_bias };
    add(&mut g, ln(vec![5], f(1e-5), true, true), &[m, v5, v5]);
    add(&mut g, ln(vec![4, 5], f(1e-12), false, false), &[m]);
    add(&mut g, ln(vec![5], f(1e-5), true, false), &[m, v5]);
    add(&mut g, ln(vec![5], f(1e-5), false, true), &[m, v5]);
    add(&mut g, Op::GroupNorm { groups: 3, eps: f(1e-5), has_weight: true, has_bias: true }, &[x, c3, c3]);
    add(&mut g, Op::GroupNorm { groups: 1, eps: f(1e-5), has_weight: false, has_bias: true }, &[x, c3]);
    let bn = |training, eps, has_running_stats, has_weight, has_bias| Op::BatchNorm {
        training, momentum: f(0.1), eps, has_running_stats, has_weight, has_bias,
    };
    add(&mut g, bn(false, f(1e-5), true, true, true), &[x, c3, c3, c3, c3]);
    add(&mut g, bn(true, f(1e-3), false, false, false), &[x]);
    add(&mut g, bn(true, f(1e-5), false, true, true), &[x, c3, c3]);
    add(&mut g, bn(false, f(1e-5), true, false, false), &[x, c3, c3]);
    add(&mut g, bn(true, f(1e-5), true, false, true), &[x, c3, c3, c3]);
    add(&mut g, Op::Matmul, &[m, m2]);
    add(&mut g, Op::Linear, &[m, lw, lb]);
    add(&mut g, Op::Linear, &[m, lw]);
    let conv = |stride: Vec<usize>, padding, dilation: Vec<usize>| ConvParams { stride, padding, dilation, groups: 1 };
    add(&mut g, Op::Conv { params: conv(vec![1], Padding::Explicit(vec![1]), vec![1]), spatial: 2 }, &[x, w, b]);
    add(&mut g, Op::Conv { params: conv(vec![2, 1], Padding::Explicit(vec![1, 0]), vec![1, 2]), spatial: 2 }, &[x, w]);
    add(&mut g, Op::Conv { params: conv(vec![1], Padding::Same, vec![2]), spatial: 2 }, &[x, w, b]);
    add(&mut g, Op::Conv { params: conv(vec![1], Padding::Valid, vec![1]), spatial: 1 }, &[seq, w1]);
    add(&mut g, Op::Conv2dWeightGrad { params: conv(vec![2], Padding::Explicit(vec![1]), vec![1]), kernel: [3, 3] }, &[x, dy]);
    add(&mut g, Op::ScatterAdd { dim: 1, size: vec![4, 5] }, &[idx2, s42]);
    add(&mut g, Op::ConvTranspose2d(ConvTransposeParams::default()), &[x, wt]);
    add(&mut g, Op::ConvTranspose2d(ConvTransposeParams {
        stride: vec![2], padding: vec![1], output_padding: vec![1], dilation: vec![1], groups: 1,
    }), &[x, wt, b]);
    let mp = add(&mut g, Op::MaxPool2d(Pool2dParams::new([2, 2])), &[x]);
    let p = Pool2dParams { kernel: [3, 3], stride: [2, 2], padding: [1, 1], dilation: [1, 1], ceil_mode: true };
    let pooled = add(&mut g, Op::AvgPool2d { params: p.clone(), count_include_pad: false }, &[x]);
    add(&mut g, Op::AdaptiveAvgPool2d([1, 1]), &[x]);
    add(&mut g, Op::AvgPool2dBackward { input_size: vec![2, 3, 8, 8], params: Some(p.clone()), count_include_pad: false }, &[pooled]);
    let ada = g.op(Op::AdaptiveAvgPool2d([3, 3]), &[x]).unwrap();
    add(&mut g, Op::AvgPool2dBackward { input_size: vec![2, 3, 8, 8], params: None, count_include_pad: false }, &[ada]);
    let amp = add(&mut g, Op::AdaptiveMaxPool2d([2, 3]), &[x]);
    add(&mut g, Op::Embedding, &[idx2, emb]);
    let ap = |is_causal, mask| AttentionParams { scale: f(0.125), is_causal, mask };
    let att = add(&mut g, Op::Attention(ap(true, MaskKind::None)), &[aq, ak, av]);
    let att_m = add(&mut g, Op::Attention(ap(false, MaskKind::Bool)), &[aq, ak, av, amask]);
    let att_b = add(&mut g, Op::AttentionBackward(ap(false, MaskKind::Bool)), &[aq, ak, av, amask, ao, alse, ao]);
    add(&mut g, Op::View(vec![-1, 4]), &[m]);
    add(&mut g, Op::Permute(vec![1, 0]), &[m]);
    add(&mut g, Op::Expand(vec![3, -1, 5]), &[m]);
    add(&mut g, Op::Slice { dim: 1, start: Some(1), stop: None, step: 2 }, &[m]);
    add(&mut g, Op::Slice { dim: 0, start: None, stop: Some(-1), step: 1 }, &[m]);
    add(&mut g, Op::Select { dim: 0, index: -1 }, &[m]);
    add(&mut g, Op::Diagonal { offset: -1, dim1: 1, dim2: 0 }, &[m]);
    add(&mut g, Op::Unfold { dim: 1, size: 2, step: 2 }, &[m]);
    add(&mut g, Op::Cat { dim: 0 }, &[m, y, m]);
    add(&mut g, Op::IndexSelect { dim: 1 }, &[m, idx]);
    add(&mut g, Op::Gather { dim: 1 }, &[m, idx2]);
    add(&mut g, Op::IndexBounds { op: "scatter_add", dim: 1, size: 5 }, &[idx2]);
    let fill0 = g.constant(Constant::scalar(0.0, DType::F32)).unwrap();
    add(&mut g, Op::MaskedFill { value: Some(S::Float(f(f64::NEG_INFINITY))) }, &[m, mask]);
    add(&mut g, Op::MaskedFill { value: Some(S::Int(0)) }, &[m, mask]);
    add(&mut g, Op::MaskedFill { value: None }, &[m, mask, fill0]);
    add_losses(&mut g, &mut add, [m, y, v5, tgt, t0]);
    add(&mut g, Op::QuantizedLinear { relu: false }, &[m, qw, qs, lb]);
    add(&mut g, Op::QuantizedLinear { relu: true }, &[m, qw, qs]);

    // tuple elements and constants
    for (t, i) in [(mp, 0), (mp, 1), (amp, 1), (lse, 1), (mo, 2), (att, 0), (att_m, 1), (att_b, 2)] {
        let id = g.project(t, i).unwrap();
        g.output(id).unwrap();
    }
    let consts = [
        Constant::scalar(1e-5, DType::F32),
        Constant::scalar(-3.0, DType::I64),
        Constant::scalar(1.0, DType::Bool),
        Constant::full(0.5, f32m(&[2, 3])),
        Constant::literal(&[1.0, -0.5, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.1], f32m(&[2, 3])).unwrap(),
        Constant::literal(&[3.0, -7.0], Meta::new(DType::I32, &[2])).unwrap(),
    ];
    for c in consts {
        let id = g.constant(c).unwrap();
        g.output(id).unwrap();
    }
    for id in outs {
        if g.node(id).meta().is_some() {
            g.output(id).unwrap();
        }
    }
    g
}

/// The unary, binary and scalar ops of [`every_op`], on its inputs `m, y,
/// idx, idx2, mask` and the bf16 `h`.
#[rustfmt::skip]
fn add_pointwise(g: &mut Graph, add: &mut impl FnMut(&mut Graph, Op, &[NodeId]) -> NodeId, [m, y, idx, idx2, mask, h]: [NodeId; 6]) {
    use UnaryOp as U;
    use BinaryOp as B;
    use ScalarValue as S;
    let f = Float;
    let mut g = g;
    let mut add = |g: &mut &mut Graph, op: Op, ins: &[NodeId]| { add(&mut **g, op, ins); };
    for u in U::EXAMPLES {
        // elu with a non-default alpha, so the attribute is seen to round-trip
        let u = if let U::Elu { .. } = u { U::Elu { alpha: f(1.5) } } else { u };
        // bitwise ops take integer (here i64) operands
        let input = if u.domain() == Domain::Integer { idx2 } else { m };
        add(&mut g, Op::Unary(u), &[input]);
    }
    add(&mut g, Op::Unary(U::Exp), &[h]);
    for bop in B::ALL {
        let ins = if bop.domain() == Domain::Integer { [idx2, idx2] } else { [m, y] };
        add(&mut g, Op::Binary(bop), &ins);
    }
    add(&mut g, Op::BinaryScalar { op: B::Mul, value: S::Float(f(2.0)), reversed: false }, &[m]);
    add(&mut g, Op::BinaryScalar { op: B::Mul, value: S::Float(f(3.0)), reversed: false }, &[m]);
    add(&mut g, Op::BinaryScalar { op: B::Mul, value: S::Int(2), reversed: false }, &[m]);
    add(&mut g, Op::BinaryScalar { op: B::Sub, value: S::Int(-7), reversed: true }, &[idx]);
    add(&mut g, Op::BinaryScalar { op: B::Add, value: S::Int(i64::MAX), reversed: false }, &[idx]);
    add(&mut g, Op::BinaryScalar { op: B::Div, value: S::Float(f(0.1)), reversed: true }, &[m]);
    add(&mut g, Op::BinaryScalar { op: B::Or, value: S::Bool(true), reversed: false }, &[mask]);
}

/// The loss ops of [`every_op`], on its inputs `m, y, v5, target, t0`.
#[rustfmt::skip]
fn add_losses(g: &mut Graph, add: &mut impl FnMut(&mut Graph, Op, &[NodeId]) -> NodeId, [m, y, v5, tgt, t0]: [NodeId; 5]) {
    let f = Float;
    let mut g = g;
    let mut add = |g: &mut &mut Graph, op: Op, ins: &[NodeId]| { add(&mut **g, op, ins); };
    let ce = |reduction, ignore_index, ls, has_weight| Op::CrossEntropy {
        reduction, ignore_index, label_smoothing: f(ls), has_weight,
    };
    add(&mut g, ce(Reduction::Mean, -100, 0.0, false), &[m, tgt]);
    add(&mut g, ce(Reduction::None, 3, 0.1, true), &[m, tgt, v5]);
    add(&mut g, ce(Reduction::Sum, -100, 0.0, false), &[m, y]);
    let nll = |reduction, ignore_index, has_weight| Op::NllLoss { reduction, ignore_index, has_weight };
    add(&mut g, nll(Reduction::Mean, -100, true), &[m, tgt, v5]);
    add(&mut g, nll(Reduction::None, 0, false), &[m, tgt]);
    add(&mut g, nll(Reduction::Sum, -100, false), &[v5, t0]);
    let pl = |name, reduction, has_weight, has_pos_weight| Op::PairLoss { name, reduction, has_weight, has_pos_weight };
    for name in ["mse", "l1", "smooth_l1", "huber", "bce", "bce_with_logits"] {
        add(&mut g, pl(name, Reduction::Mean, false, false), &[m, y]);
    }
    add(&mut g, pl("mse", Reduction::None, false, false), &[m, v5]);
    add(&mut g, pl("l1", Reduction::Sum, false, false), &[m, y]);
    add(&mut g, pl("bce", Reduction::Mean, true, false), &[m, y, v5]);
    add(&mut g, pl("bce_with_logits", Reduction::None, false, true), &[m, y, v5]);
    add(&mut g, pl("bce_with_logits", Reduction::Sum, true, true), &[m, y, y, v5]);

}

#[test]
fn every_op_variant_round_trips() {
    let g = every_op();
    g.verify().unwrap();
    let mut seen = [false; VARIANTS];
    for (_, n) in g.iter() {
        if let kiln_ir::graph::NodeOp::Op(op) = &n.op {
            seen[variant(op)] = true;
        }
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&i| !seen[i]).collect();
    assert!(missing.is_empty(), "variants not covered: {missing:?}");

    let text = g.to_text();
    let back = Graph::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back.to_text(), text);
    assert_eq!(back, g);
    back.verify().unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn rewrite_copies_unchanged() {
    let g = every_op();
    let copy = g.rewrite(|_, _, _| Ok(None)).unwrap();
    assert_eq!(copy, g);
}
