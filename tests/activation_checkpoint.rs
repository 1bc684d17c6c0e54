//! Activation checkpointing (`kiln::utils::checkpoint`, `Checkpointed`):
//! gradients identical to the plain run, less peak memory, dropout's mask
//! replayed, and the composition with `compile()`.
//!
//! The memory counters are process-wide, so the tests of this binary take
//! one lock and nothing else runs while one measures.

use kiln::nn::{Activation, Dropout, Linear, Module, ModuleExt, Sequential};
use kiln::utils::{checkpoint, Checkpointed};
use kiln::{memory, Tensor};
use std::sync::{Arc, Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const WIDTH: usize = 256;
const DEPTH: usize = 12;
const BATCH: usize = 256;
/// Blocks per checkpointed segment in the compiled memory test.
const SEGMENT: usize = 4;
const COMPILED_BATCH: usize = 1024;

fn block(dropout: bool) -> Sequential {
    let s = Sequential::new()
        .add(Linear::new(WIDTH, WIDTH, true).unwrap())
        .add(Activation::relu());
    if dropout {
        s.add(Dropout::new(0.2).unwrap())
    } else {
        s
    }
}

/// The deep MLP, plain or with every block checkpointed, same weights for one seed.
fn mlp(seed: u64, checkpointed: bool, dropout: bool) -> Sequential {
    kiln::manual_seed(seed);
    let mut m = Sequential::new();
    for _ in 0..DEPTH {
        m = match checkpointed {
            true => m.add(Checkpointed::new(block(dropout))),
            false => m.add(block(dropout)),
        };
    }
    m
}

/// The deep MLP with every `per` blocks checkpointed as one segment (the
/// usual use: a segment saves only its input, so longer segments save less).
fn mlp_segments(seed: u64, per: usize) -> Sequential {
    kiln::manual_seed(seed);
    let mut m = Sequential::new();
    for _ in 0..DEPTH / per {
        let mut seg = Sequential::new();
        for _ in 0..per {
            seg = seg.add(block(false));
        }
        m = m.add(Checkpointed::new(seg));
    }
    m
}

fn input() -> Tensor {
    kiln::manual_seed(99);
    kiln::random::randn(&[BATCH, WIDTH], None)
}

/// Forward + backward of `sum(m(x)^2)`; the peak bytes above what was live
/// before, and every gradient's bits.
fn step(m: &Sequential, x: &Tensor) -> (usize, Vec<Vec<u32>>) {
    kiln::manual_seed(7);
    m.zero_grad();
    let base = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    let y = m.forward(x).unwrap();
    let loss = y.mul(&y).unwrap().sum(None, false).unwrap();
    loss.backward().unwrap();
    drop((y, loss));
    let peak = memory::max_memory_allocated() - base;
    let grads = m
        .parameters()
        .iter()
        .map(|p| {
            let g = p.grad().expect("every parameter gets a gradient");
            g.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    (peak, grads)
}

#[test]
fn checkpointed_blocks_give_identical_gradients_with_less_peak_memory() {
    let _l = lock();
    let x = input();
    let plain = mlp(1, false, false);
    let ckpt = mlp(1, true, false);
    assert_eq!(plain.state_dict().len(), ckpt.state_dict().len());
    let (p_plain, g_plain) = step(&plain, &x);
    let (p_ckpt, g_ckpt) = step(&ckpt, &x);
    assert_eq!(g_plain, g_ckpt, "gradients differ");
    println!(
        "deep MLP {DEPTH}x Linear({WIDTH},{WIDTH})+ReLU, batch {BATCH}: peak above baseline {} plain, {} checkpointed ({:.2}x)",
        memory::format_bytes(p_plain),
        memory::format_bytes(p_ckpt),
        p_plain as f64 / p_ckpt as f64
    );
    assert!(p_ckpt < p_plain, "peak {p_ckpt} not below {p_plain}");
}

#[test]
fn dropout_inside_a_checkpoint_replays_its_mask() {
    let _l = lock();
    let x = input();
    let (_, a) = step(&mlp(2, false, true), &x);
    let (_, b) = step(&mlp(2, true, true), &x);
    assert_eq!(a, b, "the recomputation drew another dropout mask");
}

#[test]
fn checkpoint_of_a_closure_finds_its_parameters() {
    let _l = lock();
    let x = input().requires_grad_(true);
    let m = Arc::new(mlp(3, false, false));
    let grads = |m: &Sequential| -> Vec<Option<Vec<f64>>> {
        m.parameters()
            .iter()
            .map(|p| p.grad().map(|g| g.to_f64_vec()))
            .collect()
    };
    let two = |m: &Sequential, x: &Tensor| -> kiln::Result<Tensor> {
        m.get(1).unwrap().forward(&m.get(0).unwrap().forward(x)?)
    };
    two(&m, &x)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let (plain, gx) = (grads(&m), x.grad().unwrap().to_f64_vec());
    m.zero_grad();
    x.set_grad(None);
    let mc = m.clone();
    let y = checkpoint(move |xs| two(&mc, &xs[0]), &[x.clone()]).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "CheckpointBackward");
    y.sum(None, false).unwrap().backward().unwrap();
    assert_eq!(grads(&m), plain, "parameter gradients differ");
    assert_eq!(x.grad().unwrap().to_f64_vec(), gx, "input gradient differs");
    assert!(plain[0].is_some() && plain[DEPTH * 2 - 1].is_none());
}

/// One compiled training step of `sum(m(x)^2)` (the entry compiled, and
/// kernels built, by an earlier call); the peak bytes above the baseline,
/// every gradient's bits, and the backward's report.
fn compiled_step(
    c: &kiln::compile::Compiled<'_>,
    m: &Sequential,
    x: &Tensor,
) -> (usize, Vec<Vec<u32>>, kiln::compile::BackwardReport) {
    let run = || {
        m.zero_grad();
        let y = c.forward(x).unwrap();
        let loss = y.mul(&y).unwrap().sum(None, false).unwrap();
        loss.backward().unwrap();
    };
    run();
    m.zero_grad();
    let base = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    run();
    let peak = memory::max_memory_allocated() - base;
    let grads = m
        .parameters()
        .iter()
        .map(|p| {
            let g = p.grad().expect("every parameter gets a gradient");
            g.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    let report = c.explain().entries[0]
        .backward
        .clone()
        .expect("a training entry");
    (peak, grads, report)
}

fn assert_close(what: &str, got: &[Vec<u32>], want: &[Vec<u32>]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (&a, &b) in g.iter().zip(w) {
            let (a, b) = (f32::from_bits(a), f32::from_bits(b));
            assert!(
                (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                "{what}: param {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn compiled_backward_recomputes_checkpointed_blocks() {
    let _l = lock();
    // a larger batch than the eager test's: the activations, not the
    // weights' gradients (3 MiB, the same either way), dominate the peak
    kiln::manual_seed(98);
    let x = kiln::random::randn(&[COMPILED_BATCH, WIDTH], None);
    let (_, g_plain_eager) = step(&mlp(4, false, false), &x);
    let (_, g_ckpt_eager) = step(&mlp(4, true, false), &x);

    let (_, g_seg_eager) = step(&mlp_segments(4, SEGMENT), &x);
    assert_eq!(
        g_seg_eager, g_plain_eager,
        "eager segments: gradients differ"
    );

    let plain = mlp(4, false, false);
    let ckpt = mlp_segments(4, SEGMENT);
    let (cp, cc) = (
        kiln::compile::compile(&plain),
        kiln::compile::compile(&ckpt),
    );
    let (p_plain, g_plain, r_plain) = compiled_step(&cp, &plain, &x);
    let (p_ckpt, g_ckpt, r_ckpt) = compiled_step(&cc, &ckpt, &x);
    assert_close(
        "compiled checkpointed vs eager checkpointed",
        &g_ckpt,
        &g_ckpt_eager,
    );
    assert_close(
        "compiled checkpointed vs eager plain",
        &g_ckpt,
        &g_plain_eager,
    );
    assert_close("compiled checkpointed vs compiled plain", &g_ckpt, &g_plain);
    let line = |r: &kiln::compile::BackwardReport| {
        format!(
            "saves {} values ({}), recomputes {} ({}), {} backward kernels",
            r.saved,
            memory::format_bytes(r.saved_bytes),
            r.recomputed,
            memory::format_bytes(r.recomputed_bytes),
            r.kernels.len()
        )
    };
    println!("compiled plain:        {}", line(&r_plain));
    println!("compiled checkpointed: {}", line(&r_ckpt));
    println!(
        "compiled deep MLP {DEPTH}x Linear({WIDTH},{WIDTH})+ReLU, batch {COMPILED_BATCH}, segments of {SEGMENT} blocks: peak above baseline {} plain, {} checkpointed ({:.2}x)",
        memory::format_bytes(p_plain),
        memory::format_bytes(p_ckpt),
        p_plain as f64 / p_ckpt as f64
    );
    // the checkpointed backward rebuilds each segment's matmuls and ReLUs
    // from the segment's saved input, so it saves less and recomputes more
    assert!(
        r_ckpt.saved_bytes < r_plain.saved_bytes,
        "{r_ckpt:?} vs {r_plain:?}"
    );
    assert!(
        r_ckpt.recomputed > r_plain.recomputed,
        "{r_ckpt:?} vs {r_plain:?}"
    );
    assert!(
        p_ckpt < p_plain,
        "compiled peak {p_ckpt} not below {p_plain}"
    );
}

#[test]
fn compiled_backward_of_a_checkpointed_two_layer_mlp() {
    let _l = lock();
    kiln::manual_seed(5);
    let m = Sequential::new()
        .add(Checkpointed::new(
            Sequential::new()
                .add(Linear::new(4, 8, true).unwrap())
                .add(Activation::relu()),
        ))
        .add(Checkpointed::new(
            Sequential::new()
                .add(Linear::new(8, 3, true).unwrap())
                .add(Activation::relu()),
        ));
    let x = kiln::random::randn(&[2, 4], None);
    let c = kiln::compile::compile(&m);
    let backward = c
        .dump_training(kiln::compile::Stage::Backward, std::slice::from_ref(&x))
        .unwrap();
    // the backward graph runs both layers' matmuls again (their forward
    // values are not saved): 2 recomputed + 2 weight gradients + layer 2's
    // input gradient (x needs none)
    assert_eq!(backward.matches("= matmul(").count(), 5, "{backward}");
    insta::assert_snapshot!(backward);
}

#[test]
fn dropout_inside_a_compiled_checkpoint_runs_eagerly() {
    let _l = lock();
    let x = input();
    let (_, eager) = step(&mlp(6, true, true), &x);
    let m = mlp(6, true, true);
    let c = kiln::compile::compile(&m);
    kiln::manual_seed(7);
    m.zero_grad();
    let y = c.forward(&x).unwrap();
    y.mul(&y)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let report = c.explain().to_string();
    assert!(
        report.contains("random numbers inside a checkpointed segment"),
        "{report}"
    );
    let got: Vec<Vec<u32>> = m
        .parameters()
        .iter()
        .map(|p| {
            p.grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    assert_eq!(got, eager, "the eager fallback replays the dropout masks");
}
