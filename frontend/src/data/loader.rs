//! [`DataLoader`]: batches of a [`Dataset`], shuffled from a seed, collated,
//! optionally loaded by worker threads.
//!
//! Reproducibility contract:
//! * The loader has one 64-bit seed: [`DataLoader::seed`], or drawn from a
//!   [`Generator`] ([`DataLoader::generator`]), or else drawn from the default
//!   generator when the loader is built (so `manual_seed` fixes it).
//! * Epoch `e`'s order is a permutation from the stream derived from
//!   `(seed, e)`; each `iter()` advances the epoch, so every epoch reshuffles,
//!   and [`DataLoader::set_epoch`] / [`DataLoader::iter_epoch`] replay any
//!   epoch (e.g. after resuming from a checkpoint).
//! * Batch order and content are the same whatever `num_workers` is: workers
//!   load batches by index and results are yielded in index order.
//! * The per-sample transform gets a [`WorkerContext`] whose `rng` is the
//!   worker's own stream, derived from `(seed, epoch, worker id)`: streams differ
//!   across workers and epochs and repeat across runs. With
//!   [`DataLoader::per_batch_rng`] the stream is instead derived from
//!   `(seed, epoch, batch index)`, which makes augmented batches identical
//!   whatever `num_workers` is.
//!
//! ```
//! use kiln_frontend::data::{DataLoader, TensorDataset};
//! use kiln_frontend::{random, DType, Tensor};
//! let ds = TensorDataset::new(vec![Tensor::arange(10, DType::I64)]).unwrap();
//! random::manual_seed(42);
//! let a = DataLoader::new(ds.clone(), 3).shuffle(true);
//! random::manual_seed(42);
//! let mut b = DataLoader::new(ds, 3).shuffle(true).num_workers(2);
//! assert_eq!(a.initial_seed(), b.initial_seed());
//! assert_eq!(a.batch_indices(0), b.batch_indices(0));
//! assert_eq!(b.iter().count(), 4);
//! ```

use super::workers::{Fetcher, WorkerPool, TAG_SHUFFLE};
use super::{Dataset, Sample};
use crate::random::{default_generator, Generator};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// A collated batch: one tensor per sample field (e.g. `[images, labels]`).
pub type Batch = Vec<Tensor>;

pub(crate) type CollateFn = dyn Fn(Vec<Sample>) -> Result<Batch> + Send + Sync;
pub(crate) type TransformFn = dyn Fn(Sample, &mut WorkerContext) -> Result<Sample> + Send + Sync;

/// What a per-sample transform sees (`torch.utils.data.get_worker_info()` plus
/// the worker's generator).
#[derive(Clone, Debug)]
pub struct WorkerContext {
    /// Worker index (0 when loading on the calling thread).
    pub id: usize,
    /// Number of worker threads (0 when loading on the calling thread).
    pub num_workers: usize,
    pub epoch: u64,
    /// This worker's reproducible stream (see the module docs).
    pub rng: Generator,
}

/// PyTorch's `default_collate` for tensors: field `j` of the batch is
/// `stack([s[j] for s in samples])`.
pub fn default_collate(samples: Vec<Sample>) -> Result<Batch> {
    let Some(first) = samples.first() else {
        bail!("collate", "cannot collate an empty batch");
    };
    let fields = first.len();
    for (k, s) in samples.iter().enumerate() {
        if s.len() != fields {
            bail!(
                "collate",
                "sample {k} has {} fields but sample 0 has {fields}",
                s.len()
            );
        }
    }
    (0..fields)
        .map(|j| {
            let col: Vec<&Tensor> = samples.iter().map(|s| &s[j]).collect();
            Tensor::stack(&col, 0).map_err(|e| {
                Error::op(
                    "collate",
                    format!(
                        "field {j} (sample 0 has shape {}): {e}",
                        fmt_dims(col[0].dims())
                    ),
                )
            })
        })
        .collect()
}

/// `torch.utils.data.DataLoader` (map-style datasets).
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    shuffle: bool,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    persistent_workers: bool,
    per_batch_rng: bool,
    pin_memory: bool,
    seed: u64,
    epoch: u64,
    collate: Arc<CollateFn>,
    transform: Option<Arc<TransformFn>>,
    pool: Option<WorkerPool>,
}

impl DataLoader {
    /// A loader yielding batches of `batch_size` in dataset order, on the
    /// calling thread; the builder methods below change that.
    pub fn new<D: Dataset + 'static>(dataset: D, batch_size: usize) -> DataLoader {
        DataLoader {
            dataset: Arc::new(dataset),
            batch_size,
            shuffle: false,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            persistent_workers: false,
            per_batch_rng: false,
            pin_memory: false,
            seed: default_generator().fork_seed(),
            epoch: 0,
            collate: Arc::new(default_collate),
            transform: None,
            pool: None,
        }
    }

    /// Reshuffle every epoch (`shuffle=True`).
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// Drop the last batch if it is smaller than `batch_size`.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// Worker threads (0: load on the calling thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }
    /// Batches loaded ahead per worker (at most `num_workers * k` in flight).
    pub fn prefetch_factor(mut self, k: usize) -> Self {
        self.prefetch_factor = k;
        self
    }
    /// Keep worker threads alive between epochs.
    pub fn persistent_workers(mut self, on: bool) -> Self {
        self.persistent_workers = on;
        self
    }
    /// The seed of every stream this loader uses.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Takes the loader's seed from `gen` (advancing it), like `generator=g`.
    pub fn generator(mut self, gen: &mut Generator) -> Self {
        self.seed = gen.fork_seed();
        self
    }
    /// Derive the transform's stream per batch instead of per worker.
    pub fn per_batch_rng(mut self, on: bool) -> Self {
        self.per_batch_rng = on;
        self
    }
    /// Return batches in pinned host memory (`pin_memory=True`), ready for
    /// [`Tensor::to_device_non_blocking`]; the workers (or the calling
    /// thread) pin each collated batch. Without a CUDA device this warns
    /// once and batches stay in ordinary memory, as PyTorch's loader does.
    pub fn pin_memory(mut self, on: bool) -> Self {
        self.pin_memory = on;
        self
    }
    /// A custom `collate_fn`.
    pub fn collate(
        mut self,
        f: impl Fn(Vec<Sample>) -> Result<Batch> + Send + Sync + 'static,
    ) -> Self {
        self.collate = Arc::new(f);
        self
    }
    /// A per-sample transform (augmentation), run in the workers before collate.
    pub fn transform(
        mut self,
        f: impl Fn(Sample, &mut WorkerContext) -> Result<Sample> + Send + Sync + 'static,
    ) -> Self {
        self.transform = Some(Arc::new(f));
        self
    }

    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }
    /// The epoch the next [`DataLoader::iter`] yields.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Number of batches per epoch (`len(loader)`).
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        match (self.batch_size, self.drop_last) {
            (0, _) => 0,
            (b, true) => n / b,
            (b, false) => n.div_ceil(b),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sample indices of each batch of `epoch` (the sampler's output).
    pub fn batch_indices(&self, epoch: u64) -> Vec<Vec<usize>> {
        let n = self.dataset.len();
        let order: Vec<usize> = if self.shuffle {
            Generator::new(self.seed)
                .derive(&[TAG_SHUFFLE, epoch])
                .permutation(n)
        } else {
            (0..n).collect()
        };
        let mut out: Vec<Vec<usize>> = order
            .chunks(self.batch_size.max(1))
            .map(|c| c.to_vec())
            .collect();
        if self.drop_last && out.last().is_some_and(|b| b.len() < self.batch_size) {
            out.pop();
        }
        out
    }

    fn check(&self) -> Result<()> {
        if self.batch_size == 0 {
            bail!("DataLoader", "batch_size must be positive, got 0");
        }
        if self.num_workers > 0 && self.prefetch_factor == 0 {
            bail!(
                "DataLoader",
                "prefetch_factor must be positive with num_workers = {}",
                self.num_workers
            );
        }
        Ok(())
    }

    /// The batches of the current epoch; advances the epoch.
    pub fn iter(&mut self) -> Batches<'_> {
        let e = self.epoch;
        self.iter_epoch(e)
    }

    /// The batches of `epoch` (the next `iter()` yields `epoch + 1`).
    pub fn iter_epoch(&mut self, epoch: u64) -> Batches<'_> {
        self.epoch = epoch + 1;
        if let Err(e) = self.check() {
            return Batches::failed(e);
        }
        let jobs: VecDeque<(usize, Vec<usize>)> =
            self.batch_indices(epoch).into_iter().enumerate().collect();
        let fetcher = Fetcher {
            dataset: self.dataset.clone(),
            collate: self.collate.clone(),
            transform: self.transform.clone(),
            base: Generator::new(self.seed),
            epoch,
            per_batch_rng: self.per_batch_rng,
            pin_memory: self.pin_memory && pinning_available(),
        };
        if self.num_workers == 0 {
            self.pool = None;
            let ctx = fetcher.context(0, 0);
            return Batches::new(jobs, Mode::Inline(Box::new((fetcher, ctx))));
        }
        let in_flight = self.num_workers * self.prefetch_factor;
        let pool = if self.persistent_workers {
            if self.pool.as_ref().map(|p| p.num_workers()) != Some(self.num_workers) {
                self.pool = None; // joins the old threads first
                match WorkerPool::new(self.num_workers) {
                    Ok(p) => self.pool = Some(p),
                    Err(e) => return Batches::failed(e),
                }
            }
            PoolRef::Shared(self.pool.as_mut().expect("just made"))
        } else {
            self.pool = None;
            match WorkerPool::new(self.num_workers) {
                Ok(p) => PoolRef::Owned(p),
                Err(e) => return Batches::failed(e),
            }
        };
        let mut b = Batches::new(
            jobs,
            Mode::Pool {
                pool,
                ready: BTreeMap::new(),
            },
        );
        if let Mode::Pool { pool, .. } = &mut b.mode {
            pool.get().start_epoch(&fetcher);
        }
        for _ in 0..in_flight {
            b.submit_one();
        }
        b
    }
}

/// Whether pinned memory can be had; warns when it cannot.
fn pinning_available() -> bool {
    match kiln_runtime::Device::cuda(0) {
        Ok(_) => true,
        Err(e) => {
            crate::warnings::warn(&format!(
                "DataLoader: pin_memory is set but there is no CUDA device, so batches \
                 are not pinned ({e})"
            ));
            false
        }
    }
}

impl<'a> IntoIterator for &'a mut DataLoader {
    type Item = Result<Batch>;
    type IntoIter = Batches<'a>;
    fn into_iter(self) -> Batches<'a> {
        self.iter()
    }
}

enum PoolRef<'a> {
    Owned(WorkerPool),
    Shared(&'a mut WorkerPool),
}

impl PoolRef<'_> {
    fn get(&mut self) -> &mut WorkerPool {
        match self {
            PoolRef::Owned(p) => p,
            PoolRef::Shared(p) => p,
        }
    }
}

enum Mode<'a> {
    /// Loading on the calling thread (boxed: a generator is large).
    Inline(Box<(Fetcher, WorkerContext)>),
    Pool {
        pool: PoolRef<'a>,
        ready: BTreeMap<usize, Result<Batch>>,
    },
    Failed(Option<Error>),
}

/// The iterator over one epoch's batches (`Item = Result<Batch>`), in batch order.
pub struct Batches<'a> {
    /// Batches not yet handed to a worker (or loaded inline).
    jobs: VecDeque<(usize, Vec<usize>)>,
    total: usize,
    next: usize,
    mode: Mode<'a>,
}

impl<'a> Batches<'a> {
    fn new(jobs: VecDeque<(usize, Vec<usize>)>, mode: Mode<'a>) -> Self {
        Batches {
            total: jobs.len(),
            jobs,
            next: 0,
            mode,
        }
    }

    fn failed(e: Error) -> Self {
        Batches {
            jobs: VecDeque::new(),
            total: 0,
            next: 0,
            mode: Mode::Failed(Some(e)),
        }
    }

    fn submit_one(&mut self) {
        if let Mode::Pool { pool, .. } = &mut self.mode {
            if let Some((idx, indices)) = self.jobs.pop_front() {
                pool.get().submit(idx, indices);
            }
        }
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if let Mode::Failed(e) = &mut self.mode {
            return e.take().map(Err);
        }
        if self.next >= self.total {
            return None;
        }
        let want = self.next;
        self.next += 1;
        let out = match &mut self.mode {
            Mode::Inline(inline) => {
                let (fetcher, ctx) = &mut **inline;
                let (idx, indices) = self.jobs.pop_front().expect("one job per batch");
                fetcher.fetch(idx, &indices, ctx)
            }
            Mode::Pool { pool, ready } => loop {
                if let Some(r) = ready.remove(&want) {
                    break r;
                }
                match pool.get().receive() {
                    Ok((idx, r)) => {
                        ready.insert(idx, r);
                    }
                    Err(e) => {
                        self.next = self.total;
                        break Err(e);
                    }
                }
            },
            Mode::Failed(_) => unreachable!("handled above"),
        };
        self.submit_one();
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.mode {
            Mode::Failed(e) => usize::from(e.is_some()),
            _ => self.total - self.next,
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches<'_> {}
