//! The profiler (issue 7): the key-averages table of a small training step,
//! the Chrome trace's structure, compile events on cold kernels only, and
//! nothing recorded when off.
//!
//! Tests here run concurrently and the profiler is process-wide: sessions
//! serialise (`Profiler::start` waits), and each test looks only at the events
//! of its own thread.

use kiln::functional as F;
use kiln::ir::op::conv::{ConvParams, Padding};
use kiln::profiler::{self, Category, Event, Profile};
use kiln::{ClassLossOpts, Tensor};
use serde_json::Value;
use std::collections::HashMap;

fn mine(p: &Profile) -> Vec<&Event> {
    let me = profiler::current_thread_id();
    p.events().iter().filter(|e| e.tid == me).collect()
}

fn ramp(dims: &[usize], scale: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let v = (0..n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * scale)
        .collect();
    Tensor::from_vec(v, dims).unwrap()
}

/// One step of a tiny CNN: conv2d - relu - flatten - linear - softmax - cross_entropy - backward.
fn step(x: &Tensor, w: &Tensor, lw: &Tensor, y: &Tensor) {
    let p = ConvParams {
        padding: Padding::Explicit(vec![1]),
        ..ConvParams::default()
    };
    let h = F::conv2d(x, w, None, &p).unwrap().relu().unwrap();
    let h = h.reshape(&[4, -1]).unwrap();
    let logits = F::linear(&h, lw, None).unwrap();
    let _probs = logits.softmax(-1).unwrap();
    let loss = F::cross_entropy(&logits, y, None, ClassLossOpts::default()).unwrap();
    loss.backward().unwrap();
}

fn inputs() -> (Tensor, Tensor, Tensor, Tensor) {
    let x = ramp(&[4, 1, 6, 6], 0.1);
    let w = ramp(&[3, 1, 3, 3], 0.05).requires_grad_(true);
    let lw = ramp(&[5, 3 * 36], 0.01).requires_grad_(true);
    let y = Tensor::from_vec(vec![0i64, 1, 4, 2], &[4]).unwrap();
    (x, w, lw, y)
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-profiler-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn row<'a>(
    rows: &'a [profiler::KeyAverage],
    name: &str,
    cat: Category,
) -> &'a profiler::KeyAverage {
    rows.iter()
        .find(|r| r.name == name && r.category == cat)
        .unwrap_or_else(|| panic!("no {name} ({}) row in {rows:#?}", cat.as_str()))
}

#[test]
fn table_lists_the_ops_of_a_training_step() {
    let (x, w, lw, y) = inputs();
    step(&x, &w, &lw, &y); // warm the kernel cache
    let ((), p) = profiler::profile(|| {
        for _ in 0..3 {
            step(&x, &w, &lw, &y);
        }
    });
    let me = profiler::current_thread_id();
    assert!(mine(&p).len() > 50);
    // other tests' threads may record too: count rows from this thread's events
    let rows: Vec<_> = p
        .key_averages(false)
        .into_iter()
        .filter(|r| {
            p.events()
                .iter()
                .any(|e| e.tid == me && e.name == r.name && e.category == r.category)
        })
        .collect();
    for (name, cat, calls) in [
        ("softmax", Category::Op, 3),
        ("cross_entropy", Category::Op, 3),
        ("linear", Category::Op, 3),
        ("backward", Category::Op, 3),
        ("conv2d", Category::Op, 3),
        ("conv2d", Category::Extern, 3),
        ("conv2d_weight_grad", Category::Extern, 3),
        ("conv_transpose2d", Category::Extern, 3), // the input gradient
        ("relu", Category::Kernel, 3),
        // softmax: one log-sum-exp kernel whose row pass stores exp((x - shift) - logsum)
        ("lse+rows", Category::Kernel, 3),
        ("Conv2dBackward", Category::Backward, 3),
        ("ReluBackward", Category::Backward, 3),
        ("MatmulBackward", Category::Backward, 3),
    ] {
        let r = row(&rows, name, cat);
        let mine_calls = mine(&p)
            .iter()
            .filter(|e| e.name == name && e.category == cat)
            .count();
        assert_eq!(mine_calls, calls, "{name} ({})", cat.as_str());
        assert!(r.calls >= calls && r.total_ns >= r.self_ns && r.self_ns > 0);
    }
    // sorted by total time, and the table prints the rows in that order
    let all = p.key_averages(false);
    assert!(all.windows(2).all(|w| w[0].total_ns >= w[1].total_ns));
    let t = p.table(false);
    assert!(
        t.contains("Name") && t.contains("Calls") && t.contains("Self %"),
        "{t}"
    );
    let pos = |n: &str| {
        t.find(&format!("\n{n} "))
            .unwrap_or_else(|| panic!("{n} in {t}"))
    };
    let (b, s) = (
        row(&all, "backward", Category::Op),
        row(&all, "relu", Category::Kernel),
    );
    assert!(
        b.total_ns > s.total_ns && pos("backward") < pos("relu"),
        "{t}"
    );
    // grouped by input shapes: forward and weight-gradient convolutions split
    let g = p.key_averages(true);
    let fwd = g
        .iter()
        .find(|r| {
            r.name == "conv2d"
                && r.category == Category::Op
                && r.shapes == Some(vec![vec![4, 1, 6, 6], vec![3, 1, 3, 3]])
        })
        .unwrap();
    assert!(fwd.calls >= 3);
    assert!(p.table(true).contains("[[4, 1, 6, 6], [3, 1, 3, 3]]"));
    // softmax's kernels are its children
    let ev = p.events();
    for (i, e) in ev.iter().enumerate() {
        if e.tid == me && e.name == "lse+rows" {
            let parent = p.parent(i).map(|j| &ev[j]);
            assert!(parent.is_some_and(|q| q.category == Category::Op), "{e:?}");
        }
    }
}

/// The structure Perfetto and chrome://tracing need; returns the X events by tid.
fn check_trace(path: &std::path::Path) -> HashMap<u64, Vec<Value>> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().expect("traceEvents array");
    let mut named_threads = vec![];
    let mut by_tid: HashMap<u64, Vec<Value>> = HashMap::new();
    for e in evs {
        for k in ["ph", "pid", "tid", "name"] {
            assert!(e.get(k).is_some(), "{k} missing in {e}");
        }
        match e["ph"].as_str().unwrap() {
            "M" => {
                if e["name"] == "thread_name" {
                    assert!(e["args"]["name"].is_string());
                    named_threads.push(e["tid"].as_u64().unwrap());
                }
            }
            "X" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
                assert!(
                    e["cat"].is_string() && e["args"]["shapes"].is_array(),
                    "{e}"
                );
                assert!(e["args"]["bytes"].is_u64(), "{e}");
                by_tid
                    .entry(e["tid"].as_u64().unwrap())
                    .or_default()
                    .push(e.clone());
            }
            ph => panic!("unexpected phase {ph}"),
        }
    }
    const EPS: f64 = 1e-3; // microseconds are written with 3 decimals, exactly
    for (tid, track) in &by_tid {
        assert!(named_threads.contains(tid), "thread {tid} has no name");
        let mut stack: Vec<(f64, f64)> = vec![];
        let mut last = 0.0;
        for e in track {
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            assert!(ts >= last, "timestamps go back on tid {tid}: {e}");
            last = ts;
            while stack.last().is_some_and(|&(_, end)| end <= ts + EPS) {
                stack.pop();
            }
            if let Some(&(pts, pend)) = stack.last() {
                assert!(
                    ts >= pts && ts + dur <= pend + EPS,
                    "{e} overlaps its parent"
                );
            }
            stack.push((ts, ts + dur));
        }
    }
    by_tid
}

#[test]
fn chrome_trace_is_well_formed_and_compiles_show_on_cold_kernels_only() {
    let me = profiler::current_thread_id();
    // a kernel signature no other test compiles: f64, rank 3, permuted
    let v: Vec<f64> = (0..24).map(|i| i as f64 * 0.25).collect();
    let x = Tensor::from_vec(v, &[2, 3, 4])
        .unwrap()
        .permute(&[2, 0, 1])
        .unwrap();
    let ((), cold) = profiler::profile(|| drop(x.softmax(1).unwrap()));
    let ((), warm) = profiler::profile(|| drop(x.softmax(1).unwrap()));
    let compiles = |p: &Profile| {
        mine(p)
            .iter()
            .filter(|e| e.category == Category::Compile)
            .count()
    };
    assert!(compiles(&cold) >= 1, "{}", cold.table(false));
    assert_eq!(compiles(&warm), 0, "{}", warm.table(false));
    // a compile lies inside its kernel launch, inside the op
    let ev = cold.events();
    for (i, e) in ev.iter().enumerate() {
        if e.tid == me && e.category == Category::Compile {
            assert!(e.name.starts_with("codegen "), "{e:?}");
            let k = &ev[cold.parent(i).expect("a compile has a parent")];
            assert_eq!(k.category, Category::Kernel);
            assert_eq!(e.name, format!("codegen {}", k.name));
            let op = ev.iter().position(|q| q == k).and_then(|j| cold.parent(j));
            assert_eq!(ev[op.expect("the kernel has a parent")].name, "softmax");
        }
    }
    let path = tmp("cold.json");
    cold.export_chrome_trace(&path).unwrap();
    let tracks = check_trace(&path);
    let track = &tracks[&me];
    let softmax = track.iter().find(|e| e["name"] == "softmax").unwrap();
    let (s0, s1) = (
        softmax["ts"].as_f64().unwrap(),
        softmax["dur"].as_f64().unwrap(),
    );
    let c = track.iter().find(|e| e["cat"] == "compile").unwrap();
    assert!(c["ts"].as_f64().unwrap() >= s0);
    assert!(c["ts"].as_f64().unwrap() + c["dur"].as_f64().unwrap() <= s0 + s1 + 1e-3);
    assert!(
        !std::fs::read_dir(path.parent().unwrap()).unwrap().any(|f| f
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-"))
    );

    // a whole training step, with backward
    let (x, w, lw, y) = inputs();
    let ((), p) = profiler::profile(|| step(&x, &w, &lw, &y));
    let path = tmp("step.json");
    p.export_chrome_trace(&path).unwrap();
    let tracks = check_trace(&path);
    let cats: Vec<&str> = tracks[&me]
        .iter()
        .map(|e| e["cat"].as_str().unwrap())
        .collect();
    for c in ["op", "kernel", "extern", "backward"] {
        assert!(cats.contains(&c), "no {c} event in {cats:?}");
    }
}

#[test]
fn nothing_is_recorded_when_off() {
    let (x, w, lw, y) = inputs();
    // no session of this thread runs (another test's may: it keeps these events)
    step(&x, &w, &lw, &y);
    let ((), p) = profiler::profile(|| {});
    assert!(mine(&p).is_empty(), "{}", p.table(false));
    // a session that ran earlier left nothing behind
    let ((), _) = profiler::profile(|| step(&x, &w, &lw, &y));
    let ((), p) = profiler::profile(|| {});
    assert!(mine(&p).is_empty());
}

#[test]
fn train_profile_writes_a_valid_trace_of_epoch_one() {
    use kiln::train::{run, TrainConfig};
    let path = tmp("train/trace.json");
    let cfg = TrainConfig {
        epochs: 2,
        limit: Some(160),
        profile: Some(path.clone()),
        ..TrainConfig::default()
    };
    run(&cfg).unwrap();
    let tracks = check_trace(&path);
    let all: Vec<&Value> = tracks.values().flatten().collect();
    let count = |name: &str| all.iter().filter(|e| e["name"] == name).count();
    // epoch 1 only: 128 training images in batches of 32, then one evaluation
    assert_eq!(count("train_step"), 4);
    assert_eq!(count("optimizer.step"), 4);
    assert_eq!(count("evaluate"), 1);
    assert!(count("Conv2dBackward") >= 8 && count("batch_norm") >= 8);
}
