//! The whole stage: snapshots of rewritten graphs, runner limits and their
//! stop reasons, wrong rules caught, the interface kept, and speed.

use super::rules::rw;
use super::*;
use kiln_ir::graph::NodeOp;
use std::time::Duration;

const CONV_BN_RELU: &str = "graph conv_bn_relu(
    %0 x: f32[8,64,56,56],
    %1 conv.weight: f32[64,64,3,3],
    %2 bn.running_mean: f32[64],
    %3 bn.running_var: f32[64],
    %4 bn.weight: f32[64],
    %5 bn.bias: f32[64]
) {
  %6 = conv2d(%0, %1) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,64,56,56]
  %7 = batch_norm(%6, %2, %3, %4, %5) {eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false} : f32[8,64,56,56]
  %8 = relu(%7) : f32[8,64,56,56]
  return %8
}
";

/// gelu as a tracer records `x * 0.5 * (1 + erf(x / sqrt(2)))`, with the
/// constant computed in the graph and a redundant `* 1`.
const GELU_CHAIN: &str = "graph gelu_chain(%0 x: f32[64,256]) {
  %1 = mul_scalar(%0) {reversed=false, value=0.5} : f32[64,256]
  %2 = constant() {value=2.0} : f32[]
  %3 = sqrt(%2) : f32[]
  %4 = div(%0, %3) : f32[64,256]
  %5 = erf(%4) : f32[64,256]
  %6 = add_scalar(%5) {reversed=true, value=1.0} : f32[64,256]
  %7 = mul(%1, %6) : f32[64,256]
  %8 = mul_scalar(%7) {reversed=false, value=1} : f32[64,256]
  return %8
}
";

const ALGEBRA: &str = "graph algebra(%0 x: f32[4,8]) {
  %1 = permute(%0) {dims=[1,0]} : f32[8,4]
  %2 = permute(%1) {dims=[1,0]} : f32[4,8]
  %3 = neg(%2) : f32[4,8]
  %4 = neg(%3) : f32[4,8]
  %5 = relu(%4) : f32[4,8]
  %6 = relu(%5) : f32[4,8]
  %7 = view(%6) {shape=[32]} : f32[32]
  %8 = view(%7) {shape=[2,16]} : f32[2,16]
  %9 = constant() {value=1.0} : f32[]
  %10 = expand(%9) {size=[2,16]} : f32[2,16]
  %11 = mul(%8, %10) : f32[2,16]
  %12 = cast(%11) {dtype=f32} : f32[2,16]
  %13 = sub_scalar(%12) {reversed=false, value=0} : f32[2,16]
  return %13
}
";

/// A small CNN (36 nodes): three conv+BN+ReLU blocks, pools, a classifier.
const SMALL_CNN: &str = "graph small_cnn(
    %0 x: f32[8,3,32,32],
    %1 c1.weight: f32[16,3,3,3], %2 c1.bias: f32[16],
    %3 bn1.running_mean: f32[16], %4 bn1.running_var: f32[16], %5 bn1.weight: f32[16], %6 bn1.bias: f32[16],
    %7 c2.weight: f32[32,16,3,3],
    %8 bn2.running_mean: f32[32], %9 bn2.running_var: f32[32], %10 bn2.weight: f32[32], %11 bn2.bias: f32[32],
    %12 c3.weight: f32[64,32,3,3],
    %13 bn3.running_mean: f32[64], %14 bn3.running_var: f32[64], %15 bn3.weight: f32[64], %16 bn3.bias: f32[64],
    %17 fc.weight: f32[10,64], %18 fc.bias: f32[10]
) {
  %19 = conv2d(%0, %1, %2) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,16,32,32]
  %20 = batch_norm(%19, %3, %4, %5, %6) {eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false} : f32[8,16,32,32]
  %21 = relu(%20) : f32[8,16,32,32]
  %22 = max_pool2d(%21) {ceil_mode=false, dilation=[1,1], kernel_size=[2,2], padding=[0,0], stride=[2,2]} : (f32[8,16,16,16], i64[8,16,16,16])
  %23 = getitem(%22) {index=0} : f32[8,16,16,16]
  %24 = conv2d(%23, %7) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,32,16,16]
  %25 = batch_norm(%24, %8, %9, %10, %11) {eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false} : f32[8,32,16,16]
  %26 = relu(%25) : f32[8,32,16,16]
  %27 = max_pool2d(%26) {ceil_mode=false, dilation=[1,1], kernel_size=[2,2], padding=[0,0], stride=[2,2]} : (f32[8,32,8,8], i64[8,32,8,8])
  %28 = getitem(%27) {index=0} : f32[8,32,8,8]
  %29 = conv2d(%28, %12) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,64,8,8]
  %30 = batch_norm(%29, %13, %14, %15, %16) {eps=1e-5, has_bias=true, has_running_stats=true, has_weight=true, momentum=0.1, training=false} : f32[8,64,8,8]
  %31 = relu(%30) : f32[8,64,8,8]
  %32 = adaptive_avg_pool2d(%31) {output_size=[1,1]} : f32[8,64,1,1]
  %33 = view(%32) {shape=[8,64]} : f32[8,64]
  %34 = linear(%33, %17, %18) : f32[8,10]
  %35 = log_softmax(%34) {dim=1} : f32[8,10]
  return %35
}
";

/// The config with every input but the first (the activation) a parameter.
fn weights_are_params(g: &Graph) -> RewriteConfig {
    RewriteConfig {
        params: g.inputs()[1..].iter().copied().collect(),
        ..RewriteConfig::default()
    }
}

/// The report without its `time` line.
fn stable(r: &RewriteReport) -> String {
    let s = r.to_string();
    s.lines()
        .filter(|l| !l.starts_with("time:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Before, after and the report: what the snapshots hold. Checks that the
/// rewrite is deterministic and a fixpoint.
fn before_after(text: &str) -> String {
    let g = Graph::parse(text).unwrap();
    let cfg = weights_are_params(&g);
    let out = rewrite(&g, &cfg).unwrap();
    assert_eq!(out.report.stop_reason, "Saturated");
    let again = rewrite(&g, &cfg).unwrap();
    assert_eq!(again.graph.to_text(), out.graph.to_text(), "deterministic");
    assert_eq!(stable(&again.report), stable(&out.report));
    let twice = rewrite(&out.graph, &cfg).unwrap();
    assert_eq!(twice.graph.to_text(), out.graph.to_text(), "a fixpoint");
    format!(
        "{}-- after rewrite --\n{}-- report --\n{}",
        g.to_text(),
        out.graph.to_text(),
        stable(&out.report)
    )
}

/// How many nodes of each op name a graph has, e.g. `conv2d:1 relu:1`.
fn op_counts(g: &Graph) -> String {
    let mut m: BTreeMap<String, usize> = BTreeMap::new();
    for n in g.nodes() {
        if let NodeOp::Op(_) = n.op {
            *m.entry(n.op_name()).or_insert(0) += 1;
        }
    }
    let v: Vec<String> = m.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    v.join(" ")
}

#[test]
fn conv_bn_relu_folds_the_batch_norm() {
    let g = Graph::parse(CONV_BN_RELU).unwrap();
    let out = rewrite(&g, &weights_are_params(&g)).unwrap();
    // one conv on the folded weight and bias, then relu; the rest is parameter-only
    assert_eq!(
        op_counts(&out.graph),
        "add:1 add_scalar:1 conv2d:1 mul:3 neg:1 relu:1 rsqrt:1 view:1"
    );
    assert_eq!(out.report.fired.get("bn-fold-conv"), Some(&1));
    // the BatchNorm's read and write of the activation are gone: a third of the traffic
    assert!(
        out.report.cost_after < 0.7 * out.report.cost_before,
        "{}",
        out.report
    );
    insta::assert_snapshot!("conv_bn_relu", before_after(CONV_BN_RELU));
}

#[test]
fn gelu_chain_folds_its_constant() {
    insta::assert_snapshot!("gelu_chain", before_after(GELU_CHAIN));
}

#[test]
fn algebra_simplifies() {
    let out = before_after(ALGEBRA);
    insta::assert_snapshot!("algebra", out);
}

#[test]
fn small_cnn_folds_every_batch_norm_quickly() {
    let g = Graph::parse(SMALL_CNN).unwrap();
    assert_eq!(g.len(), 36);
    let cfg = weights_are_params(&g);
    let out = rewrite(&g, &cfg).unwrap();
    assert_eq!(out.report.stop_reason, "Saturated");
    assert_eq!(out.report.fired.get("bn-fold-conv"), Some(&3));
    assert!(!out.graph.to_text().contains("batch_norm"));
    // best of a few runs: the budget of the whole compile() is 50 ms, this
    // stage should take a few (a debug build is several times slower)
    let best = (0..5)
        .map(|_| rewrite(&g, &cfg).unwrap().report.time)
        .min()
        .unwrap();
    let limit = if cfg!(debug_assertions) { 100 } else { 10 };
    assert!(best < Duration::from_millis(limit), "{best:?}");
    println!(
        "small_cnn: {} nodes, best of 5: {best:?}\n{}",
        g.len(),
        out.report
    );
}

#[test]
fn runner_limits_are_reported() {
    let g = Graph::parse(SMALL_CNN).unwrap();
    let cfg = |node_limit, iter_limit, time_limit| RewriteConfig {
        node_limit,
        iter_limit,
        time_limit,
        ..weights_are_params(&g)
    };
    let ms = Duration::from_millis(50);
    let tiny = rewrite(&g, &cfg(10, 30, ms)).unwrap();
    // egg reports the e-graph's size when it stopped
    assert_eq!(tiny.report.stop_reason, "NodeLimit(36)");
    assert!(tiny.report.fired.is_empty());
    assert!(
        tiny.graph.to_text().contains("batch_norm"),
        "stopped before any rule"
    );
    let one = rewrite(&g, &cfg(10_000, 1, ms)).unwrap();
    assert_eq!(one.report.stop_reason, "IterationLimit(1)");
    assert_eq!(one.report.iterations, 1);
    let no_time = rewrite(&g, &cfg(10_000, 30, Duration::ZERO)).unwrap();
    assert!(
        no_time.report.stop_reason.starts_with("TimeLimit"),
        "{}",
        no_time.report
    );
    // whatever stopped it, the result is a valid graph of the same interface
    for out in [tiny, one, no_time] {
        out.graph.verify().unwrap();
        assert_eq!(out.graph.inputs(), g.inputs());
    }
}

#[test]
fn a_rule_that_changes_a_type_fails_the_rewrite() {
    let text = "graph g(%0 x: f32[2,3]) {
  %1 = sum(%0) {dims=[1], keepdim=false} : f32[2]
  %2 = relu(%1) : f32[2]
  return %2
}";
    let g = Graph::parse(text).unwrap();
    let wrong = |rule| RewriteConfig {
        extra_rules: vec![rule],
        ..RewriteConfig::default()
    };
    let e = rewrite(&g, &wrong(rw("wrong-sum", "(sum<*> ?x)", "?x"))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rewrite: a rewrite merged values of types f32[2,3] and f32[2] (rules that fired: wrong-sum)"
    );
    let e = rewrite(
        &g,
        &wrong(rw(
            "wrong-relu",
            "(relu ?x)",
            "(matmul ?x (view<shape=[1,2]> ?x))",
        )),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("rewrite: matmul: "), "{e}");
    // the same graph with only the built-in rules is fine
    rewrite(&g, &RewriteConfig::default()).unwrap();
}

#[test]
fn inputs_and_outputs_keep_their_places() {
    // an input added after an op, an unused input, an output returned twice,
    // an input returned as is
    let mut g = Graph::new("late");
    let m = kiln_ir::op::Meta::new(kiln_ir::DType::F32, &[2]);
    let a = g.input("a", m.clone());
    let n = g
        .op(kiln_ir::op::Op::Unary(kiln_ir::UnaryOp::Neg), &[a])
        .unwrap();
    let nn = g
        .op(kiln_ir::op::Op::Unary(kiln_ir::UnaryOp::Neg), &[n])
        .unwrap();
    let b = g.input("b", m.clone());
    let _unused = g.input("unused weight", m);
    for o in [nn, b, nn] {
        g.output(o).unwrap();
    }
    let out = rewrite(&g, &RewriteConfig::default()).unwrap().graph;
    assert_eq!(
        out.to_text(),
        "graph late(%0 a: f32[2], %1 b: f32[2], %2 \"unused weight\": f32[2]) {\n  return %0, %1, %0\n}\n"
    );
    let bad = RewriteConfig {
        params: [n].into_iter().collect(),
        ..RewriteConfig::default()
    };
    assert!(rewrite(&g, &bad).is_err(), "a parameter must be an input");
}

#[test]
fn the_report_is_one_fact_per_line() {
    let g = Graph::parse(CONV_BN_RELU).unwrap();
    let r = rewrite(&g, &weights_are_params(&g)).unwrap().report;
    let text = r.to_string();
    let keys: Vec<&str> = text.lines().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "stop",
            "iterations",
            "enodes",
            "eclasses",
            "fired bn-fold-conv",
            "cost before",
            "cost after",
            "time"
        ]
    );
}
