//! Memory accounting (`kiln::memory`) and the classic training-loop leak.
//!
//! The counters are process-wide, hence this test binary of its own, and
//! its tests run one at a time (`LOCK`).
//!
//! What keeps memory alive in kiln's autograd (as in PyTorch): a tensor made
//! by a recorded op holds its `grad_fn` node, the node holds the backward
//! closure, and the closure holds the tensors saved for backward (the
//! activations). `backward()` without `retain_graph` drops every closure it
//! ran, so after it only the nodes' metadata (no storage) stays reachable.
//! Hence two faces of the leak, both measured below:
//! * a training loop that keeps every step's loss *tensor* (a `Vec<Tensor>`,
//!   or `total_loss = total_loss + loss`) grows every step, but only by the
//!   scalars it keeps: the graph was freed by `backward()`;
//! * a graph that is never backwarded (a monitoring/validation loss computed
//!   in the training loop without `no_grad`) keeps all its saved activations:
//!   memory grows by tens of KiB every step. Keeping `loss.item()` instead is
//!   flat; `loss.detach()` keeps only the value (one scalar).

use kiln::memory::{self, MemoryStats};
use kiln::nn::{Linear, Module, ModuleExt};
use kiln::optim::{Optimizer, SgdConfig, SGD};
use kiln::{autograd, functional as F, ClassLossOpts, DType, Tensor};
use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const BATCH: usize = 64;
const HIDDEN: usize = 256;
/// Bytes of one hidden activation (f32), what a kept graph saves at least once.
const HIDDEN_BYTES: usize = BATCH * HIDDEN * 4;

/// A 64-256-10 MLP trained with SGD (momentum 0.9) on one fixed batch.
struct Run {
    l1: Linear,
    l2: Linear,
    opt: SGD,
    x: Tensor,
    y: Tensor,
}

impl Run {
    fn new() -> Run {
        kiln::manual_seed(0);
        let l1 = Linear::new(64, HIDDEN, true).unwrap();
        let l2 = Linear::new(HIDDEN, 10, true).unwrap();
        let mut params = l1.parameters();
        params.extend(l2.parameters());
        let cfg = SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            ..SgdConfig::default()
        };
        let opt = SGD::with_params(params, cfg).unwrap();
        let x = kiln::random::randn(&[BATCH, 64], None);
        let y: Vec<i64> = (0..BATCH as i64).map(|i| i % 10).collect();
        let y = Tensor::from_vec(y, &[BATCH]).unwrap();
        Run { l1, l2, opt, x, y }
    }

    fn loss(&self) -> Tensor {
        let h = self.l1.forward(&self.x).unwrap().relu().unwrap();
        let logits = self.l2.forward(&h).unwrap();
        F::cross_entropy(&logits, &self.y, None, ClassLossOpts::default()).unwrap()
    }

    /// zero_grad, forward, backward, step; returns the loss tensor (with its graph).
    fn train_step(&mut self) -> Tensor {
        self.opt.zero_grad();
        let loss = self.loss();
        loss.backward().unwrap();
        self.opt.step().unwrap();
        loss
    }
}

/// `memory_allocated()` after each of `steps` calls of `step`, minus the value
/// before the first one: the growth per step.
fn growth(steps: usize, mut step: impl FnMut()) -> Vec<isize> {
    let mut last = memory::memory_allocated() as isize;
    (0..steps)
        .map(|_| {
            step();
            let now = memory::memory_allocated() as isize;
            let d = now - last;
            last = now;
            d
        })
        .collect()
}

#[test]
fn training_loop_that_keeps_loss_tensors_grows_every_step_item_is_flat() {
    let _g = lock();
    let mut run = Run::new();
    run.train_step(); // warm-up: gradients and momentum buffers come to life
    let scalar = 4; // one f32 loss

    // `losses.push(loss)`: backward freed the saved activations, so each step
    // keeps exactly its loss scalar (plus storage-less graph nodes).
    let mut losses: Vec<Tensor> = vec![];
    let d = growth(6, || losses.push(run.train_step()));
    assert!(d.iter().all(|&d| d == scalar), "Vec<Tensor>: {d:?}");
    assert!(losses.iter().all(|l| l.grad_fn().is_some()));

    // `total_loss = total_loss + loss` (PyTorch's FAQ example): the sum's graph
    // chains every step, but AddBackward saves no tensors (as in PyTorch), so
    // only graph nodes accumulate, no tensor storage; the real growth is the
    // never-backwarded graph of the next test.
    let mut total = Tensor::zeros(&[], DType::F32);
    let d = growth(6, || total = total.add(&run.train_step()).unwrap());
    assert!(d.iter().all(|&d| d == 0), "total_loss + loss: {d:?}");
    assert!(
        total.grad_fn().is_some(),
        "the running total still carries the chained graph"
    );

    drop((losses, total));
    let mut values: Vec<f64> = vec![];
    let d = growth(6, || values.push(run.train_step().item().unwrap()));
    assert!(d.iter().all(|&d| d == 0), "Vec<f64> of loss.item(): {d:?}");
    assert!(values[5] < values[0], "it trains: {values:?}");
}

#[test]
fn a_kept_graph_that_was_never_backwarded_keeps_its_activations() {
    let _g = lock();
    let mut run = Run::new();
    // each step trains, then logs a "validation" loss computed with grad
    // enabled (the missing `no_grad`): its graph is never backwarded
    let mut step = |keep: &mut dyn FnMut(Tensor)| {
        run.train_step();
        keep(run.loss());
    };
    step(&mut |_| {}); // warm-up

    let mut kept: Vec<Tensor> = vec![];
    let d = growth(5, || step(&mut |l| kept.push(l)));
    assert!(
        d.iter().all(|&d| d >= HIDDEN_BYTES as isize),
        "Vec<Tensor>: {d:?}"
    );
    let leaked = memory::memory_allocated();
    drop(kept);
    assert!(
        memory::memory_allocated() + 5 * HIDDEN_BYTES <= leaked,
        "dropping the losses frees their graphs"
    );

    let mut detached: Vec<Tensor> = vec![];
    let d = growth(5, || step(&mut |l| detached.push(l.detach())));
    assert!(d.iter().all(|&d| d == 4), "Vec of loss.detach(): {d:?}");

    let mut values: Vec<f64> = vec![];
    let d = growth(5, || step(&mut |l| values.push(l.item().unwrap())));
    assert!(d.iter().all(|&d| d == 0), "Vec of loss.item(): {d:?}");

    // the fix PyTorch users know: evaluate under no_grad
    let mut under_no_grad: Vec<Tensor> = vec![];
    let d = growth(5, || {
        run.train_step();
        let _ng = autograd::no_grad();
        under_no_grad.push(run.loss());
    });
    assert!(d.iter().all(|&d| d == 4), "no_grad: {d:?}");
}

#[test]
fn peak_reset_reserved_and_summary() {
    let _g = lock();
    let base = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    assert_eq!(memory::max_memory_allocated(), base);

    let mib = 1 << 20;
    let big = Tensor::zeros(&[mib / 4], DType::F32);
    assert_eq!(memory::memory_allocated(), base + mib);
    assert!(memory::memory_reserved() >= base + mib);
    drop(big);
    assert_eq!(memory::memory_allocated(), base);
    let small = Tensor::zeros(&[mib / 16], DType::F32);
    assert_eq!(
        memory::max_memory_allocated(),
        base + mib,
        "the peak remembers the freed MiB"
    );

    // the freed MiB sits in the caching allocator, and serves the next request
    let st = memory::memory_stats();
    assert!(st.cached >= mib && st.reserved >= st.allocated + st.cached);
    assert!(st
        .cached_blocks
        .iter()
        .any(|&(size, n)| size == mib && n >= 1));
    let hits = st.pool_hits;
    let again = Tensor::zeros(&[mib / 4], DType::F32);
    assert_eq!(memory::memory_stats().pool_hits, hits + 1);
    assert!(memory::max_memory_allocated() >= base + mib + mib / 4);
    drop(again);

    memory::reset_peak_memory_stats();
    assert_eq!(memory::max_memory_allocated(), base + mib / 4);

    let st: MemoryStats = memory::memory_stats();
    assert_eq!(st.allocated, base + mib / 4);
    assert!(st.live_storages >= 1 && st.allocations >= st.frees + st.live_storages);
    let summary = memory::memory_summary();
    for want in [
        format!("({} bytes)", st.allocated),
        format!("({} bytes)", st.peak),
        format!("({} bytes)", st.reserved),
        format!("{:>8} |", st.live_storages),
        "Live tensors (storages)".to_string(),
        "Pool hits".to_string(),
        "1.00 MiB".to_string(),
    ] {
        assert!(summary.contains(&want), "{want:?} missing from\n{summary}");
    }
    assert_eq!(memory::Device::Cpu.memory_summary(), summary);
    drop(small);
}

#[test]
fn a_compiled_closure_keeps_its_plan_not_its_traced_values() {
    let _g = lock();
    let _ng = autograd::no_grad();
    let x = kiln::bench::randn(&[256, 1024], 1);
    let w = kiln::bench::randn(&[1024, 1024], 2);
    let mib = 1 << 20;
    let base = memory::memory_allocated();
    // eight results of 1 MiB each when traced (a matmul, a softmax, pointwise ops)
    let f = kiln::compile::compile_fn("traced", |t: &[Tensor]| {
        let h = F::matmul(&t[0], &w)?.softmax(-1)?;
        let g = (&(&h * 2.0) + 1.0).exp()?.sqrt()?;
        Ok(vec![(&g + &t[0]).relu()?.sum(Some(&[1]), false)?])
    });
    drop(f.call(&[x.clone()]).unwrap());
    let held = memory::memory_allocated() - base;
    // the compile_fn replay script keeps stand-ins, not the traced values
    assert!(held < 2 * mib, "held {held} bytes after the first call");
    drop(f.call(&[x.clone()]).unwrap());
    assert!(memory::memory_allocated() - base < 2 * mib);
}
