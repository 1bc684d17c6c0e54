//! The compile() tracer on every eager op: each forward case of the PyTorch
//! fixtures is traced with its inputs as arguments; the trace must finish
//! without a graph break, verify, and — replayed node by node through
//! `dispatch::run_op` — reproduce the traced outputs bit for bit. Prints
//! `trace SUITE: P/T` per suite (`KILN_TRACE_SHOW=case` prints the graphs of
//! the cases whose name contains `case`). Also: what the tracer refuses.

#[allow(dead_code)]
mod fixture_support;

use fixture_support::{load_suite, Case, Fixtures, FORWARD_SUITES};
use kiln::backends::cpu::{with_algorithm, ConvAlgo};
use kiln::compile::dispatch::run_op;
use kiln::compile::trace::{self, Binding, GraphBreak, Trace};
use kiln::ir::graph::NodeOp;
use kiln::ir::op::conv::conv_geometry;
use kiln::ir::op::Op;
use kiln::nn::{Linear, Module, ModuleExt, Sequential};
use kiln::optim::Optimizer;
use kiln::runtime::externs::conv::select;
use kiln::{DType, Tensor};
use std::collections::BTreeSet;
use std::io::Write;

/// Every `Op` variant, by the name its `Debug` form starts with.
const VARIANTS: [&str; 38] = [
    "Unary",
    "Binary",
    "BinaryScalar",
    "Where",
    "Cast",
    "Reduce",
    "Mean",
    "Var",
    "Std",
    "LogSumExp",
    "Softmax",
    "LogSoftmax",
    "LayerNorm",
    "GroupNorm",
    "BatchNorm",
    "Matmul",
    "Linear",
    "Conv",
    "ConvTranspose2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool2d",
    "Embedding",
    "View",
    "Permute",
    "Expand",
    "Slice",
    "Select",
    "Diagonal",
    "Unfold",
    "Cat",
    "IndexSelect",
    "Gather",
    "MaskedFill",
    "CrossEntropy",
    "NllLoss",
    "PairLoss",
];

fn variant(op: &kiln::ir::op::Op) -> String {
    let s = format!("{op:?}");
    s.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

/// Traces `f(args)`: the trace, or why not.
fn trace_ok(
    name: &str,
    args: &[Tensor],
    names: &[(String, Tensor)],
    f: impl FnOnce(&[Tensor]) -> kiln::Result<Vec<Tensor>>,
) -> Result<(Trace, Vec<Tensor>), String> {
    match trace::trace(name, args, names, f) {
        Err(e) => Err(format!("error while tracing: {e}")),
        Ok(Err(b)) => Err(format!("{b}")),
        Ok(Ok(t)) => Ok(t),
    }
}

/// Replays the graph node by node through `run_op`, inputs bound per
/// `bindings`; returns the graph outputs.
fn replay(tr: &Trace, args: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let g = &tr.graph;
    let mut env: Vec<Vec<Tensor>> = vec![vec![]; g.len()];
    for (k, id) in g.inputs().iter().enumerate() {
        env[id.index()] = vec![match &tr.bindings[k] {
            Binding::Arg(i) => args[*i].clone(),
            Binding::Captured(t) => t.clone(),
            Binding::Tangent(_) => return Err("a forward trace has no tangents".into()),
            Binding::Random(spec) => spec.draw().map_err(|e| e.to_string())?,
        }];
    }
    for (id, node) in g.iter() {
        let operand = |o: &kiln::ir::NodeId| -> Result<Tensor, String> {
            match env[o.index()].as_slice() {
                [t] => Ok(t.clone()),
                v => Err(format!("operand %{} has {} values", o.index(), v.len())),
            }
        };
        env[id.index()] = match &node.op {
            NodeOp::Input { .. } => continue,
            NodeOp::Op(op) => {
                let ins = node
                    .operands
                    .iter()
                    .map(operand)
                    .collect::<Result<Vec<_>, _>>()?;
                let run = || run_op(op, &ins);
                match eager_conv_algorithm(op, &ins) {
                    Some(algo) => with_algorithm(algo, run),
                    None => run(),
                }
                .map_err(|e| format!("run_op %{}: {e}", id.index()))?
            }
            NodeOp::Project(i) => vec![env[node.operands[0].index()][*i].clone()],
            NodeOp::Const(_) => return Err("the tracer made a constant node".into()),
        };
    }
    g.outputs()
        .iter()
        .map(|o| env[o.index()].first().cloned().ok_or("empty output".into()))
        .collect()
}

/// The algorithm an eager conv of `op` on `ins` runs (benchmarking is off
/// for eager ops: the heuristic). A compiled graph's convs time theirs, and
/// another algorithm rounds differently (as under `cudnn.benchmark`), so the
/// replay runs the one the traced outputs came from.
fn eager_conv_algorithm(op: &Op, ins: &[Tensor]) -> Option<ConvAlgo> {
    let Op::Conv { params, spatial } = op else {
        return None;
    };
    let name = if *spatial == 1 { "conv1d" } else { "conv2d" };
    let bias = ins.get(2).map(|b| b.dims().to_vec());
    let g = conv_geometry(name, ins[0].dims(), ins[1].dims(), bias.as_deref(), params).ok()?;
    Some(select::heuristic(&g))
}

/// Same dtype, shape and bytes.
fn identical(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.dims() != want.dims() {
        return Err(format!(
            "{} {:?} vs traced {} {:?}",
            got.dtype(),
            got.dims(),
            want.dtype(),
            want.dims()
        ));
    }
    if got.to_bytes() != want.to_bytes() {
        return Err(format!(
            "values differ: {:?} vs traced {:?}",
            got.to_f64_vec(),
            want.to_f64_vec()
        ));
    }
    Ok(())
}

fn trace_case(fx: &Fixtures, c: &Case, seen: &mut BTreeSet<String>) -> Result<(), String> {
    let args = fx.inputs(c)?;
    let (tr, outs) = match trace_ok(&c.case, &args, &[], |a| fixture_support::ops::run(c, a)) {
        Err(why) if fixture_support::expected_break(c, &why) => return Ok(()),
        r => r?,
    };
    tr.graph
        .verify()
        .map_err(|e| format!("verify: {e}\n{}", tr.graph.to_text()))?;
    if tr.graph.outputs().len() != outs.len() {
        return Err("graph outputs do not match the results".into());
    }
    if std::env::var("KILN_TRACE_SHOW").is_ok_and(|v| c.case.contains(&v)) {
        eprintln!("{}", tr.graph.to_text());
    }
    for (_, n) in tr.graph.iter() {
        if let NodeOp::Op(op) = &n.op {
            seen.insert(variant(op));
        }
    }
    let replayed = replay(&tr, &args).map_err(|e| format!("{e}\n{}", tr.graph.to_text()))?;
    for (k, (got, want)) in replayed.iter().zip(&outs).enumerate() {
        identical(got, want).map_err(|e| format!("out{k}: {e}\n{}", tr.graph.to_text()))?;
    }
    Ok(())
}

#[test]
fn every_fixture_op_traces_and_replays_exactly() {
    let fx = Fixtures::load();
    let mut failed = vec![];
    let mut summary = vec![];
    let mut seen = BTreeSet::new();
    for suite in FORWARD_SUITES {
        let cases: Vec<Case> = load_suite(&fx, suite)
            .into_iter()
            .filter(|c| !c.expect_error)
            .collect();
        let mut pass = 0;
        for c in &cases {
            match trace_case(&fx, c, &mut seen) {
                Ok(()) => pass += 1,
                Err(e) => failed.push(format!("trace {suite}/{}: {e}", c.case)),
            }
        }
        summary.push(format!("trace {suite}: {pass}/{}", cases.len()));
    }
    let missing: Vec<&str> = VARIANTS
        .iter()
        .copied()
        .filter(|v| !seen.contains(*v))
        .collect();
    let mut err = std::io::stderr();
    for line in summary.iter().chain(&failed) {
        let _ = writeln!(err, "{line}");
    }
    let _ = writeln!(
        err,
        "trace: {} of {} op variants recorded",
        seen.len(),
        VARIANTS.len()
    );
    assert!(
        failed.is_empty(),
        "{} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(missing.is_empty(), "no fixture recorded {missing:?}");
}

fn x23() -> Tensor {
    Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5, -0.5, 4.0], &[2, 3]).unwrap()
}

fn expect_break(
    r: kiln::Result<std::result::Result<(Trace, Vec<Tensor>), GraphBreak>>,
) -> GraphBreak {
    match r {
        Ok(Err(b)) => b,
        Ok(Ok((t, _))) => panic!("traced without a break:\n{}", t.graph.to_text()),
        Err(e) => panic!("tracing failed instead of breaking: {e}"),
    }
}

#[test]
fn reading_a_traced_value_is_a_graph_break() {
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let s = a[0].sum(None, false)?;
        if s.item()? > 0.0 {
            Ok(vec![a[0].relu()?])
        } else {
            Ok(vec![a[0].neg()?])
        }
    }));
    assert_eq!(b.op, "item");
    assert!(b.to_string().contains("graph break at `item`"), "{b}");
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let _ = a[0].exp()?.to_vec::<f32>()?;
        Ok(vec![])
    }));
    assert_eq!(b.op, "to_vec");
    // infallible reads do not panic: they mark the trace broken
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let v = a[0].t()?.to_f64_vec();
        assert_eq!(v.len(), 6);
        let bytes = a[0].t()?.to_bytes();
        assert_eq!(bytes.len(), 24);
        Ok(vec![a[0].relu()?])
    }));
    assert_eq!(b.op, "to_f64_vec");
    // reading an untraced tensor is fine
    let c = x23();
    let (t, _) = trace_ok("f", &[x23()], &[], |a| {
        let k = c.to_vec::<f32>()?[0] as f64;
        Ok(vec![a[0].binary_scalar(
            kiln::ir::BinaryOp::Mul,
            k,
            false,
        )?])
    })
    .unwrap();
    assert_eq!(t.graph.inputs().len(), 1, "{}", t.graph.to_text());
}

#[test]
fn random_ops_are_refused_but_dropout_masks_are_inputs() {
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let r = kiln::random::rand(&[2, 3], None);
        Ok(vec![a[0].add(&r)?])
    }));
    assert_eq!(b.op, "rand");
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        Ok(vec![a[0].add(&kiln::random::randn(&[2, 3], None))?])
    }));
    assert_eq!(b.op, "randn");
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        Ok(vec![kiln::random::bernoulli(&a[0].sigmoid()?, None)?])
    }));
    assert_eq!(b.op, "bernoulli");
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let r = kiln::random::randint(0, 5, &[2, 3], None)?;
        Ok(vec![a[0].add(&r)?])
    }));
    assert_eq!(b.op, "randint");
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let t = Tensor::zeros(&[2, 3], DType::F32);
        t.uniform_(0.0, 1.0, None)?;
        Ok(vec![a[0].add(&t)?])
    }));
    assert_eq!(b.op, "uniform_");
    // Dropout's mask is a random graph input (drawn again on every call),
    // and the generator is put back after the trace
    let drop = kiln::nn::Dropout::new(0.5).unwrap();
    kiln::manual_seed(4);
    let before = kiln::random::get_rng_state();
    let (mut t, _) = trace_ok("f", &[x23()], &[], |a| Ok(vec![drop.forward(&a[0])?])).unwrap();
    assert!(
        matches!(t.bindings[1], Binding::Random(_)),
        "{}",
        t.graph.to_text()
    );
    t.undo_side_effects().unwrap();
    assert_eq!(kiln::random::get_rng_state(), before);
    // in eval mode dropout is the identity and traces
    drop.set_own_training(false);
    let (t, _) = trace_ok("f", &[x23()], &[], |a| Ok(vec![drop.forward(&a[0])?])).unwrap();
    t.graph.verify().unwrap();
}

#[test]
fn in_place_writes_are_refused() {
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        let y = a[0].exp()?;
        y.copy_(&a[0])?;
        Ok(vec![y])
    }));
    assert_eq!(b.op, "copy_");
    // an optimizer step writes parameters in place
    let p = x23().requires_grad_(true);
    p.set_grad(Some(Tensor::ones(&[2, 3], DType::F32)));
    let cfg = kiln::optim::SgdConfig {
        lr: 0.1,
        ..Default::default()
    };
    let mut opt = kiln::optim::SGD::with_params(vec![p.clone()], cfg).unwrap();
    let b = expect_break(trace::trace("f", &[x23()], &[], |a| {
        opt.step()?;
        Ok(vec![a[0].relu()?])
    }));
    assert_eq!(b.op, "copy_");
}

#[test]
fn captured_parameters_become_named_inputs() {
    let model = Sequential::new().add(Linear::new(3, 2, true).unwrap());
    let names = model.named_parameters();
    assert!(names.iter().any(|(n, _)| n == "0.weight"), "{names:?}");
    let x = x23();
    // without a gradient to record, linear is one node (a joint trace with
    // grad on records its matmul and add, whose backward rules need them)
    let _ng = kiln::autograd::no_grad();
    let (t, outs) = trace_ok("mlp", std::slice::from_ref(&x), &names, |a| {
        Ok(vec![model.forward(&a[0])?.relu()?])
    })
    .unwrap();
    let g = &t.graph;
    g.verify().unwrap();
    let input_names: Vec<String> = g
        .inputs()
        .iter()
        .map(|id| match &g.node(*id).op {
            NodeOp::Input { name } => name.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(input_names, ["x0", "0.weight", "0.bias"], "{}", g.to_text());
    assert!(matches!(t.bindings[0], Binding::Arg(0)));
    for (k, (n, p)) in names.iter().enumerate() {
        match &t.bindings[k + 1] {
            Binding::Captured(c) => assert!(c.is_same(p), "{n} bound to another tensor"),
            Binding::Arg(_) | Binding::Tangent(_) | Binding::Random(_) => {
                panic!("{n} bound to an argument")
            }
        }
    }
    let text = g.to_text();
    assert!(text.contains("linear(%0, %1, %2)"), "{text}");
    let again = replay(&t, &[x]).unwrap();
    identical(&again[0], &outs[0]).unwrap();
}

#[test]
fn tracing_records_only_outermost_ops() {
    // softmax runs several kernels and linear calls matmul: one node each
    let w = Tensor::from_vec(vec![0.5f32; 12], &[4, 3]).unwrap();
    let (t, _) = trace_ok("f", &[x23()], &[], |a| {
        let y = kiln::functional::linear(&a[0], &w, None)?;
        Ok(vec![y.softmax(-1)?])
    })
    .unwrap();
    let ops: Vec<String> = t
        .graph
        .iter()
        .filter_map(|(_, n)| match &n.op {
            NodeOp::Op(op) => Some(variant(op)),
            _ => None,
        })
        .collect();
    assert_eq!(ops, ["Linear", "Softmax"], "{}", t.graph.to_text());
    // and tracing is off again afterwards
    assert!(!trace::is_tracing());
}
