//! `nn.parallel.DistributedDataParallel`: every rank holds a replica of the
//! model, trains it on its own shard of the batch, and the gradients are
//! averaged over the ranks during backward, so every replica takes the same
//! optimizer step.
//!
//! As in PyTorch, the parameters are grouped into buckets of about
//! `bucket_cap_mb` in *reverse* registration order (the order backward
//! produces them); a parameter's post-accumulate-grad hook
//! (`autograd/hooks.rs`) marks it ready, and when all of a bucket's
//! parameters are ready its flattened gradients start an asynchronous
//! all-reduce on the communication thread while backward goes on. Buckets
//! start in index order on every rank (the engines need the same order
//! everywhere). A callback queued for the end of backward waits for the
//! reductions and writes the averaged gradients back, so `loss.backward()`
//! returns with synchronised `.grad`s. The compiled backward delivers its
//! gradients through the same leaf edges, so `compile()`d models fire the
//! same hooks.

use super::group::Work;
use super::{default_group, ProcessGroup, ReduceOp};
use crate::autograd::hooks::{queue_callback, register_post_accumulate_grad_hook, HookHandle};
use crate::autograd::no_grad;
use crate::nn::{Entry, EntryMut, Module, ModuleExt};
use crate::Tensor;
use kiln_ir::{DType, Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Options of [`DistributedDataParallel::new`] (PyTorch's defaults).
#[derive(Clone)]
pub struct DdpOptions {
    /// Bucket size in MiB (25, as PyTorch's `bucket_cap_mb`).
    pub bucket_cap_mb: f64,
    /// Parameters that got no gradient in a backward are reduced as zeros
    /// instead of being an error.
    pub find_unused_parameters: bool,
    /// Broadcast rank 0's buffers (BatchNorm running stats) at every forward.
    pub broadcast_buffers: bool,
    /// The group to average over (default: the default group).
    pub group: Option<ProcessGroup>,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            find_unused_parameters: false,
            broadcast_buffers: true,
            group: None,
        }
    }
}

struct Bucket {
    /// Indices into `Shared::params`, in the order they are flattened.
    params: Vec<usize>,
    numel: usize,
}

#[derive(Default)]
struct Iteration {
    ready: Vec<bool>,
    pending: Vec<usize>,
    next_launch: usize,
    works: Vec<Option<(Work<()>, Tensor)>>,
    finalize_queued: bool,
}

struct Shared {
    group: ProcessGroup,
    params: Vec<(String, Tensor)>,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    find_unused: bool,
    no_sync: AtomicBool,
    iter: Mutex<Iteration>,
}

/// A model replica whose gradients are averaged over the ranks of a group.
///
/// ```no_run
/// use kiln_frontend::distributed::{self as dist, Backend, DdpOptions, DistributedDataParallel};
/// use kiln_frontend::nn::{Linear, Module, ModuleExt};
/// dist::init_process_group(Backend::Mpi)?;
/// let ddp = DistributedDataParallel::new(Linear::new(4, 2, true)?, DdpOptions::default())?;
/// let x = kiln_frontend::Tensor::ones(&[8, 4], kiln_frontend::DType::F32);
/// ddp.forward(&x)?.sum(None, false)?.backward()?; // grads averaged over the ranks
/// {
///     let _acc = ddp.no_sync();                   // accumulate locally
///     ddp.forward(&x)?.sum(None, false)?.backward()?;
/// }
/// # Ok::<(), kiln_frontend::Error>(())
/// ```
pub struct DistributedDataParallel<M: Module> {
    module: M,
    shared: Arc<Shared>,
    broadcast_buffers: bool,
    _hooks: Vec<HookHandle>,
}

/// Disables gradient synchronisation while alive ([`DistributedDataParallel::no_sync`]).
#[must_use = "synchronisation resumes when the guard drops"]
pub struct NoSyncGuard {
    shared: Arc<Shared>,
    prev: bool,
}

impl Drop for NoSyncGuard {
    fn drop(&mut self) {
        self.shared.no_sync.store(self.prev, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// PyTorch's `_DEFAULT_FIRST_BUCKET_BYTES`.
const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// Groups parameters (given in reverse registration order) into buckets of
/// at most `cap` bytes (the first at most 1 MiB), never mixing dtypes; a
/// parameter larger than the cap gets a bucket of its own.
fn make_buckets(params: &[(String, Tensor)], cap: usize) -> Vec<Bucket> {
    let mut out: Vec<Bucket> = vec![];
    let mut bytes = 0usize;
    let mut dtype: Option<DType> = None;
    for i in (0..params.len()).rev() {
        let p = &params[i].1;
        let b = p.numel() * p.dtype().size();
        // As PyTorch: the first bucket holds at most 1 MiB, so the first
        // all-reduce starts early in backward.
        let limit = if out.len() == 1 {
            cap.min(FIRST_BUCKET_BYTES)
        } else {
            cap
        };
        let fits = out
            .last()
            .is_some_and(|_| bytes + b <= limit && dtype == Some(p.dtype()));
        if !fits {
            out.push(Bucket {
                params: vec![],
                numel: 0,
            });
            bytes = 0;
        }
        let last = out.last_mut().expect("pushed");
        last.params.push(i);
        last.numel += p.numel();
        bytes += b;
        dtype = Some(p.dtype());
    }
    out
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module`: broadcasts rank 0's parameters and buffers to every
    /// rank, makes the buckets and registers the gradient hooks.
    pub fn new(module: M, options: DdpOptions) -> Result<DistributedDataParallel<M>> {
        let group = match options.group.clone() {
            Some(g) => g,
            None => default_group()?,
        };
        if !(options.bucket_cap_mb > 0.0) {
            return Err(Error::op(
                "DistributedDataParallel",
                format!(
                    "bucket_cap_mb must be positive, got {}",
                    options.bucket_cap_mb
                ),
            ));
        }
        {
            let _g = no_grad();
            for (_, t) in module.state_dict() {
                group.broadcast(&t, 0)?;
            }
        }
        let params: Vec<(String, Tensor)> = module
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        let cap = (options.bucket_cap_mb * 1024.0 * 1024.0) as usize;
        let buckets = make_buckets(&params, cap.max(1));
        let mut bucket_of = vec![0; params.len()];
        for (b, bk) in buckets.iter().enumerate() {
            for &i in &bk.params {
                bucket_of[i] = b;
            }
        }
        let shared = Arc::new(Shared {
            group,
            params,
            buckets,
            bucket_of,
            find_unused: options.find_unused_parameters,
            no_sync: AtomicBool::new(false),
            iter: Mutex::default(),
        });
        shared.reset(&mut lock(&shared.iter));
        let mut hooks = vec![];
        for i in 0..shared.params.len() {
            let s = shared.clone();
            hooks.push(register_post_accumulate_grad_hook(
                &shared.params[i].1,
                move || Shared::on_ready(&s, i),
            )?);
        }
        Ok(DistributedDataParallel {
            module,
            shared,
            broadcast_buffers: options.broadcast_buffers,
            _hooks: hooks,
        })
    }

    /// Unwraps the model (its hooks are removed).
    pub fn into_inner(self) -> M {
        let DistributedDataParallel { module, _hooks, .. } = self;
        drop(_hooks);
        module
    }

    /// The wrapped model (`ddp.module`).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The group gradients are averaged over.
    pub fn group(&self) -> &ProcessGroup {
        &self.shared.group
    }

    /// The parameter names in each bucket, in bucket order (reverse
    /// registration order), for inspection.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        let s = &self.shared;
        s.buckets
            .iter()
            .map(|b| b.params.iter().map(|&i| s.params[i].0.clone()).collect())
            .collect()
    }

    /// `with ddp.no_sync():` — backward passes accumulate gradients locally
    /// until the guard drops; the next synchronised backward averages the
    /// accumulated sums.
    pub fn no_sync(&self) -> NoSyncGuard {
        let prev = self.shared.no_sync.swap(true, Ordering::SeqCst);
        NoSyncGuard {
            shared: self.shared.clone(),
            prev,
        }
    }

    /// Runs `f` as this replica's forward (e.g. `|x| compiled.forward(x)`
    /// for `compile(ddp.module())`), after the per-forward synchronisation.
    pub fn forward_with(
        &self,
        x: &Tensor,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        self.before_forward()?;
        f(x)
    }

    fn before_forward(&self) -> Result<()> {
        {
            let it = lock(&self.shared.iter);
            if it.next_launch > 0 || it.finalize_queued {
                return Err(Error::op(
                    "DistributedDataParallel",
                    "the previous backward did not finish reducing its gradients (it failed part way); \
                     the replicas may differ now",
                ));
            }
        }
        if self.broadcast_buffers && self.shared.group.world_size() > 1 {
            let _g = no_grad();
            for (_, b) in self.module.named_buffers() {
                self.shared.group.broadcast(&b, 0)?;
            }
        }
        Ok(())
    }
}

impl Shared {
    fn reset(&self, it: &mut Iteration) {
        it.ready = vec![false; self.params.len()];
        it.pending = self.buckets.iter().map(|b| b.params.len()).collect();
        it.next_launch = 0;
        it.works = (0..self.buckets.len()).map(|_| None).collect();
        it.finalize_queued = false;
    }

    /// Parameter `i`'s gradient is complete.
    fn on_ready(this: &Arc<Shared>, i: usize) -> Result<()> {
        if this.no_sync.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut it = lock(&this.iter);
        if !it.finalize_queued {
            let s = this.clone();
            queue_callback(move || Shared::finalize(&s))?;
            it.finalize_queued = true;
        }
        if it.ready[i] {
            return Ok(());
        }
        it.ready[i] = true;
        it.pending[this.bucket_of[i]] -= 1;
        this.launch_ready(&mut it)
    }

    /// Starts every bucket that is complete and whose predecessors started.
    fn launch_ready(&self, it: &mut Iteration) -> Result<()> {
        while it.next_launch < self.buckets.len() && it.pending[it.next_launch] == 0 {
            let b = it.next_launch;
            let bucket = &self.buckets[b];
            let flat = {
                let _g = no_grad();
                let parts: Vec<Tensor> = bucket
                    .params
                    .iter()
                    .map(|&i| {
                        let p = &self.params[i].1;
                        match p.grad() {
                            Some(g) => g.reshape_dims(&[p.numel()]),
                            None => Ok(Tensor::zeros_on(&[p.numel()], p.dtype(), p.device())?),
                        }
                    })
                    .collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                Tensor::cat(&refs, 0)?
            };
            let work = self.group.all_reduce_async(&flat, ReduceOp::Sum)?;
            it.works[b] = Some((work, flat));
            it.next_launch += 1;
        }
        Ok(())
    }

    /// End of backward: reduces what is left, waits, writes the averages.
    fn finalize(this: &Arc<Shared>) -> Result<()> {
        let mut it = lock(&this.iter);
        let unused: Vec<usize> = (0..this.params.len()).filter(|&i| !it.ready[i]).collect();
        if !unused.is_empty() {
            if !this.find_unused {
                let names: Vec<&str> = unused.iter().map(|&i| this.params[i].0.as_str()).collect();
                let started = it.next_launch;
                // wait for what started so no buffer is freed under the engine
                let works: Vec<_> = it.works.iter_mut().filter_map(|w| w.take()).collect();
                this.reset(&mut it);
                for (w, _) in works {
                    let _ = w.wait();
                }
                return Err(Error::op(
                    "DistributedDataParallel",
                    format!(
                        "parameters that received no gradient in this backward: {} \
                         ({started} of {} buckets had started); make every parameter take part in \
                         the loss, or pass find_unused_parameters: true",
                        names.join(", "),
                        this.buckets.len()
                    ),
                ));
            }
            for &i in &unused {
                it.ready[i] = true;
                it.pending[this.bucket_of[i]] -= 1;
            }
            this.launch_ready(&mut it)?;
        }
        let works: Vec<_> = it.works.iter_mut().map(|w| w.take()).collect();
        this.reset(&mut it);
        drop(it);
        let world = this.group.world_size() as f64;
        let _g = no_grad();
        for (b, w) in works.into_iter().enumerate() {
            let Some((work, flat)) = w else {
                return Err(Error::op(
                    "DistributedDataParallel",
                    format!("bucket {b} never started its all-reduce"),
                ));
            };
            work.wait()?;
            let avg = flat.div(&Tensor::scalar(world).to_dtype(flat.dtype())?)?;
            let mut off = 0;
            for &i in &this.buckets[b].params {
                let p = &this.params[i].1;
                let g = avg
                    .narrow(0, off as i64, p.numel())?
                    .reshape_dims(p.dims())?;
                off += p.numel();
                p.set_grad(Some(g));
            }
        }
        Ok(())
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.before_forward()?;
        self.module.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("module", &self.module))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Child("module", &mut self.module))
    }
    fn describe(&self) -> String {
        format!(
            "DistributedDataParallel(world_size={}, buckets={})",
            self.shared.group.world_size(),
            self.shared.buckets.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_reverse_order_and_the_cap() {
        let p = |n: usize| Tensor::zeros(&[n], DType::F32);
        let params: Vec<(String, Tensor)> = [("a", 10), ("b", 300), ("c", 20), ("d", 30)]
            .iter()
            .map(|(k, n)| (k.to_string(), p(*n)))
            .collect();
        // cap of 200 bytes = 50 floats: d+c fit (50), b alone (too big), a
        let b = make_buckets(&params, 200);
        let order: Vec<Vec<usize>> = b.iter().map(|b| b.params.clone()).collect();
        assert_eq!(order, vec![vec![3, 2], vec![1], vec![0]]);
        assert_eq!(b[0].numel, 50);
        // the first bucket stops at 1 MiB even under a 25 MiB cap
        let big: Vec<(String, Tensor)> = [("w0", 300_000), ("w1", 200_000), ("w2", 200_000)]
            .iter()
            .map(|(k, n)| (k.to_string(), p(*n)))
            .collect();
        let b = make_buckets(&big, 25 << 20);
        let order: Vec<Vec<usize>> = b.iter().map(|b| b.params.clone()).collect();
        assert_eq!(order, vec![vec![2], vec![1, 0]]);
    }
}
