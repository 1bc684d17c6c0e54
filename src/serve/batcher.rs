//! Dynamic batching: requests queue (bounded), inference threads take the
//! first, wait up to `max_queue_delay` for more up to `max_batch_size` rows,
//! run one forward on the merged batch and send each request its rows back.
//! The async runtime's threads only enqueue and await a reply.

use super::config::BatchConfig;
use super::metrics::Metrics;
use super::model::ServableModel;
use crate::Tensor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::oneshot;

/// One output of one request: its dims and row-major f32 values.
pub type OutputRows = Vec<(Vec<usize>, Vec<f32>)>;

/// A request in the queue: its inputs (row-major f32, `rows` along dim 0).
pub struct Job {
    pub inputs: Vec<Vec<f32>>,
    pub rows: usize,
    pub deadline: Instant,
    pub reply: oneshot::Sender<Result<OutputRows, String>>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    QueueFull,
    Closed,
}

struct Queue {
    rx: Receiver<Job>,
    /// A job taken while filling a batch that did not fit: it opens the next.
    carry: Option<Job>,
}

/// The queue and inference threads of one loaded model version.
pub struct Batcher {
    tx: SyncSender<Job>,
    depth: Arc<AtomicUsize>,
    pub config: BatchConfig,
}

impl Batcher {
    /// Starts `config.instance_count` inference threads for `model`.
    pub fn start(
        name: &str,
        model: Arc<dyn ServableModel>,
        config: BatchConfig,
        metrics: Arc<Metrics>,
    ) -> Batcher {
        let (tx, rx) = mpsc::sync_channel(config.queue_capacity);
        let queue = Arc::new(Mutex::new(Queue { rx, carry: None }));
        let depth = Arc::new(AtomicUsize::new(0));
        for i in 0..config.instance_count {
            let (queue, depth, model, metrics) =
                (queue.clone(), depth.clone(), model.clone(), metrics.clone());
            let label = name.to_string();
            std::thread::Builder::new()
                .name(format!("kiln-infer-{name}-{i}"))
                .spawn(move || {
                    while let Some(batch) = next_batch(&queue, &config, &depth) {
                        run_batch(model.as_ref(), batch, &metrics, &label);
                    }
                })
                .expect("spawning an inference thread");
        }
        Batcher { tx, depth, config }
    }

    /// Queues `job`, or says at once why not (full queue: the caller answers 503).
    pub fn submit(&self, job: Job) -> Result<(), Rejected> {
        self.depth.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.depth.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => Rejected::QueueFull,
                    TrySendError::Disconnected(_) => Rejected::Closed,
                })
            }
        }
    }

    /// Requests waiting in the queue.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }
}

/// Blocks for the first job, then gathers more until the batch is full or the
/// delay is spent. `None` when the queue is closed and empty.
fn next_batch(queue: &Mutex<Queue>, cfg: &BatchConfig, depth: &AtomicUsize) -> Option<Vec<Job>> {
    let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
    let first = match q.carry.take() {
        Some(j) => j,
        None => q.rx.recv().ok()?,
    };
    let taken = |depth: &AtomicUsize| depth.fetch_sub(1, Ordering::SeqCst);
    taken(depth);
    let mut rows = first.rows;
    let mut batch = vec![first];
    let until = Instant::now() + cfg.max_queue_delay;
    while cfg.enabled && rows < cfg.max_batch_size {
        let left = until.saturating_duration_since(Instant::now());
        let next = if left.is_zero() {
            match q.rx.try_recv() {
                Ok(j) => j,
                Err(_) => break,
            }
        } else {
            match q.rx.recv_timeout(left) {
                Ok(j) => j,
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        taken(depth);
        if rows + next.rows > cfg.max_batch_size {
            q.carry = Some(next);
            break;
        }
        rows += next.rows;
        batch.push(next);
    }
    Some(batch)
}

fn run_batch(model: &dyn ServableModel, batch: Vec<Job>, metrics: &Metrics, label: &str) {
    let now = Instant::now();
    // A request whose client has stopped waiting is not worth computing.
    let (live, late): (Vec<Job>, Vec<Job>) = batch
        .into_iter()
        .partition(|j| j.deadline > now && !j.reply.is_closed());
    for j in late {
        let _ = j.reply.send(Err("request timed out in the queue".into()));
    }
    if live.is_empty() {
        return;
    }
    let rows: usize = live.iter().map(|j| j.rows).sum();
    metrics.batch(label, rows);
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| forward(model, &live, rows)))
            .unwrap_or_else(|p| Err(format!("the model panicked: {}", panic_text(&p))));
    match result {
        Ok(outputs) => {
            let mut row0 = 0;
            for j in live {
                let part = outputs
                    .iter()
                    .map(|(dims, data)| {
                        let per_row: usize = dims[1..].iter().product();
                        let mut d = dims.clone();
                        d[0] = j.rows;
                        (d, data[row0 * per_row..(row0 + j.rows) * per_row].to_vec())
                    })
                    .collect();
                row0 += j.rows;
                let _ = j.reply.send(Ok(part));
            }
        }
        Err(e) => {
            for j in live {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Concatenates the jobs' inputs along dim 0, runs the model, checks its outputs.
fn forward(model: &dyn ServableModel, jobs: &[Job], rows: usize) -> Result<OutputRows, String> {
    let mut inputs = vec![];
    for (i, spec) in model.inputs().iter().enumerate() {
        let mut data = Vec::new();
        for j in jobs {
            data.extend_from_slice(&j.inputs[i]);
        }
        // only dim 0 is dynamic (the repository checks this at load)
        let mut dims = vec![rows];
        dims.extend(spec.dims[1..].iter().map(|d| d.unwrap_or(0)));
        inputs.push(Tensor::from_vec(data, &dims).map_err(|e| e.to_string())?);
    }
    let outs = model.forward(&inputs).map_err(|e| e.to_string())?;
    if outs.len() != model.outputs().len() {
        return Err(format!(
            "the model returned {} outputs, its metadata names {}",
            outs.len(),
            model.outputs().len()
        ));
    }
    outs.iter()
        .zip(model.outputs())
        .map(|(t, spec)| {
            if t.dims().first() != Some(&rows) {
                return Err(format!(
                    "output `{}` has shape {:?}, not {rows} rows",
                    spec.name,
                    t.dims()
                ));
            }
            let v = t
                .to_dtype(crate::DType::F32)
                .and_then(|t| t.to_vec::<f32>())
                .map_err(|e| e.to_string())?;
            Ok((t.dims().to_vec(), v))
        })
        .collect()
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
