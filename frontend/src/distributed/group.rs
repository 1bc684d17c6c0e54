//! A process group: one communication thread per process that owns the
//! backend (MPI or NCCL) and runs the collectives in the order they were
//! submitted — the same order on every rank, as both engines require — while
//! the submitting thread goes on computing. Each collective runs
//! non-blocking and is polled against a deadline, so a dead or stuck peer is
//! an error on every other rank, never a hang; after one the group is
//! broken and every later collective fails at once with the first error.

use super::{Backend, ReduceOp};
use crate::Tensor;
use kiln_ir::{Error, Result};
use kiln_runtime::profiler::{self, Category};
use kiln_runtime::Device;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One collective as the backend runs it (`Avg` is a `Sum` plus a division
/// done by the caller).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
    Barrier,
}

/// A communication engine, created on and used only by the communication thread.
pub(crate) trait Transport {
    /// Runs `kind` from `input` into `output` (both contiguous, on the
    /// group's device, `output` freshly allocated) and returns once it is
    /// complete; an error when it fails or is not complete by `deadline`.
    fn run(
        &mut self,
        kind: &Kind,
        input: &Tensor,
        output: &Tensor,
        deadline: Instant,
    ) -> Result<()>;
    /// Shuts the engine down; `clean` is false after a failure (peers may be
    /// gone, so nothing that waits for them may run).
    fn finish(&mut self, clean: bool);
}

/// What the communication thread reports after creating its transport.
pub(crate) struct Started {
    pub transport: Box<dyn Transport>,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub device: Device,
}

pub(crate) type Starter = Box<dyn FnOnce() -> Result<Started> + Send>;

enum Msg {
    Job {
        kind: Kind,
        name: &'static str,
        input: Tensor,
        output: Tensor,
        reply: Sender<Result<()>>,
    },
    Shutdown,
}

struct Shared {
    backend: Backend,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    device: Device,
    timeout: Duration,
    tx: Mutex<Option<Sender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    broken: Arc<Mutex<Option<String>>>,
}

/// A group of processes that run collectives together (`ProcessGroup` in
/// PyTorch). Cheap to clone; [`super::init_process_group`] makes the default one.
#[derive(Clone)]
pub struct ProcessGroup {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ProcessGroup {
    /// Starts the communication thread, which creates the transport with `start`.
    pub(crate) fn start(
        backend: Backend,
        timeout: Duration,
        start: Starter,
    ) -> Result<ProcessGroup> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, usize, usize, Device)>>();
        let broken: Arc<Mutex<Option<String>>> = Arc::default();
        let flag = broken.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-comm".into())
            .spawn(move || {
                let started = match start() {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok((
                    started.rank,
                    started.world_size,
                    started.local_rank,
                    started.device,
                )));
                serve(started.transport, rx, flag, timeout);
            })
            .map_err(|e| {
                Error::op(
                    "init_process_group",
                    format!("cannot start the communication thread: {e}"),
                )
            })?;
        let (rank, world_size, local_rank, device) = match ready_rx.recv() {
            Ok(r) => r?,
            Err(_) => {
                let _ = thread.join();
                return Err(Error::op(
                    "init_process_group",
                    format!("the {backend:?} communication thread stopped while starting"),
                ));
            }
        };
        Ok(ProcessGroup {
            shared: Arc::new(Shared {
                backend,
                rank,
                world_size,
                local_rank,
                device,
                timeout,
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                broken,
            }),
        })
    }

    pub fn backend(&self) -> Backend {
        self.shared.backend
    }
    pub fn rank(&self) -> usize {
        self.shared.rank
    }
    pub fn world_size(&self) -> usize {
        self.shared.world_size
    }
    /// The rank among the processes on this host.
    pub fn local_rank(&self) -> usize {
        self.shared.local_rank
    }
    /// Where collectives run: the CPU for MPI, this rank's GPU for NCCL.
    pub fn device(&self) -> Device {
        self.shared.device
    }
    /// How long one collective may take before it is an error.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Queues one collective; the reply arrives when it completed (or failed).
    pub(crate) fn submit(
        &self,
        name: &'static str,
        kind: Kind,
        input: Tensor,
        output: Tensor,
    ) -> Result<Receiver<Result<()>>> {
        if let Some(why) = lock(&self.shared.broken).clone() {
            return Err(broken_error(name, &why));
        }
        let (reply, rx) = mpsc::channel();
        let tx = lock(&self.shared.tx);
        let Some(tx) = tx.as_ref() else {
            return Err(Error::op(name, "the process group was destroyed"));
        };
        tx.send(Msg::Job {
            kind,
            name,
            input,
            output,
            reply,
        })
        .map_err(|_| Error::op(name, "the communication thread has stopped"))?;
        Ok(rx)
    }

    /// Whether an earlier collective failed (the group is then unusable).
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.broken).clone()
    }

    /// Stops the communication thread after the queued collectives and shuts
    /// the backend down (`MPI_Finalize`; skipped after a failure, when peers
    /// may be gone). Later collectives are errors.
    pub fn shutdown(&self) {
        if let Some(tx) = lock(&self.shared.tx).take() {
            let _ = tx.send(Msg::Shutdown);
        }
        let thread = lock(&self.shared.thread).take();
        if let Some(t) = thread {
            if self.failure().is_none() {
                let _ = t.join();
            }
        }
    }
}

fn broken_error(op: &str, why: &str) -> Error {
    Error::op(
        op,
        format!("the process group is unusable after an earlier failure: {why}"),
    )
}

fn kind_name(k: &Kind) -> String {
    match k {
        Kind::AllReduce(op) => format!("all_reduce[{}]", op.name()),
        Kind::Broadcast(src) => format!("broadcast[src {src}]"),
        Kind::AllGather => "all_gather".into(),
        Kind::ReduceScatter(op) => format!("reduce_scatter[{}]", op.name()),
        Kind::Barrier => "barrier".into(),
    }
}

/// The communication thread's loop.
fn serve(
    mut transport: Box<dyn Transport>,
    rx: Receiver<Msg>,
    broken: Arc<Mutex<Option<String>>>,
    timeout: Duration,
) {
    while let Ok(msg) = rx.recv() {
        let Msg::Job {
            kind,
            name,
            input,
            output,
            reply,
        } = msg
        else {
            break;
        };
        if let Some(why) = lock(&broken).clone() {
            let _ = reply.send(Err(broken_error(name, &why)));
            continue;
        }
        let bytes = (input.numel() * input.dtype().size()) as u64;
        let r = {
            let _p = profiler::scope_with(Category::Comm, || kind_name(&kind))
                .shapes(|| vec![input.dims().to_vec()])
                .bytes(|| bytes);
            transport.run(&kind, &input, &output, Instant::now() + timeout)
        };
        if let Err(e) = &r {
            *lock(&broken) = Some(e.to_string());
            // The engine may still write into these buffers: never free them.
            std::mem::forget((input, output));
        }
        let _ = reply.send(r);
    }
    let clean = lock(&broken).is_none();
    transport.finish(clean);
}

/// A collective in flight (`torch.distributed.Work`): [`Work::wait`] blocks
/// until it completed and returns its result.
#[must_use = "a collective's result is only usable after wait()"]
pub struct Work<T = ()> {
    op: &'static str,
    rx: Receiver<Result<()>>,
    output: Tensor,
    then: Box<dyn FnOnce(Tensor) -> Result<T> + Send>,
    timeout: Duration,
}

impl<T> Work<T> {
    pub(crate) fn new(
        op: &'static str,
        rx: Receiver<Result<()>>,
        output: Tensor,
        timeout: Duration,
        then: impl FnOnce(Tensor) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        Work {
            op,
            rx,
            output,
            then: Box::new(then),
            timeout,
        }
    }

    /// Waits for the collective (at most the group's timeout after it
    /// started, plus the time the collectives queued before it take).
    pub fn wait(self) -> Result<T> {
        // The communication thread enforces the deadline; this bound only
        // guards against a thread stuck inside the engine.
        let bound = self.timeout * 2 + Duration::from_secs(5);
        match self.rx.recv_timeout(bound) {
            Ok(r) => r?,
            Err(RecvTimeoutError::Timeout) => {
                return Err(Error::op(
                    self.op,
                    format!("did not complete within {:.1}s", bound.as_secs_f64()),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::op(self.op, "the communication thread has stopped"))
            }
        }
        (self.then)(self.output)
    }
}

/// The address of a contiguous host tensor's first element.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn host_ptr(t: &Tensor) -> *mut u8 {
    // SAFETY: the offset is inside the storage (a valid layout).
    unsafe { t.storage.ptr().add(t.offset() * t.dtype().size()) }
}

/// The device address of a contiguous tensor's first element.
pub(crate) fn device_ptr(t: &Tensor) -> u64 {
    t.storage.device_ptr() + (t.offset() * t.dtype().size()) as u64
}
