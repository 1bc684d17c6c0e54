//! Hand-computed cases for the reference interpreter.

use super::nd::stored;
use super::*;
use crate::graph::{Constant, ScalarValue};
use crate::op::conv::{ConvParams, Padding};
use crate::{Float, ReduceKind};
use DType::*;

fn t(dt: DType, dims: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::new(Meta::new(dt, dims), data.to_vec()).unwrap()
}

/// Builds a graph with inputs of the given tensors' types, one op applied to
/// all of them, and returns the op's value.
fn run1(op: Op, ins: &[HostTensor]) -> HostTensor {
    let mut g = Graph::new("t");
    let ids: Vec<_> = ins
        .iter()
        .enumerate()
        .map(|(i, x)| g.input(format!("x{i}"), x.meta.clone()))
        .collect();
    let y = g.op(op, &ids).unwrap();
    g.output(y).unwrap();
    eval(&g, ins).unwrap().remove(0)
}

fn bounded1(op: Op, ins: &[HostTensor]) -> Bounded {
    let mut g = Graph::new("t");
    let ids: Vec<_> = ins
        .iter()
        .enumerate()
        .map(|(i, x)| g.input(format!("x{i}"), x.meta.clone()))
        .collect();
    let y = g.op(op, &ids).unwrap();
    eval_nodes(&g, ins).unwrap()[y.index()].clone().unwrap()
}

fn check(got: &HostTensor, dt: DType, dims: &[usize], want: &[f64]) {
    assert_eq!(got.meta, Meta::new(dt, dims), "{got:?}");
    assert_eq!(got.data, want, "{got:?}");
}

#[test]
fn pointwise_broadcasts_and_rounds_to_the_dtype() {
    let a = t(F32, &[2, 1], &[1.0, 2.0]);
    let b = t(F32, &[3], &[10.0, 20.0, 30.0]);
    let y = run1(Op::Binary(BinaryOp::Add), &[a, b]);
    check(&y, F32, &[2, 3], &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    // f32 nodes round every result to f32
    let (p, q) = (stored(0.1, F32), stored(0.2, F32));
    let y = run1(
        Op::Binary(BinaryOp::Add),
        &[t(F32, &[1], &[p]), t(F32, &[1], &[q])],
    );
    assert_eq!(y.data, [(0.1f32 + 0.2f32) as f64]);
    let y = run1(Op::Unary(UnaryOp::Exp), &[t(F32, &[1], &[1.0])]);
    assert_eq!(y.data, [std::f64::consts::E as f32 as f64]);
    // integers wrap; exp of an integer is f32
    let y = run1(
        Op::Binary(BinaryOp::Add),
        &[t(U8, &[2], &[200.0, 1.0]), t(U8, &[2], &[100.0, 2.0])],
    );
    check(&y, U8, &[2], &[44.0, 3.0]);
    let y = run1(Op::Unary(UnaryOp::Exp), &[t(I64, &[1], &[0.0])]);
    check(&y, F32, &[1], &[1.0]);
    let y = run1(Op::Unary(UnaryOp::Relu), &[t(F32, &[3], &[-1.0, 0.5, 2.0])]);
    check(&y, F32, &[3], &[0.0, 0.5, 2.0]);
}

#[test]
fn scalars_comparisons_where_and_casts() {
    let x = t(I64, &[3], &[-7.0, 2.0, 9.0]);
    let op = |op, value, reversed| Op::BinaryScalar {
        op,
        value,
        reversed,
    };
    let y = run1(
        op(BinaryOp::FloorDiv, ScalarValue::Int(2), false),
        std::slice::from_ref(&x),
    );
    check(&y, I64, &[3], &[-4.0, 1.0, 4.0]);
    // i64 tensor * 2.5 is f32; 10 - x reversed
    let y = run1(
        op(BinaryOp::Mul, ScalarValue::Float(Float(2.5)), false),
        std::slice::from_ref(&x),
    );
    check(&y, F32, &[3], &[-17.5, 5.0, 22.5]);
    let y = run1(
        op(BinaryOp::Sub, ScalarValue::Int(10), true),
        std::slice::from_ref(&x),
    );
    check(&y, I64, &[3], &[17.0, 8.0, 1.0]);
    let f = t(F32, &[3], &[-1.5, 2.0, 2.5]);
    let c = run1(Op::Binary(BinaryOp::Gt), &[f.clone(), x.clone()]);
    check(&c, Bool, &[3], &[1.0, 0.0, 0.0]);
    let y = run1(Op::Where, &[c, f.clone(), x]);
    check(&y, F32, &[3], &[-1.5, 2.0, 9.0]);
    // float -> int truncates toward zero; -> bool is != 0
    let y = run1(Op::Cast(I64), std::slice::from_ref(&f));
    check(&y, I64, &[3], &[-1.0, 2.0, 2.0]);
    let y = run1(Op::Cast(Bool), &[t(F32, &[2], &[0.0, -0.1])]);
    check(&y, Bool, &[2], &[0.0, 1.0]);
    let y = run1(Op::Cast(F32), &[t(F64, &[1], &[0.1])]);
    check(&y, F32, &[1], &[0.1f32 as f64]);
}

#[test]
fn reductions_with_and_without_keepdim() {
    let x = t(F32, &[2, 3], &[1.0, 5.0, 3.0, -4.0, 2.0, 2.0]);
    let red = |kind, dims: &[i64], keepdim| Op::Reduce {
        kind,
        dims: dims.to_vec(),
        keepdim,
    };
    let y = run1(red(ReduceKind::Sum, &[1], false), std::slice::from_ref(&x));
    check(&y, F32, &[2], &[9.0, 0.0]);
    let y = run1(red(ReduceKind::Sum, &[0], true), std::slice::from_ref(&x));
    check(&y, F32, &[1, 3], &[-3.0, 7.0, 5.0]);
    let y = run1(red(ReduceKind::Sum, &[], false), std::slice::from_ref(&x));
    check(&y, F32, &[], &[9.0]);
    let y = run1(red(ReduceKind::Prod, &[-1], true), std::slice::from_ref(&x));
    check(&y, F32, &[2, 1], &[15.0, -16.0]);
    let y = run1(red(ReduceKind::Max, &[1], false), std::slice::from_ref(&x));
    check(&y, F32, &[2], &[5.0, 2.0]);
    let y = run1(
        red(ReduceKind::Min, &[0, 1], false),
        std::slice::from_ref(&x),
    );
    check(&y, F32, &[], &[-4.0]);
    // argmax: the first maximum; over all dims, the flat index
    let y = run1(
        red(ReduceKind::ArgMax, &[1], false),
        std::slice::from_ref(&x),
    );
    check(&y, I64, &[2], &[1.0, 1.0]);
    let y = run1(
        red(ReduceKind::ArgMin, &[], false),
        std::slice::from_ref(&x),
    );
    check(&y, I64, &[], &[3.0]);
    let y = run1(
        Op::Mean {
            dims: vec![1],
            keepdim: true,
        },
        &[x],
    );
    check(&y, F32, &[2, 1], &[3.0, 0.0]);
    // integer sums accumulate in i64
    let b = t(Bool, &[4], &[1.0, 0.0, 1.0, 1.0]);
    let y = run1(red(ReduceKind::Sum, &[0], false), &[b]);
    check(&y, I64, &[], &[3.0]);
}

#[test]
fn views_move_elements() {
    let x = t(F32, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = run1(Op::Permute(vec![1, 0]), std::slice::from_ref(&x));
    check(&y, F32, &[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let y = run1(Op::View(vec![3, -1]), std::slice::from_ref(&x));
    check(&y, F32, &[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = run1(Op::Expand(vec![2, 2, -1]), &[t(F32, &[2, 1], &[7.0, 8.0])]);
    check(&y, F32, &[2, 2, 1], &[7.0, 8.0, 7.0, 8.0]);
    let y = run1(Op::Expand(vec![2, 3]), &[t(F32, &[1, 3], &[1.0, 2.0, 3.0])]);
    check(&y, F32, &[2, 3], &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let s = |dim, start, stop, step| Op::Slice {
        dim,
        start,
        stop,
        step,
    };
    let y = run1(s(1, Some(-2), None, 1), std::slice::from_ref(&x));
    check(&y, F32, &[2, 2], &[1.0, 2.0, 4.0, 5.0]);
    let y = run1(s(-1, None, Some(100), 2), std::slice::from_ref(&x));
    check(&y, F32, &[2, 2], &[0.0, 2.0, 3.0, 5.0]);
    let y = run1(Op::Select { dim: 1, index: -1 }, std::slice::from_ref(&x));
    check(&y, F32, &[2], &[2.0, 5.0]);
    let y = run1(
        Op::Cat { dim: 0 },
        &[x.clone(), t(I64, &[1, 3], &[9.0, 9.0, 9.0])],
    );
    check(
        &y,
        F32,
        &[3, 3],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 9.0, 9.0],
    );
    let y = run1(Op::Cat { dim: 1 }, &[x.clone(), x]);
    assert_eq!(&y.data[..6], &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
}

#[test]
fn matmul_every_rank() {
    let a = t(F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = t(F32, &[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let y = run1(Op::Matmul, &[a.clone(), b.clone()]);
    check(&y, F32, &[2, 2], &[4.0, 5.0, 10.0, 11.0]);
    let v = t(F32, &[3], &[1.0, 1.0, 1.0]);
    let y = run1(Op::Matmul, &[a.clone(), v.clone()]);
    check(&y, F32, &[2], &[6.0, 15.0]);
    let y = run1(Op::Matmul, &[v.clone(), b.clone()]);
    check(&y, F32, &[2], &[2.0, 2.0]);
    let y = run1(Op::Matmul, &[v.clone(), v]);
    check(&y, F32, &[], &[3.0]);
    // batch dims broadcast: [2,1,2,3] @ [3,3,2] -> [2,3,2,2]
    let mut a4 = a.data.clone();
    a4.extend(a.data.iter().map(|x| -x));
    let a4 = t(F32, &[2, 1, 2, 3], &a4);
    let mut b3 = b.data.clone();
    b3.extend(b.data.iter().map(|x| 2.0 * x));
    b3.extend(b.data.iter().map(|x| 3.0 * x));
    let b3 = t(F32, &[3, 3, 2], &b3);
    let y = run1(Op::Matmul, &[a4, b3]);
    assert_eq!(y.meta, Meta::new(F32, &[2, 3, 2, 2]));
    assert_eq!(&y.data[4..8], &[8.0, 10.0, 20.0, 22.0]);
    assert_eq!(&y.data[20..24], &[-12.0, -15.0, -30.0, -33.0]);
    let w = t(F32, &[1, 3], &[1.0, -1.0, 2.0]);
    let y = run1(Op::Linear, &[a, w, t(F32, &[1], &[0.5])]);
    check(&y, F32, &[2, 1], &[5.5, 11.5]);
}

fn conv(p: ConvParams, spatial: usize) -> Op {
    Op::Conv { params: p, spatial }
}

#[test]
fn conv2d_stride_padding_groups() {
    // 1x1x3x3 input 1..9, 2x2 kernel of ones
    let x = t(F32, &[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = t(F32, &[1, 1, 2, 2], &[1.0; 4]);
    let y = run1(conv(ConvParams::default(), 2), &[x.clone(), w.clone()]);
    check(&y, F32, &[1, 1, 2, 2], &[12.0, 16.0, 24.0, 28.0]);
    let p = ConvParams {
        stride: vec![2],
        padding: Padding::Explicit(vec![1]),
        ..ConvParams::default()
    };
    let y = run1(conv(p, 2), &[x.clone(), w.clone(), t(F32, &[1], &[100.0])]);
    check(&y, F32, &[1, 1, 2, 2], &[101.0, 105.0, 111.0, 128.0]);
    // 'same' with an even kernel pads after: out[i,j] = sum of x[i..i+2, j..j+2]
    let p = ConvParams {
        padding: Padding::Same,
        ..ConvParams::default()
    };
    let y = run1(conv(p, 2), &[x.clone(), w]);
    assert_eq!(y.data, [12., 16., 9., 24., 28., 15., 15., 17., 9.]);
    // groups=2: each output channel sees its own input channel (unbatched input)
    let mut x2 = x.data.clone();
    x2.extend(x.data.iter().map(|v| 10.0 * v));
    let x2 = t(F32, &[2, 3, 3], &x2);
    let w2 = t(F32, &[2, 1, 1, 1], &[1.0, -1.0]);
    let p = ConvParams {
        groups: 2,
        ..ConvParams::default()
    };
    let y = run1(conv(p, 2), &[x2, w2]);
    assert_eq!(y.meta, Meta::new(F32, &[2, 3, 3]));
    assert_eq!((y.data[4], y.data[13]), (5.0, -50.0));
}

#[test]
fn conv1d_dilation() {
    let x = t(F32, &[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let w = t(F32, &[1, 1, 2], &[1.0, 10.0]);
    let p = ConvParams {
        dilation: vec![2],
        ..ConvParams::default()
    };
    let y = run1(conv(p, 1), &[x, w]);
    check(&y, F32, &[1, 1, 3], &[31.0, 42.0, 53.0]);
}

#[test]
fn constants_and_multiple_outputs() {
    let mut g = Graph::new("c");
    let x = g.input("x", Meta::new(F32, &[2]));
    let c = g
        .constant(Constant::literal(&[1.0, 2.0], Meta::new(F32, &[2])).unwrap())
        .unwrap();
    let y = g.op(Op::Binary(BinaryOp::Mul), &[x, c]).unwrap();
    g.output(y).unwrap();
    g.output(x).unwrap();
    let outs = eval(&g, &[t(F32, &[2], &[3.0, 4.0])]).unwrap();
    assert_eq!(outs[0].data, [3.0, 8.0]);
    assert_eq!(outs[1].data, [3.0, 4.0]);
    assert!(eval(&g, &[t(F64, &[2], &[3.0, 4.0])]).is_err());
}

#[test]
fn error_bounds_track_conditioning_and_close_calls() {
    // exact ops carry no error; a sum's bound grows with the summed magnitudes
    let x = t(F32, &[4], &[1.0, -1.0, 1e4, -1e4]);
    let r = bounded1(Op::Unary(UnaryOp::Abs), std::slice::from_ref(&x));
    assert_eq!(r.err, [0.0; 4]);
    let s = bounded1(
        Op::Reduce {
            kind: ReduceKind::Sum,
            dims: vec![],
            keepdim: false,
        },
        std::slice::from_ref(&x),
    );
    assert_eq!(s.value.data, [0.0]);
    assert!(s.err[0] > 1e-3 && s.err[0] < 1e-2, "{:?}", s.err);
    // comparing a rounded product with its exact neighbour is too close to call
    let mut g = Graph::new("close");
    let a = g.input("a", Meta::new(F32, &[1]));
    let m = g
        .op(
            Op::BinaryScalar {
                op: BinaryOp::Mul,
                value: ScalarValue::Float(Float(3.0)),
                reversed: false,
            },
            &[a],
        )
        .unwrap();
    let c = g.op(Op::Binary(BinaryOp::Ge), &[m, a]).unwrap();
    let far = g.op(Op::Binary(BinaryOp::Eq), &[a, a]).unwrap();
    let v = eval_nodes(&g, &[t(F32, &[1], &[0.0])]).unwrap();
    assert!(
        !v[c.index()].as_ref().unwrap().unsure[0],
        "0*3 is exact: 0 error"
    );
    let v = eval_nodes(&g, &[t(F32, &[1], &[1e-30])]).unwrap();
    assert!(!v[c.index()].as_ref().unwrap().unsure[0]);
    assert!(!v[far.index()].as_ref().unwrap().unsure[0]);
    let exp = bounded1(Op::Unary(UnaryOp::Exp), &[t(F32, &[1], &[10.0])]);
    assert!(exp.err[0] > 0.0 && exp.err[0] < 1e-2 * exp.value.data[0]);
    // floor of an inexact value at an integer is too close to call
    let mut g = Graph::new("floor");
    let a = g.input("a", Meta::new(F32, &[1]));
    let e = g.op(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let f = g.op(Op::Unary(UnaryOp::Floor), &[e]).unwrap();
    let v = eval_nodes(&g, &[t(F32, &[1], &[0.0])]).unwrap();
    assert!(v[f.index()].as_ref().unwrap().unsure[0]);
    let v = eval_nodes(&g, &[t(F32, &[1], &[0.5])]).unwrap();
    assert!(!v[f.index()].as_ref().unwrap().unsure[0]);
}

/// Found by the differential test (fixed): `s % x` (Python remainder) is
/// `s - floor(s / x) x`, so for `-0.75 % x` with `x >= 1` it is `x - 0.75` and
/// carries x's error; the bound used fmod's `trunc(s / x) = 0` and gave 0.
#[test]
fn remainder_error_uses_floor() {
    let mut g = Graph::new("rem");
    let a = g.input("a", Meta::new(F32, &[1]));
    let scalar = |op, value: f64, reversed| Op::BinaryScalar {
        op,
        value: ScalarValue::Float(Float(value)),
        reversed,
    };
    let m = g.op(scalar(BinaryOp::Mul, 1.1, false), &[a]).unwrap();
    let r = g
        .op(scalar(BinaryOp::Remainder, -0.75, true), &[m])
        .unwrap();
    let f = g.op(scalar(BinaryOp::Fmod, -0.75, true), &[m]).unwrap();
    let v = eval_nodes(&g, &[t(F32, &[1], &[1.3])]).unwrap();
    let (em, er) = (
        v[m.index()].as_ref().unwrap().err[0],
        v[r.index()].as_ref().unwrap().err[0],
    );
    assert!(em > 0.0 && er >= em, "{em} {er}");
    // fmod: -0.75 - trunc(-0.75 / x) x = -0.75 exactly
    assert_eq!(v[f.index()].as_ref().unwrap().value.data, [-0.75]);
}
