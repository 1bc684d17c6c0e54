//! Differential test: for seeds 0..GRAPHS, a random graph (see
//! `differential/gen.rs`) runs three ways: compiled (`Executable` on the
//! graph with its composites decomposed: fused kernels, one-pass lse_parts and
//! moments reductions with their prologues and epilogues), eager (every node,
//! composites included, through `run_op`, the eager Tensor ops) and in the
//! reference interpreter (`kiln_ir::graph::eval`, f64 with the scalar
//! semantics of `ir::scalar`). The reference evaluates composites (softmax,
//! layer_norm, cross_entropy, ...) directly by their textbook formulas, not
//! through kiln's decomposition, so the decomposition is checked too; the
//! decomposed graph also runs in the reference interpreter, whose outputs must
//! agree with the composites' formulas (a failure there points at the
//! decomposition itself rather than at the kernels). Every compiled output and
//! every eager node's value must equal the reference within the tolerance of
//! `differential/check.rs`. A mismatch prints the seed, the graph, and the
//! first node that differs (for the compiled leg: the first node whose own
//! cone, compiled alone, differs) with that cone as a smaller graph.
//!
//! The backward mode (`differential/backward.rs`, its own test) compiles
//! each graph, reduced to one scalar loss, for training (`compile_fn` +
//! `.backward()`) and compares the gradients with eager's on the traced call
//! and on a cached call with new values; graph breaks are counted by reason.
//!
//! `KILN_DIFF_GRAPHS=n` runs another number of graphs (from seed
//! `KILN_DIFF_FIRST`, 0 by default); `KILN_DIFF_SEED=s` runs only seed `s`.
//! (One process compiles every graph: many thousands of them can exhaust the
//! JIT's executable memory, so run long searches in chunks.)

#[path = "differential/backward.rs"]
mod backward;
#[path = "differential/check.rs"]
mod check;
#[path = "differential/gen.rs"]
mod gen;

use kiln_frontend::Tensor;
use kiln_ir::graph::eval::{eval_nodes, Bounded, HostTensor};
use kiln_ir::graph::Graph;
use kiln_ir::op::Meta;
use kiln_ir::DType;
use std::io::Write;
use std::time::Instant;

const GRAPHS: u64 = 1000;
/// The backward mode runs every `BACKWARD_STRIDE`-th seed of `0..GRAPHS`.
const BACKWARD_STRIDE: u64 = 1;

/// The first attempt for `seed` whose reference values all stay finite and
/// moderate (|v| <= 1e5), so that no leg overflows; and its reference.
fn accepted(seed: u64) -> (gen::Case, Vec<Option<Bounded>>, u64) {
    for attempt in 0.. {
        let case = gen::generate(seed, attempt);
        let Ok(vals) = eval_nodes(&case.graph, &case.inputs) else {
            panic!(
                "seed {seed}: the reference interpreter failed on\n{}\n{:?}",
                case.graph.to_text(),
                eval_nodes(&case.graph, &case.inputs).err()
            );
        };
        let tame = vals.iter().flatten().all(|b| {
            !b.dtype().is_float() || b.value.data.iter().all(|v| v.is_finite() && v.abs() <= 1e5)
        });
        if tame {
            return (case, vals, attempt);
        }
    }
    unreachable!()
}

#[derive(Default)]
struct Stats {
    nodes: usize,
    compared: usize,
    unsure: usize,
    rejected: u64,
    ops: std::collections::BTreeMap<String, usize>,
}

/// Checks one seed; `Err` is the failure report.
fn check_seed(seed: u64, stats: &mut Stats) -> Result<(), String> {
    let (case, reference, rejected) = accepted(seed);
    stats.rejected += rejected;
    stats.nodes += case.graph.len();
    for n in case.graph.nodes() {
        *stats.ops.entry(n.op_name()).or_default() += 1;
    }
    let g = &case.graph;
    let head = |leg: &str| {
        format!(
            "seed {seed}: {leg} differs from the reference\n{}",
            g.to_text()
        )
    };
    for b in reference.iter().flatten() {
        stats.unsure += b.unsure.iter().filter(|&&u| u).count();
    }
    // the decomposition, in the reference interpreter
    let lowered = kiln_passes::lower::decompose_composites(g).map_err(|e| e.to_string())?;
    let low = eval_nodes(&lowered, &case.inputs)
        .map_err(|e| format!("{}decomposed: {e}", head("the decomposition")))?;
    for (o, lo) in g.outputs().iter().zip(lowered.outputs()) {
        let (want, got) = (&reference[o.index()], &low[lo.index()]);
        let (Some(want), Some(got)) = (want, got) else {
            continue;
        };
        if let Err(m) = check::compare_reference(got, want) {
            return Err(format!(
                "{}output {o:?} of the decomposed graph (reference interpreter): {m}\n{}",
                head("the decomposition"),
                lowered.to_text()
            ));
        }
    }
    // compiled
    let outs = check::compiled(g, &case.inputs, &case.captured);
    let bad = match &outs {
        Err(e) => Some(e.clone()),
        Ok(outs) => g.outputs().iter().zip(outs).find_map(|(o, t)| {
            let want = reference[o.index()].as_ref().expect("output value");
            match check::compare(t, want) {
                Ok(n) => {
                    stats.compared += n;
                    None
                }
                Err(m) => Some(format!("output {o:?}: {m}")),
            }
        }),
    };
    if let Some(msg) = bad {
        let first = check::first_compiled_mismatch(g, &case.inputs, &case.captured, &reference);
        let detail = match first {
            Some((id, text, m)) => format!("first differing node {id:?}: {m}\ncone:\n{text}"),
            None => "no single node's cone differs when compiled alone".into(),
        };
        return Err(format!("{}compiled: {msg}\n{detail}", head("compiled")));
    }
    // eager, node by node
    match check::eager(g, &case.inputs) {
        Err((id, e)) => return Err(format!("{}eager node {id:?} failed: {e}", head("eager"))),
        Ok(vals) => {
            for (id, node) in g.iter() {
                let (Some(t), Some(want)) = (&vals[id.index()], &reference[id.index()]) else {
                    continue;
                };
                match check::compare(t, want) {
                    Ok(n) => stats.compared += n,
                    Err(m) => {
                        let (cone, _) = check::cone(g, id);
                        return Err(format!(
                            "{}first differing node {id:?} ({}): {m}\ncone:\n{}",
                            head("eager"),
                            node.op_name(),
                            cone.to_text()
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn compiled_eager_and_reference_agree() {
    let t0 = Instant::now();
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("KILN_DIFF_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env("KILN_DIFF_FIRST").unwrap_or(0);
            (first..first + env("KILN_DIFF_GRAPHS").unwrap_or(GRAPHS)).collect()
        }
    };
    let mut stats = Stats::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        if let Err(m) = check_seed(seed, &mut stats) {
            failures.push(m);
        }
    }
    let mut err = std::io::stderr();
    for f in &failures {
        writeln!(err, "{f}\n").unwrap();
    }
    writeln!(
        err,
        "differential: {} graphs ({} nodes, {} elements compared, {} reference elements too close to call, {} regenerated for overflow) in {:.1}s",
        seeds.len(),
        stats.nodes,
        stats.compared,
        stats.unsure,
        stats.rejected,
        t0.elapsed().as_secs_f64()
    )
    .unwrap();
    let ops: Vec<String> = stats.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
    writeln!(err, "differential: node counts: {}", ops.join(", ")).unwrap();
    writeln!(
        err,
        "differential: {} graphs, {} mismatches",
        seeds.len(),
        failures.len()
    )
    .unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} graphs differ (see above)",
        failures.len(),
        seeds.len()
    );
}

/// The backward mode (`differential/backward.rs`): compiled gradients equal
/// eager ones, on the traced call and on a cached call with new values.
/// `KILN_DIFF_SEED=s` runs only seed `s`; `KILN_DIFF_BACKWARD_GRAPHS=n` runs
/// every `BACKWARD_STRIDE`-th seed below `n` (from `KILN_DIFF_FIRST`).
#[test]
fn compiled_and_eager_gradients_agree() {
    let t0 = Instant::now();
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("KILN_DIFF_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env("KILN_DIFF_FIRST").unwrap_or(0);
            let n = env("KILN_DIFF_BACKWARD_GRAPHS").unwrap_or(GRAPHS);
            (first..first + n)
                .filter(|s| s % BACKWARD_STRIDE == 0)
                .collect()
        }
    };
    let mut stats = backward::Stats::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        if let Err(m) = backward::check_seed(seed, &mut stats) {
            failures.push(m);
        }
    }
    let mut err = std::io::stderr();
    for f in &failures {
        writeln!(err, "{f}\n").unwrap();
    }
    let breaks: usize = stats.breaks.values().map(|(n, _)| n).sum();
    let reasons: Vec<String> = stats
        .breaks
        .iter()
        .map(|(r, (n, seeds))| format!("{n}x {r} ({}, ...)", seeds.join("; ")))
        .collect();
    writeln!(
        err,
        "differential backward: {} seeds, {} without a gradient path, {} calls ({} skipped: a value too close to call), {} gradients ({} elements) compared in {:.1}s",
        seeds.len(),
        stats.no_grad_path,
        stats.calls,
        stats.unsure,
        stats.grads_compared,
        stats.elements,
        t0.elapsed().as_secs_f64()
    )
    .unwrap();
    writeln!(
        err,
        "differential backward: {} graphs, {} mismatches, {} graph breaks (by reason: {})",
        stats.graphs,
        failures.len(),
        breaks,
        if reasons.is_empty() {
            "none".to_string()
        } else {
            reasons.join("; ")
        }
    )
    .unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} graphs' gradients differ (see above)",
        failures.len(),
        seeds.len()
    );
}

/// Compiles the one-output graph `text` and compares it with the reference.
fn compiled_matches_reference(text: &str, inputs: Vec<HostTensor>) -> Result<(), String> {
    let g = Graph::parse(text).map_err(|e| e.to_string())?;
    let reference = eval_nodes(&g, &inputs).map_err(|e| e.to_string())?;
    let want = reference[g.outputs()[0].index()].as_ref().expect("a value");
    let outs = check::compiled(&g, &inputs, &vec![false; inputs.len()])?;
    check::compare(&outs[0], want).map(|_| ())
}

fn host(dt: DType, dims: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::new(Meta::new(dt, dims), data.to_vec()).unwrap()
}

/// Found by this test (fixed): adding bools stored 2 in a bool tensor (the CPU
/// emitter's integer `iadd` on Bool). PyTorch and the scalar semantics
/// (`Interp`) give `true + true = true`.
#[test]
fn bool_add_is_logical_or() {
    let x = host(DType::Bool, &[2], &[0.0, 1.0]);
    let r = compiled_matches_reference(
        "graph b(%0 x: bool[2]) {\n  %1 = add_scalar(%0) {reversed=false, value=true} : bool[2]\n  return %1\n}\n",
        vec![x.clone()],
    );
    assert_eq!(r, Ok(()));
    let r = compiled_matches_reference(
        "graph b(%0 x: bool[2], %1 y: bool[2]) {\n  %2 = add(%0, %1) : bool[2]\n  return %2\n}\n",
        vec![x.clone(), x],
    );
    assert_eq!(r, Ok(()));
}

/// Found by this test (fixed): a reduction of a value computed from constants alone
/// (a 0-dim splat constant: a pending expression with no tensor, so no loop
/// dims) panics with "attempt to subtract with overflow" at
/// frontend/src/ops/kernel.rs:155 (`loop_dims.len() - 1`). The same sum of a
/// 0-dim input works.
#[test]
fn reduction_of_a_constant() {
    let r = compiled_matches_reference(
        "graph a() {\n  %0 = constant() {value=1.0} : f32[]\n  %1 = sum(%0) {dims=[], keepdim=false} : f32[]\n  return %1\n}\n",
        vec![],
    );
    assert_eq!(r, Ok(()));
}

/// Found by the backward mode (fixed): the backward of narrow/slice/select
/// (and of a conv's asymmetric padding) wrote the gradient into a zero
/// tensor in place, which the tracer refuses (`graph break at copy`), so
/// every compiled training step through a slice ran eagerly. It is now cat
/// and reshape; the gradients must be the same, traced or not.
#[test]
fn slice_select_backward_traces() {
    use kiln_frontend::compile::compile_fn;
    let f = |xs: &[Tensor]| -> kiln_ir::Result<Vec<Tensor>> {
        let x = &xs[0];
        let a = x.slice(1, Some(1), None, 2)?; // columns 1, 3
        let b = x.select(0, -1)?; // last row
        let c = x.narrow(1, 2, 2)?; // columns 2, 3
        let l = a
            .sum(None, false)?
            .add(&b.mul(&b)?.sum(None, false)?)?
            .add(&c.mul(&c)?.sum(None, false)?)?;
        Ok(vec![l])
    };
    let data: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 3.0).collect();
    // expected: 1 on the slice, 2x on the last row, 2x on columns 2, 3
    let mut want = vec![0.0f64; 15];
    for r in 0..3 {
        for c in 0..5 {
            let x = data[r * 5 + c] as f64;
            let k = r * 5 + c;
            if c == 1 || c == 3 {
                want[k] += 1.0;
            }
            if r == 2 {
                want[k] += 2.0 * x;
            }
            if c == 2 || c == 3 {
                want[k] += 2.0 * x;
            }
        }
    }
    let x = Tensor::from_vec(data.clone(), &[3, 5])
        .unwrap()
        .requires_grad_(true);
    f(&[x.clone()]).unwrap()[0].backward().unwrap();
    assert_eq!(x.grad().unwrap().to_f64_vec(), want, "eager");
    let compiled = compile_fn("slices", f);
    let x = Tensor::from_vec(data, &[3, 5])
        .unwrap()
        .requires_grad_(true);
    compiled.call(&[x.clone()]).unwrap()[0].backward().unwrap();
    let r = compiled.explain();
    assert!(r.entries[0].graph_break.is_none(), "{r}");
    assert_eq!(x.grad().unwrap().to_f64_vec(), want, "compiled");
}
