//! The loading work itself ([`Fetcher`]: indices -> samples -> transform ->
//! collate) and the worker threads that run it ([`WorkerPool`]).
//!
//! Batch `i` of an epoch always goes to worker `i % num_workers`, and each
//! worker handles its batches in order, so a worker's RNG stream is consumed
//! the same way on every run; the loader reorders results by batch index.

use super::loader::{Batch, CollateFn, TransformFn, WorkerContext};
use super::Dataset;
use crate::random::Generator;
use crate::Tensor;
use kiln_ir::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// Tags for [`Generator::derive`]: one stream per purpose.
pub(crate) const TAG_SHUFFLE: u64 = 0;
pub(crate) const TAG_WORKER: u64 = 1;
pub(crate) const TAG_BATCH: u64 = 2;

/// Everything needed to build the batches of one epoch.
#[derive(Clone)]
pub(crate) struct Fetcher {
    pub dataset: Arc<dyn Dataset>,
    pub collate: Arc<CollateFn>,
    pub transform: Option<Arc<TransformFn>>,
    /// `Generator::new(loader seed)`: every stream of the epoch derives from it.
    pub base: Generator,
    pub epoch: u64,
    pub per_batch_rng: bool,
    /// Copy each collated batch into pinned memory.
    pub pin_memory: bool,
}

impl Fetcher {
    /// The context worker `id` starts the epoch with.
    pub fn context(&self, id: usize, num_workers: usize) -> WorkerContext {
        WorkerContext {
            id,
            num_workers,
            epoch: self.epoch,
            rng: self.base.derive(&[TAG_WORKER, self.epoch, id as u64]),
        }
    }

    /// Loads batch `idx` (the samples at `indices`).
    pub fn fetch(&self, idx: usize, indices: &[usize], ctx: &mut WorkerContext) -> Result<Batch> {
        if self.per_batch_rng {
            ctx.rng = self.base.derive(&[TAG_BATCH, self.epoch, idx as u64]);
        }
        // every failure says which sample, batch and worker it came from
        let whose = |ctx: &WorkerContext| match ctx.num_workers {
            0 => "the main thread (num_workers = 0)".to_string(),
            n => format!("worker {} of {n}", ctx.id),
        };
        let wrap = |what: String, e: Error| Error::op("DataLoader", format!("{what}: {e}"));
        let mut samples = Vec::with_capacity(indices.len());
        for (pos, &i) in indices.iter().enumerate() {
            let at = |ctx: &WorkerContext| {
                format!(
                    "dataset index {i} (position {pos} of batch {idx}, epoch {}, in {})",
                    self.epoch,
                    whose(ctx)
                )
            };
            let s = self
                .dataset
                .get(i)
                .map_err(|e| wrap(format!("loading {}", at(ctx)), e))?;
            samples.push(match &self.transform {
                Some(t) => t(s, ctx).map_err(|e| wrap(format!("transforming {}", at(ctx)), e))?,
                None => s,
            });
        }
        let batch = (self.collate)(samples).map_err(|e| {
            wrap(
                format!(
                    "collating batch {idx} (dataset indices {indices:?}, in {})",
                    whose(ctx)
                ),
                e,
            )
        })?;
        if !self.pin_memory {
            return Ok(batch);
        }
        batch.iter().map(Tensor::pin_memory).collect()
    }
}

enum Msg {
    /// Start epoch `gen` with this fetcher (resets the worker's context).
    Epoch { fetcher: Box<Fetcher> },
    Batch {
        gen: u64,
        idx: usize,
        indices: Vec<usize>,
    },
}

/// A finished batch: (generation, batch index, result).
type Done = (u64, usize, Result<Batch>);

/// `num_workers` threads fed round-robin; results come back on one channel.
pub(crate) struct WorkerPool {
    senders: Vec<mpsc::Sender<Msg>>,
    results: mpsc::Receiver<Done>,
    handles: Vec<JoinHandle<()>>,
    /// The generation being served; workers skip jobs of older ones.
    current: Arc<AtomicU64>,
    gen: u64,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn worker_loop(
    id: usize,
    num_workers: usize,
    jobs: mpsc::Receiver<Msg>,
    done: mpsc::Sender<Done>,
    current: Arc<AtomicU64>,
) {
    let mut state: Option<(Box<Fetcher>, WorkerContext)> = None;
    while let Ok(msg) = jobs.recv() {
        match msg {
            Msg::Epoch { fetcher } => {
                let ctx = fetcher.context(id, num_workers);
                state = Some((fetcher, ctx));
            }
            Msg::Batch { gen, idx, indices } => {
                if gen != current.load(Ordering::Acquire) {
                    continue; // the iterator that asked was dropped
                }
                let Some((f, ctx)) = state.as_mut() else {
                    continue;
                };
                let r = catch_unwind(AssertUnwindSafe(|| f.fetch(idx, &indices, ctx)))
                    .unwrap_or_else(|p| {
                        Err(Error::op(
                            "DataLoader",
                            format!(
                                "worker {id} panicked while loading batch {idx}: {}",
                                panic_message(p.as_ref())
                            ),
                        ))
                    });
                if done.send((gen, idx, r)).is_err() {
                    return;
                }
            }
        }
    }
}

impl WorkerPool {
    pub fn new(num_workers: usize) -> Result<WorkerPool> {
        let (done_tx, results) = mpsc::channel();
        let current = Arc::new(AtomicU64::new(0));
        let mut senders = Vec::with_capacity(num_workers);
        let mut handles = Vec::with_capacity(num_workers);
        for id in 0..num_workers {
            let (tx, rx) = mpsc::channel();
            let (done, cur) = (done_tx.clone(), current.clone());
            let h = std::thread::Builder::new()
                .name(format!("kiln-data-{id}"))
                .spawn(move || worker_loop(id, num_workers, rx, done, cur))
                .map_err(|e| Error::op("DataLoader", format!("cannot start worker {id}: {e}")))?;
            senders.push(tx);
            handles.push(h);
        }
        Ok(WorkerPool {
            senders,
            results,
            handles,
            current,
            gen: 0,
        })
    }

    pub fn num_workers(&self) -> usize {
        self.senders.len()
    }

    /// Starts a new epoch; results of earlier epochs are ignored from now on.
    pub fn start_epoch(&mut self, fetcher: &Fetcher) -> u64 {
        self.gen += 1;
        self.current.store(self.gen, Ordering::Release);
        for s in &self.senders {
            let _ = s.send(Msg::Epoch {
                fetcher: Box::new(fetcher.clone()),
            });
        }
        self.gen
    }

    /// Queues batch `idx` on worker `idx % num_workers`.
    pub fn submit(&self, idx: usize, indices: Vec<usize>) {
        let w = idx % self.senders.len();
        let _ = self.senders[w].send(Msg::Batch {
            gen: self.gen,
            idx,
            indices,
        });
    }

    /// The next finished batch of the current epoch (older ones are dropped).
    pub fn receive(&self) -> Result<(usize, Result<Batch>)> {
        loop {
            match self.results.recv() {
                Ok((g, idx, r)) if g == self.gen => return Ok((idx, r)),
                Ok(_) => continue,
                Err(_) => {
                    return Err(Error::op(
                        "DataLoader",
                        "all worker threads exited unexpectedly",
                    ))
                }
            }
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.current.store(u64::MAX, Ordering::Release);
        self.senders.clear(); // closes the job channels: workers return
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
