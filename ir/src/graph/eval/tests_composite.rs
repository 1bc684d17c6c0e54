//! Hand-computed cases for the reference interpreter's composites, losses,
//! gather and the multi-result reductions composites lower to.

use super::*;
use crate::graph::NodeId;
use crate::op::Reduction;
use crate::{Float, ReduceKind};
use DType::*;

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

fn t(dt: DType, dims: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::new(Meta::new(dt, dims), data.to_vec()).unwrap()
}

/// `op` applied to inputs of the tensors' types: every result of the node
/// (through `getitem` when it has several) with its bounds.
fn run(op: Op, ins: &[HostTensor]) -> Result<Vec<Bounded>> {
    let mut g = Graph::new("t");
    let ids: Vec<_> = ins
        .iter()
        .enumerate()
        .map(|(i, x)| g.input(format!("x{i}"), x.meta.clone()))
        .collect();
    let y = g.op(op, &ids)?;
    let n = g.node(y).metas.len();
    let outs: Vec<NodeId> = if n == 1 {
        vec![y]
    } else {
        (0..n).map(|k| g.project(y, k).unwrap()).collect()
    };
    let v = eval_nodes(&g, ins)?;
    Ok(outs.iter().map(|o| v[o.index()].clone().unwrap()).collect())
}

fn run1(op: Op, ins: &[HostTensor]) -> Bounded {
    run(op, ins).unwrap().remove(0)
}

/// Values equal `want` within 1e-12 (NaN matches NaN, infinities exactly).
fn close(got: &Bounded, dims: &[usize], want: &[f64]) {
    assert_eq!(got.meta().dims.as_slice(), dims, "{got:?}");
    let ok = got.value.data.len() == want.len()
        && got.value.data.iter().zip(want).all(|(&g, &w)| {
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-12 * (1.0 + w.abs())
        });
    assert!(ok, "got {:?} want {want:?}", got.value.data);
}

#[test]
fn lse_parts_and_logsumexp() {
    let ln = f64::ln;
    let x = t(F64, &[2, 3], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0]);
    let r = run(Op::LseParts { dims: vec![1] }, std::slice::from_ref(&x)).unwrap();
    close(&r[0], &[2, 1], &[3.0, 0.0]);
    let l0 = ln((-2f64).exp() + (-1f64).exp() + 1.0);
    close(&r[1], &[2, 1], &[l0, ln(3.0)]);
    let lse = |dims: Vec<i64>, keepdim| Op::LogSumExp { dims, keepdim };
    close(
        &run1(lse(vec![-1], false), std::slice::from_ref(&x)),
        &[2],
        &[3.0 + l0, ln(3.0)],
    );
    close(
        &run1(lse(vec![0], true), std::slice::from_ref(&x)),
        &[1, 3],
        &[
            1.0 + ln(1.0 + (-1f64).exp()),
            2.0 + ln(1.0 + (-2f64).exp()),
            3.0 + ln(1.0 + (-3f64).exp()),
        ],
    );
    // the Reduce kind gives the same
    let red = Op::Reduce {
        kind: ReduceKind::LogSumExp,
        dims: vec![1],
        keepdim: false,
    };
    close(&run1(red, &[x]), &[2], &[3.0 + l0, ln(3.0)]);
    // rows that are not all finite, as kiln's one-pass kernel gives them
    let e = t(F32, &[4, 2], &[-INF, -INF, INF, 1.0, NAN, 1.0, 1.0, -INF]);
    let r = run(Op::LseParts { dims: vec![1] }, std::slice::from_ref(&e)).unwrap();
    close(&r[0], &[4, 1], &[f32::MIN as f64, INF, NAN, 1.0]);
    close(&r[1], &[4, 1], &[-INF, NAN, NAN, 0.0]);
    close(
        &run1(lse(vec![1], false), &[e]),
        &[4],
        &[-INF, INF, NAN, 1.0],
    );
    // f64's lowest shift; an empty row is an all -inf one
    let r = run(Op::LseParts { dims: vec![] }, &[t(F64, &[1], &[-INF])]).unwrap();
    close(&r[0], &[1], &[f64::MIN]);
    let r = run(Op::LseParts { dims: vec![1] }, &[t(F32, &[2, 0], &[])]).unwrap();
    close(&r[1], &[2, 1], &[-INF, -INF]);
}

#[test]
fn moments_var_and_std() {
    let x = t(F64, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let r = run(
        Op::Moments {
            dims: vec![],
            eps: Float(0.75),
        },
        std::slice::from_ref(&x),
    )
    .unwrap();
    close(&r[0], &[1], &[2.5]);
    close(&r[1], &[1], &[1.25]);
    close(&r[2], &[1], &[1.0 / 2f64.sqrt()]);
    let welford = Op::Reduce {
        kind: ReduceKind::Welford,
        dims: vec![0],
        keepdim: true,
    };
    close(&run1(welford, std::slice::from_ref(&x)), &[1], &[1.25]);
    let var = |correction, std| {
        let (dims, correction, keepdim) = (vec![0], Float(correction), false);
        if std {
            Op::Std {
                dims,
                correction,
                keepdim,
            }
        } else {
            Op::Var {
                dims,
                correction,
                keepdim,
            }
        }
    };
    close(
        &run1(var(1.0, false), std::slice::from_ref(&x)),
        &[],
        &[5.0 / 3.0],
    );
    close(
        &run1(var(0.0, false), std::slice::from_ref(&x)),
        &[],
        &[1.25],
    );
    close(
        &run1(var(1.0, true), std::slice::from_ref(&x)),
        &[],
        &[(5.0f64 / 3.0).sqrt()],
    );
    // n - correction <= 0: NaN for a zero sum of squares, inf otherwise
    close(&run1(var(1.0, false), &[t(F32, &[1], &[3.0])]), &[], &[NAN]);
    close(
        &run1(var(2.0, true), &[t(F32, &[2], &[1.0, 2.0])]),
        &[],
        &[INF],
    );
    // empty rows, and rows with a NaN
    let r = run(
        Op::Moments {
            dims: vec![1],
            eps: Float(1e-5),
        },
        &[t(F32, &[2, 0], &[])],
    )
    .unwrap();
    close(&r[0], &[2, 1], &[NAN, NAN]);
    close(&r[2], &[2, 1], &[NAN, NAN]);
    let r = run1(var(0.0, false), &[t(F32, &[2], &[NAN, 1.0])]);
    close(&r, &[], &[NAN]);
}

#[test]
fn softmax_and_log_softmax() {
    let x = t(F64, &[2, 2], &[0.0, 3f64.ln(), -INF, 0.0]);
    close(
        &run1(Op::Softmax { dim: 1 }, std::slice::from_ref(&x)),
        &[2, 2],
        &[0.25, 0.75, 0.0, 1.0],
    );
    let lq = [0.25f64.ln(), 0.75f64.ln(), -INF, 0.0];
    close(
        &run1(Op::LogSoftmax { dim: -1 }, std::slice::from_ref(&x)),
        &[2, 2],
        &lq,
    );
    // along dim 0 the columns are [0, -inf] and [ln 3, 0]
    close(
        &run1(Op::Softmax { dim: 0 }, &[x]),
        &[2, 2],
        &[1.0, 0.75, 0.0, 0.25],
    );
    // rows whose max is not finite are NaN; a 0-dim softmax is 1
    let e = t(F32, &[3, 2], &[INF, 1.0, -INF, -INF, NAN, 0.0]);
    close(
        &run1(Op::Softmax { dim: 1 }, std::slice::from_ref(&e)),
        &[3, 2],
        &[NAN; 6],
    );
    close(&run1(Op::LogSoftmax { dim: 1 }, &[e]), &[3, 2], &[NAN; 6]);
    close(
        &run1(Op::Softmax { dim: 0 }, &[t(F32, &[], &[5.0])]),
        &[],
        &[1.0],
    );
    // f32: the bound is a few ulps of each probability
    let f = run1(Op::Softmax { dim: 0 }, &[t(F32, &[3], &[1.0, 2.0, 3.0])]);
    for (v, e) in f.value.data.iter().zip(&f.err) {
        assert!(*e > 0.0 && *e < 1e-5 * v, "{f:?}");
    }
}

#[test]
fn normalisations() {
    let ln = |w: bool, b: bool, eps| Op::LayerNorm {
        normalized_shape: vec![2],
        eps: Float(eps),
        has_weight: w,
        has_bias: b,
    };
    let x = t(F64, &[2, 2], &[1.0, 3.0, 2.0, 2.0]);
    close(
        &run1(ln(false, false, 0.0), std::slice::from_ref(&x)),
        &[2, 2],
        &[-1.0, 1.0, NAN, NAN],
    );
    let (w, b) = (t(F64, &[2], &[2.0, 1.0]), t(F64, &[2], &[0.0, 10.0]));
    let y = run1(ln(true, true, 1.0), &[x.clone(), w.clone(), b.clone()]);
    let s = 1.0 / 2f64.sqrt();
    close(&y, &[2, 2], &[-2.0 * s, s + 10.0, 0.0, 10.0]);
    close(
        &run1(ln(false, true, 1.0), &[x, b]),
        &[2, 2],
        &[-s, s + 10.0, 0.0, 10.0],
    );
    // group_norm: channels [1, 3] and [5, 9] in two groups, then per channel
    let gn = |w: bool, b: bool| Op::GroupNorm {
        groups: 2,
        eps: Float(0.0),
        has_weight: w,
        has_bias: b,
    };
    let x = t(F64, &[1, 4, 1], &[1.0, 3.0, 5.0, 9.0]);
    close(
        &run1(gn(false, false), std::slice::from_ref(&x)),
        &[1, 4, 1],
        &[-1.0, 1.0, -1.0, 1.0],
    );
    let w = t(F64, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let b = t(F64, &[4], &[0.0, 0.0, 0.0, 1.0]);
    close(
        &run1(gn(true, true), &[x, w, b]),
        &[1, 4, 1],
        &[-1.0, 2.0, -3.0, 5.0],
    );
    // eval-mode batch_norm: the running stats, per channel
    let bn = |w: bool, b: bool| Op::BatchNorm {
        training: false,
        momentum: Float(0.1),
        eps: Float(0.0),
        has_running_stats: true,
        has_weight: w,
        has_bias: b,
    };
    let x = t(F64, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let (rm, rv) = (t(F64, &[2], &[1.0, 0.0]), t(F64, &[2], &[4.0, 1.0]));
    let y = run1(bn(false, false), &[x.clone(), rm.clone(), rv.clone()]);
    close(&y, &[2, 2], &[0.0, 2.0, 1.0, 4.0]);
    let (w, b) = (t(F64, &[2], &[2.0, 1.0]), t(F64, &[2], &[1.0, 0.0]));
    let y = run1(bn(true, true), &[x, rm, rv, w, b]);
    close(&y, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // f32 layer_norm of a constant row: exactly 0, but an implementation's
    // mean may be an ulp off, which eps magnifies: the bound allows it
    let y = run1(ln(false, false, 1e-5), &[t(F32, &[1, 2], &[3.0, 3.0])]);
    assert_eq!(y.value.data, [0.0, 0.0]);
    assert!(y.err[0] > 1e-5 && y.err[0] < 1e-3, "{:?}", y.err);
}

#[test]
fn class_losses() {
    let nll = |reduction, ignore_index, has_weight| Op::NllLoss {
        reduction,
        ignore_index,
        has_weight,
    };
    let lp = t(F64, &[2, 3], &[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]);
    let tg = t(I64, &[2], &[2.0, 0.0]);
    let w = t(F64, &[3], &[1.0, 2.0, 3.0]);
    let ins = [lp.clone(), tg.clone()];
    close(
        &run1(nll(Reduction::None, -100, false), &ins),
        &[2],
        &[3.0, 4.0],
    );
    close(&run1(nll(Reduction::Sum, -100, false), &ins), &[], &[7.0]);
    close(&run1(nll(Reduction::Mean, -100, false), &ins), &[], &[3.5]);
    let ins = [lp.clone(), tg.clone(), w];
    close(
        &run1(nll(Reduction::None, -100, true), &ins),
        &[2],
        &[9.0, 4.0],
    );
    close(
        &run1(nll(Reduction::Mean, -100, true), &ins),
        &[],
        &[13.0 / 4.0],
    );
    close(
        &run1(nll(Reduction::None, 2, true), &ins),
        &[2],
        &[0.0, 4.0],
    );
    close(&run1(nll(Reduction::Mean, 2, true), &ins), &[], &[4.0]);
    // (C) input with a 0-dim target; all ignored: NaN mean
    let ins = [t(F64, &[3], &[-1.0, -2.0, -3.0]), t(I64, &[], &[1.0])];
    close(&run1(nll(Reduction::Mean, -100, false), &ins), &[], &[2.0]);
    close(&run1(nll(Reduction::Mean, 1, false), &ins), &[], &[NAN]);
    assert!(run(
        nll(Reduction::Sum, -100, false),
        &[lp, t(I64, &[2], &[3.0, 0.0])]
    )
    .is_err());
    // cross_entropy = nll_loss of log_softmax, with label smoothing
    let ce = |label_smoothing| Op::CrossEntropy {
        reduction: Reduction::Mean,
        ignore_index: -100,
        label_smoothing: Float(label_smoothing),
        has_weight: false,
    };
    let ins = [t(F64, &[1, 2], &[0.0, 3f64.ln()]), t(I64, &[1], &[1.0])];
    let (l0, l1) = (0.25f64.ln(), 0.75f64.ln());
    close(&run1(ce(0.0), &ins), &[], &[-l1]);
    close(&run1(ce(0.5), &ins), &[], &[-0.5 * l1 - 0.25 * (l0 + l1)]);
    // (N, C, d) input: classes along dim 1
    let x = t(F64, &[1, 2, 2], &[0.0, 0.0, 3f64.ln(), 0.0]);
    let y = run1(
        Op::CrossEntropy {
            reduction: Reduction::None,
            ignore_index: -100,
            label_smoothing: Float(0.0),
            has_weight: false,
        },
        &[x, t(I64, &[1, 2], &[1.0, 0.0])],
    );
    close(&y, &[1, 2], &[-l1, 2f64.ln()]);
}

#[test]
fn pair_losses_and_gather() {
    let pl = |name, reduction| Op::PairLoss {
        name,
        reduction,
        has_weight: false,
        has_pos_weight: false,
    };
    let ins = [t(F64, &[3], &[0.0, 0.5, -3.0]), t(F64, &[1], &[0.0])];
    close(
        &run1(pl("mse", Reduction::None), &ins),
        &[3],
        &[0.0, 0.25, 9.0],
    );
    close(&run1(pl("mse", Reduction::Mean), &ins), &[], &[9.25 / 3.0]);
    close(&run1(pl("l1", Reduction::Sum), &ins), &[], &[3.5]);
    close(
        &run1(pl("smooth_l1", Reduction::None), &ins),
        &[3],
        &[0.0, 0.125, 2.5],
    );
    close(&run1(pl("huber", Reduction::Sum), &ins), &[], &[2.625]);
    assert!(run(pl("bce", Reduction::Sum), &ins).is_err());
    let x = t(F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let y = run1(
        Op::Gather { dim: 1 },
        &[x.clone(), t(I64, &[2, 1], &[1.0, 0.0])],
    );
    close(&y, &[2, 1], &[2.0, 3.0]);
    // a negative index is out of bounds, as in PyTorch (no wrapping)
    let neg = &[x.clone(), t(I64, &[2, 1], &[1.0, -2.0])];
    assert!(run(Op::Gather { dim: 1 }, neg).is_err());
    let y = run1(
        Op::Gather { dim: 0 },
        &[x.clone(), t(I64, &[1, 2], &[1.0, 0.0])],
    );
    close(&y, &[1, 2], &[3.0, 2.0]);
    assert!(run(Op::Gather { dim: 0 }, &[x, t(I64, &[1, 1], &[2.0])]).is_err());
}

/// A softmax lowered by hand the way kiln decomposes it (lse_parts read
/// through getitem) gives what the composite gives.
#[test]
fn decomposed_softmax_evaluates() {
    let mut g = Graph::new("d");
    let x = g.input("x", Meta::new(F32, &[2, 3]));
    let p = g.op(Op::LseParts { dims: vec![1] }, &[x]).unwrap();
    let (c, l) = (g.project(p, 0).unwrap(), g.project(p, 1).unwrap());
    let s = g.op(Op::Binary(BinaryOp::Sub), &[x, c]).unwrap();
    let z = g.op(Op::Binary(BinaryOp::Sub), &[s, l]).unwrap();
    let y = g.op(Op::Unary(UnaryOp::Exp), &[z]).unwrap();
    g.output(y).unwrap();
    let data = t(F32, &[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]);
    let v = eval_nodes(&g, std::slice::from_ref(&data)).unwrap();
    assert!(v[p.index()].is_none());
    let want = run1(Op::Softmax { dim: 1 }, &[data]);
    let got = v[y.index()].as_ref().unwrap();
    for i in 0..6 {
        let d = (got.value.data[i] - want.value.data[i]).abs();
        assert!(
            d <= SAFETY * (got.err[i] + want.err[i]),
            "{got:?} vs {want:?}"
        );
    }
}
