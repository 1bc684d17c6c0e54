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

#[test]
fn checkpointed_model_composes_with_compile() {
    let _l = lock();
    let x = input();
    let eager = mlp(4, true, false);
    let (_, g_eager) = step(&eager, &x);
    let model = mlp(4, true, false);
    let compiled = kiln::compile::compile(&model);
    model.zero_grad();
    let y = compiled.forward(&x).unwrap();
    let loss = y.mul(&y).unwrap().sum(None, false).unwrap();
    loss.backward().unwrap();
    for (i, (p, want)) in model.parameters().iter().zip(&g_eager).enumerate() {
        let got = p.grad().unwrap().to_vec::<f32>().unwrap();
        for (a, &b) in got.iter().zip(want) {
            let b = f32::from_bits(b);
            assert!(
                (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                "param {i}: {a} vs {b}"
            );
        }
    }
    // What the compiled graph saves, next to the compiled plain model's: the
    // passes merge the recomputed ops with the forward ones, so the
    // partitioner's own choice of what to save decides (see README).
    let plain = mlp(4, false, false);
    let cp = kiln::compile::compile(&plain);
    let y = cp.forward(&x).unwrap();
    y.mul(&y)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let saved = |r: String| {
        r.lines()
            .filter(|l| l.contains("saved for backward") || l.contains("kernels"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!(
        "compiled checkpointed: {}",
        saved(compiled.explain().to_string())
    );
    println!("compiled plain:        {}", saved(cp.explain().to_string()));
}
