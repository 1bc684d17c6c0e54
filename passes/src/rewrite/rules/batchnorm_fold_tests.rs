//! Where the fold applies, where it must not, and that the folded graph
//! computes what the original does (a small f64 reference evaluator below).

use super::rules;
use crate::rewrite::rules::testing::{fired, run};
use kiln_ir::graph::{Graph, NodeOp};
use kiln_ir::interp::{eval_unary, Val};
use kiln_ir::op::conv::Padding;
use kiln_ir::op::Op;
use kiln_ir::shape::numel;
use kiln_ir::{BinaryOp, DType};

const BN_EVAL: &str = "eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false";

fn conv_bn(bn_attrs: &str, outputs: &str) -> String {
    format!(
        "graph conv_bn(%0 x: f32[2,3,5,5], %1 w: f32[4,3,3,3], %2 b: f32[4], %3 mean: f32[4], %4 var: f32[4], %5 gamma: f32[4], %6 beta: f32[4]) {{
  %7 = conv2d(%0, %1, %2) {{dilation=[1], groups=1, padding=[1], stride=[1]}} : f32[2,4,5,5]
  %8 = batch_norm(%7, %3, %4, %5, %6) {{{bn_attrs}}} : f32[2,4,5,5]
  %9 = relu(%8) : f32[2,4,5,5]
  return {outputs}
}}"
    )
}

const PARAMS: [&str; 6] = ["w", "b", "mean", "var", "gamma", "beta"];

#[test]
fn eval_batch_norm_folds_into_conv() {
    let text = conv_bn(BN_EVAL, "%9");
    let (out, r) = run(rules(), &text, &PARAMS);
    assert_eq!(fired(&r, "bn-fold-conv"), 1, "{r}");
    assert!(!out.contains("batch_norm"), "{out}");
    assert_same_values(&text, &out);
}

#[test]
fn without_conv_bias_or_affine() {
    let text = "graph g(%0 x: f32[1,2,4,4], %1 w: f32[3,2,1,1], %2 mean: f32[3], %3 var: f32[3]) {
  %4 = conv2d(%0, %1) {dilation=[1], groups=1, padding=[0], stride=[1]} : f32[1,3,4,4]
  %5 = batch_norm(%4, %2, %3) {eps=0.001, has_bias=false, has_running_stats=true, has_weight=false, momentum=0.1, training=false} : f32[1,3,4,4]
  return %5
}";
    let (out, r) = run(rules(), text, &["w", "mean", "var"]);
    assert_eq!(fired(&r, "bn-fold-conv"), 1, "{r}");
    assert!(out.contains("neg(%2)"), "bias is -mean * scale:\n{out}");
    assert_same_values(text, &out);
}

#[test]
fn never_in_train_mode() {
    let train = BN_EVAL.replace("training=false", "training=true");
    let (out, r) = run(rules(), &conv_bn(&train, "%9"), &PARAMS);
    assert_eq!(fired(&r, "bn-fold-conv"), 0, "{out}");
    assert!(out.contains("batch_norm"));
    let text = "graph g(%0 x: f32[1,2,4,4], %1 w: f32[3,2,1,1]) {
  %2 = conv2d(%0, %1) {dilation=[1], groups=1, padding=[0], stride=[1]} : f32[1,3,4,4]
  %3 = batch_norm(%2) {eps=1e-5, has_bias=false, has_running_stats=false, has_weight=false, momentum=0.1, training=true} : f32[1,3,4,4]
  return %3
}";
    let (_, r) = run(rules(), text, &["w"]);
    assert_eq!(fired(&r, "bn-fold-conv"), 0, "batch statistics depend on x");
}

#[test]
fn not_when_the_conv_has_another_use() {
    // the conv's value is also returned: folding would need both convolutions
    let (out, r) = run(rules(), &conv_bn(BN_EVAL, "%9, %7"), &PARAMS);
    assert_eq!(fired(&r, "bn-fold-conv"), 0, "{out}");
    assert_eq!(out.matches("conv2d").count(), 1);
}

#[test]
fn linear_then_batch_norm_1d() {
    let text = "graph g(%0 x: f32[3,5], %1 w: f32[4,5], %2 b: f32[4], %3 mean: f32[4], %4 var: f32[4], %5 gamma: f32[4], %6 beta: f32[4]) {
  %7 = linear(%0, %1, %2) : f32[3,4]
  %8 = batch_norm(%7, %3, %4, %5, %6) {eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false} : f32[3,4]
  return %8
}";
    let (out, r) = run(rules(), text, &PARAMS);
    assert_eq!(fired(&r, "bn-fold-linear"), 1, "{r}");
    assert!(!out.contains("batch_norm"), "{out}");
    assert_same_values(text, &out);
    // over [N, L, C] the BatchNorm's channel dim is L, not the linear's output
    let text = "graph g(%0 x: f32[2,3,5], %1 w: f32[4,5], %2 mean: f32[3], %3 var: f32[3]) {
  %4 = linear(%0, %1) : f32[2,3,4]
  %5 = batch_norm(%4, %2, %3) {eps=1e-5, has_bias=false, has_running_stats=true, has_weight=false, momentum=0.1, training=false} : f32[2,3,4]
  return %5
}";
    let (_, r) = run(rules(), text, &["w", "mean", "var"]);
    assert_eq!(fired(&r, "bn-fold-linear"), 0);
}

/// Both graphs give the same outputs (in f64, up to rounding) on the same
/// pseudo-random inputs (variances made positive).
fn assert_same_values(before: &str, after: &str) {
    let (g, h) = (Graph::parse(before).unwrap(), Graph::parse(after).unwrap());
    let mut seed = 12345u64;
    let inputs: Vec<Vec<f64>> = g
        .inputs()
        .iter()
        .map(|&i| {
            let var = matches!(&g.node(i).op, NodeOp::Input { name } if name == "var");
            let n = numel(&g.meta(i).unwrap().dims);
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                    if var {
                        u.abs() + 0.1
                    } else {
                        u
                    }
                })
                .collect()
        })
        .collect();
    let (a, b) = (eval(&g, &inputs), eval(&h, &inputs));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for (p, q) in x.iter().zip(y) {
            assert!(
                (p - q).abs() <= 1e-9 * (1.0 + p.abs()),
                "{p} vs {q}\n{after}"
            );
        }
    }
}

/// A reference evaluator for the ops these tests use, in f64.
fn eval(g: &Graph, inputs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let mut vals: Vec<Vec<f64>> = Vec::with_capacity(g.len());
    let dims = |id: kiln_ir::NodeId| g.meta(id).unwrap().dims.to_vec();
    for (id, n) in g.iter() {
        let out = dims(id);
        let arg = |k: usize| &vals[n.operands[k].index()];
        let adims = |k: usize| dims(n.operands[k]);
        let v = match &n.op {
            NodeOp::Input { .. } => {
                inputs[g.inputs().iter().position(|&i| i == id).unwrap()].clone()
            }
            NodeOp::Const(c) => (0..numel(&out)).map(|i| c.value(i)).collect(),
            NodeOp::Project(_) => unreachable!(),
            NodeOp::Op(op) => match op {
                Op::Unary(u) => arg(0)
                    .iter()
                    .map(|&x| eval_unary(*u, Val::F(x), DType::F64).as_f64())
                    .collect(),
                Op::Binary(b) => broadcast2(&out, (arg(0), &adims(0)), (arg(1), &adims(1)), *b),
                Op::BinaryScalar {
                    op: BinaryOp::Add,
                    value,
                    reversed: false,
                } => arg(0).iter().map(|x| x + value.to_f64()).collect(),
                Op::View(_) => arg(0).clone(),
                Op::Conv { params, spatial: 2 } => {
                    let p = match &params.padding {
                        Padding::Explicit(p) => p[0],
                        _ => unreachable!(),
                    };
                    conv2d(
                        arg(0),
                        &adims(0),
                        arg(1),
                        &adims(1),
                        n.operands.get(2).map(|b| &vals[b.index()][..]),
                        p,
                        &out,
                    )
                }
                Op::Linear => {
                    let (xd, wd) = (adims(0), adims(1));
                    let (rows, k, o) = (numel(&xd) / xd[xd.len() - 1], xd[xd.len() - 1], wd[0]);
                    let mut y = vec![0.0; rows * o];
                    for r in 0..rows {
                        for j in 0..o {
                            let bias = n.operands.get(2).map_or(0.0, |b| vals[b.index()][j]);
                            y[r * o + j] = bias
                                + (0..k)
                                    .map(|t| arg(0)[r * k + t] * arg(1)[j * k + t])
                                    .sum::<f64>();
                        }
                    }
                    y
                }
                Op::BatchNorm {
                    training: false,
                    has_running_stats: true,
                    eps,
                    has_weight,
                    has_bias,
                    ..
                } => {
                    let c = out[1];
                    let inner: usize = out[2..].iter().product();
                    let mut rest = 3;
                    let mut take = |has: bool| {
                        has.then(|| {
                            rest += 1;
                            vals[n.operands[rest - 1].index()].clone()
                        })
                    };
                    let (gamma, beta) = (take(*has_weight), take(*has_bias));
                    (0..numel(&out))
                        .map(|i| {
                            let ch = (i / inner) % c;
                            let norm = (arg(0)[i] - arg(1)[ch]) / (arg(2)[ch] + eps.0).sqrt();
                            norm * gamma.as_ref().map_or(1.0, |g| g[ch])
                                + beta.as_ref().map_or(0.0, |b| b[ch])
                        })
                        .collect()
                }
                other => panic!("the test evaluator has no {other:?}"),
            },
        };
        vals.push(v);
    }
    g.outputs()
        .iter()
        .map(|o| vals[o.index()].clone())
        .collect()
}

fn broadcast2(
    out: &[usize],
    a: (&[f64], &[usize]),
    b: (&[f64], &[usize]),
    op: BinaryOp,
) -> Vec<f64> {
    let at = |(v, d): (&[f64], &[usize]), i: usize| {
        let (mut rem, mut flat, mut stride) = (i, 0, 1);
        for k in (0..out.len()).rev() {
            let idx = rem % out[k];
            rem /= out[k];
            if let Some(kd) = (k + d.len()).checked_sub(out.len()) {
                if d[kd] != 1 {
                    flat += idx * stride;
                }
                stride *= d[kd];
            }
        }
        v[flat]
    };
    (0..numel(out))
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                other => panic!("the test evaluator has no {other}"),
            }
        })
        .collect()
}

/// Stride 1, symmetric padding `p`, one group.
fn conv2d(
    x: &[f64],
    xd: &[usize],
    w: &[f64],
    wd: &[usize],
    b: Option<&[f64]>,
    p: usize,
    out: &[usize],
) -> Vec<f64> {
    let (n, ci, h, wi) = (xd[0], xd[1], xd[2] as isize, xd[3] as isize);
    let (co, kh, kw) = (wd[0], wd[2], wd[3]);
    let (oh, ow) = (out[2], out[3]);
    let mut y = vec![0.0; numel(out)];
    for b_ in 0..n {
        for o in 0..co {
            for i in 0..oh {
                for j in 0..ow {
                    let mut s = b.map_or(0.0, |b| b[o]);
                    for c in 0..ci {
                        for u in 0..kh {
                            for v in 0..kw {
                                let (r, q) =
                                    ((i + u) as isize - p as isize, (j + v) as isize - p as isize);
                                if r >= 0 && r < h && q >= 0 && q < wi {
                                    let xi = ((b_ * ci + c) * h as usize + r as usize)
                                        * wi as usize
                                        + q as usize;
                                    s += x[xi] * w[((o * ci + c) * kh + u) * kw + v];
                                }
                            }
                        }
                    }
                    y[((b_ * co + o) * oh + i) * ow + j] = s;
                }
            }
        }
    }
    y
}
