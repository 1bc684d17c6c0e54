//! The compiled executor's launch list (frontend/src/compile/program.rs):
//! warm calls replay launches recorded once, over buffers placed by the
//! memory plan. On the digits CNN, a ResNet-style graph (residual blocks,
//! one with a downsampling shortcut) and a transformer-style block
//! (attention + layer_norm + MLP): compiled equals eager at two batch sizes
//! with the outputs of earlier calls kept alive, a warm call builds no
//! KernelIR and hashes no kernel, and compiled peak memory is at most eager's.

use kiln::compile::{compile_fn, Compiled};
use kiln::functional as F;
use kiln::nn::{Module, ModuleExt};
use kiln::{Result, Tensor};
use std::sync::Arc;

/// Kernel-cache counters and memory counters are process-wide: one test at a time.
/// Also keeps launch-list replay on (the default; `KILN_PROGRAM=0` turns it
/// off) whatever the environment says, before any compile reads it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    std::env::set_var("KILN_PROGRAM", "1");
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(dims: &[usize], seed: u64) -> Tensor {
    kiln::bench::randn(dims, seed)
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.dims(), b.dims(), "{what}");
    for (i, (p, q)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "{what}: element {i}: {p} vs {q}"
        );
    }
}

type Forward = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// A model in eval mode and the shape of one input sample.
struct Case {
    name: &'static str,
    forward: Forward,
    sample: Vec<usize>,
}

fn module_case(name: &'static str, m: impl Module + 'static, sample: &[usize]) -> Case {
    m.eval();
    let m = Arc::new(m);
    Case {
        name,
        forward: Arc::new(move |x| m.forward(x)),
        sample: sample.to_vec(),
    }
}

/// One pre-LN-free transformer block on `[batch, 6, 16]`: single-head
/// attention, residual, layer_norm, GELU MLP, residual, layer_norm.
fn transformer() -> Case {
    let d = 16;
    let w = |dims: &[usize], seed| &randn(dims, seed) * 0.2;
    let (wq, wk, wv, wo) = (w(&[d, d], 1), w(&[d, d], 2), w(&[d, d], 3), w(&[d, d], 4));
    let (w1, b1, w2, b2) = (
        w(&[4 * d, d], 5),
        w(&[4 * d], 6),
        w(&[d, 4 * d], 7),
        w(&[d], 8),
    );
    let (g1, h1, g2, h2) = (w(&[d], 9), w(&[d], 10), w(&[d], 11), w(&[d], 12));
    let forward = move |x: &Tensor| -> Result<Tensor> {
        let q = F::linear(x, &wq, None)?;
        let k = F::linear(x, &wk, None)?;
        let v = F::linear(x, &wv, None)?;
        let s = &F::matmul(&q, &k.transpose(-2, -1)?)? * (1.0 / (d as f64).sqrt());
        let a = F::linear(&F::matmul(&s.softmax(-1)?, &v)?, &wo, None)?;
        let h = F::layer_norm(&x.add(&a)?, &[d], Some(&g1), Some(&h1), 1e-5)?;
        let m = F::linear(&F::linear(&h, &w1, Some(&b1))?.gelu(false)?, &w2, Some(&b2))?;
        F::layer_norm(&h.add(&m)?, &[d], Some(&g2), Some(&h2), 1e-5)
    };
    Case {
        name: "transformer",
        forward: Arc::new(forward),
        sample: vec![6, d],
    }
}

fn cases() -> Vec<Case> {
    kiln::manual_seed(0);
    let cnn = kiln::train::ModelKind::Cnn.build().unwrap();
    let resnet = kiln::bench::vision::resnet([8, 16, 16, 16], [1, 1, 0, 0], 10).unwrap();
    vec![
        module_case("digits CNN", cnn, &[1, 8, 8]),
        module_case("ResNet-style", resnet, &[3, 32, 32]),
        transformer(),
    ]
}

fn batch(c: &Case, n: usize, seed: u64) -> Tensor {
    let mut dims = vec![n];
    dims.extend(&c.sample);
    randn(&dims, seed)
}

fn compiled(c: &Case) -> Compiled<'static> {
    let f = c.forward.clone();
    compile_fn(c.name, move |t: &[Tensor]| Ok(vec![f(&t[0])?]))
}

#[test]
fn compiled_equals_eager_at_two_batch_sizes_with_earlier_outputs_kept() {
    let _s = serial();
    let _ng = kiln::autograd::no_grad();
    for c in cases() {
        let fast = compiled(&c);
        let mut kept = vec![];
        // calls 1-2 run node by node and record; 3-5 replay
        for (k, n) in [2, 2, 2, 2, 2, 3, 3, 3, 3].into_iter().enumerate() {
            let x = batch(&c, n, 100 + k as u64);
            let y = fast.call(std::slice::from_ref(&x)).unwrap().remove(0);
            kept.push((x, y));
        }
        // every output still holds its own call's values
        for (k, (x, y)) in kept.iter().enumerate() {
            let want = (c.forward)(x).unwrap();
            assert_close(&format!("{} call {k}", c.name), y, &want, 1e-4);
        }
        let report = fast.explain();
        assert_eq!(report.entries.len(), 2, "{}: {report}", c.name);
    }
}

#[test]
fn warm_calls_build_no_kernel_ir_and_hash_no_kernel() {
    let _s = serial();
    let _ng = kiln::autograd::no_grad();
    for c in cases() {
        let fast = compiled(&c);
        let x = batch(&c, 2, 7);
        for _ in 0..3 {
            fast.call(std::slice::from_ref(&x)).unwrap();
        }
        let before = kiln::runtime::cache_stats();
        let y = fast.call(std::slice::from_ref(&x)).unwrap().remove(0);
        let after = kiln::runtime::cache_stats();
        // a Linear's bias starts its GEMM's output rows: no kernel of its own
        println!(
            "{}: warm call specialised {} kernels, {} lookups",
            c.name,
            after.specialised - before.specialised,
            after.hits - before.hits
        );
        assert_eq!(after.specialised, before.specialised, "{}", c.name);
        assert_eq!(after.hits, before.hits, "{}", c.name);
        assert_eq!(after.compiles, before.compiles, "{}", c.name);
        assert_close(c.name, &y, &(c.forward)(&x).unwrap(), 1e-4);
        // a new batch size re-plans: a new launch list, no new machine code
        let x3 = batch(&c, 3, 8);
        let compiles = kiln::runtime::cache_stats().compiles;
        for _ in 0..3 {
            fast.call(std::slice::from_ref(&x3)).unwrap();
        }
        assert_eq!(
            kiln::runtime::cache_stats().compiles,
            compiles,
            "{}",
            c.name
        );
    }
}

/// Peak bytes one call holds beyond what was live before it (outputs included).
fn peak(f: impl FnOnce() -> Vec<Tensor>) -> usize {
    kiln::bench::peak_of(|| Ok(f())).unwrap()
}

#[test]
fn compiled_peak_memory_is_at_most_eager() {
    let _s = serial();
    let _ng = kiln::autograd::no_grad();
    for c in cases() {
        let fast = compiled(&c);
        let x = batch(&c, 8, 9);
        for _ in 0..3 {
            fast.call(std::slice::from_ref(&x)).unwrap();
        }
        let eager = peak(|| vec![(c.forward)(&x).unwrap()]);
        let comp = peak(|| fast.call(std::slice::from_ref(&x)).unwrap());
        // the measured call replayed a launch list (not the node-by-node path)
        let report = fast.explain();
        let list = match &report.entries[0].launch_list {
            Some(Ok(l)) => *l,
            other => panic!("{}: no launch list: {other:?}\n{report}", c.name),
        };
        println!(
            "{}: peak eager {eager} B, compiled {comp} B ({list})",
            c.name
        );
        assert!(
            comp <= eager,
            "{}: compiled {comp} B > eager {eager} B",
            c.name
        );
    }
}

/// Regression (the differential backward run's seed 670): the CPU
/// `scatter_add` of a weighted cross_entropy's class-weight gradient casts
/// its source to f64 in a temporary, frees it, sums on the host into a new
/// storage (often at the freed one's address) and casts that back. The
/// recorder took the second storage for the first by address, so warm calls
/// replayed the two casts without the sum between them: the weight's
/// gradient came back unscattered. (As many samples as classes: the two
/// f64 storages have one size.) Every call's gradients must equal eager's.
#[test]
fn replayed_backward_keeps_host_work_between_launches() {
    let _s = serial();
    let t = Tensor::from_vec(vec![0i64, 1, 0, 1], &[4]).unwrap();
    let loss =
        |x: &Tensor, w: &Tensor| F::cross_entropy(x, &t, Some(w), kiln::ClassLossOpts::default());
    let fast = compile_fn("weighted_ce", |xs: &[Tensor]| {
        Ok(vec![loss(&xs[0], &xs[1])?])
    });
    for call in 0..4u64 {
        let leaves = || {
            let x = randn(&[4, 4], 20 + call).requires_grad_(true);
            let w = (&randn(&[4], 30 + call).abs().unwrap() + 0.5).requires_grad_(true);
            (x, w)
        };
        let (xe, we) = leaves();
        let le = loss(&xe, &we).unwrap();
        le.backward().unwrap();
        let (xc, wc) = leaves();
        let lc = fast.call(&[xc.clone(), wc.clone()]).unwrap().remove(0);
        lc.backward().unwrap();
        let what = |v: &str| format!("call {call}: {v}");
        assert_close(&what("loss"), &lc, &le, 1e-5);
        assert_close(
            &what("x.grad"),
            &xc.grad().unwrap(),
            &xe.grad().unwrap(),
            1e-5,
        );
        assert_close(
            &what("w.grad"),
            &wc.grad().unwrap(),
            &we.grad().unwrap(),
            1e-5,
        );
    }
    let report = fast.explain();
    assert_eq!(report.entries.len(), 1, "{report}");
    assert!(report.entries[0].graph_break.is_none(), "{report}");
}

/// A one-pass reduction and its reader over the same rows are one kernel,
/// the reduction's row pass (ops/fuse/rows.rs): the replayed launch list of
/// softmax, log_softmax and an affine layer_norm holds ONE launch, whose
/// results equal eager's (which runs the same row pass) and the composition
/// of the primitives it replaces.
#[test]
fn softmax_and_layer_norm_replay_one_launch() {
    let _s = serial();
    let _ng = kiln::autograd::no_grad();
    let (w, b) = (randn(&[37], 3), randn(&[37], 4));
    type F1 = Box<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;
    let cases: Vec<(&str, F1)> = vec![
        ("softmax", Box::new(|x: &Tensor| x.softmax(-1))),
        ("log_softmax", Box::new(|x: &Tensor| x.log_softmax(-1))),
        (
            "layer_norm",
            Box::new(move |x: &Tensor| F::layer_norm(x, &[37], Some(&w), Some(&b), 1e-5)),
        ),
    ];
    for (name, f) in cases {
        let f = Arc::new(f);
        let g = f.clone();
        let fast = compile_fn(name, move |t: &[Tensor]| Ok(vec![g(&t[0])?]));
        let x = randn(&[5, 37], 11);
        let mut y = None;
        for _ in 0..3 {
            y = Some(fast.call(std::slice::from_ref(&x)).unwrap().remove(0));
        }
        let report = fast.explain();
        match &report.entries[0].launch_list {
            Some(Ok(l)) => assert_eq!(l.launches, 1, "{name}: {report}"),
            other => panic!("{name}: no launch list: {other:?}\n{report}"),
        }
        assert_close(name, &y.unwrap(), &f(&x).unwrap(), 1e-6);
    }
    // the primitives the row passes stand for, each its own kernel
    let x = randn(&[5, 37], 11);
    let m = x.amax(Some(&[-1]), true).unwrap();
    let e = x.sub(&m).unwrap().exp().unwrap();
    let want = e.div(&e.sum(Some(&[-1]), true).unwrap()).unwrap();
    assert_close(
        "softmax by primitives",
        &x.softmax(-1).unwrap(),
        &want,
        1e-6,
    );
}

/// Convs whose outputs are large enough to take their epilogue per tile
/// (a replayed tile step, `tile_replay.rs`) on 14x14 planes: a SiLU after
/// a per-channel scale, whose tiles keep one row per channel (the scale is
/// not laid out like the output), and a SiLU alone after a depthwise conv,
/// whose tiles of whole planes run as one row each (the exp on wide vectors).
#[test]
fn tiled_conv_epilogues_replay_equal_eager() {
    let _s = serial();
    let _ng = kiln::autograd::no_grad();
    let (c, hw) = (336, 14);
    let w1 = &randn(&[c, 64, 1, 1], 1) * 0.1;
    let w2 = &randn(&[c, 1, 3, 3], 2) * 0.3;
    let scale = randn(&[1, c, 1, 1], 3);
    let depthwise = kiln::ir::op::conv::ConvParams {
        padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
        groups: c,
        ..Default::default()
    };
    let forward = move |x: &Tensor| -> Result<Tensor> {
        let a = F::conv2d(x, &w1, None, &Default::default())?
            .mul(&scale)?
            .silu()?;
        F::conv2d(&a, &w2, None, &depthwise)?.silu()
    };
    let f = Arc::new(forward);
    let g = f.clone();
    let fast = compile_fn("tiled", move |t: &[Tensor]| Ok(vec![g(&t[0])?]));
    // calls 1-2 run node by node and record; the rest replay
    for (k, n) in [2, 2, 2, 2, 3, 3, 3].into_iter().enumerate() {
        let x = randn(&[n, 64, hw, hw], 40 + k as u64);
        let y = fast.call(std::slice::from_ref(&x)).unwrap().remove(0);
        assert_close(&format!("call {k}"), &y, &f(&x).unwrap(), 1e-4);
    }
}
