//! `torch.distributed` for kiln: process groups on existing communication
//! engines — MPI for CPU processes on one or many hosts (cargo feature
//! `mpi`, OpenMPI or MPICH), NCCL for GPUs (loaded at run time through
//! cudarc, like the rest of CUDA) — their collectives on tensors, and what
//! data-parallel training builds on them: [`DistributedDataParallel`],
//! [`DistributedSampler`], [`SyncBatchNorm`] and rank-aware seeding.
//!
//! ```no_run
//! use kiln_frontend::distributed::{self as dist, Backend, ReduceOp};
//! use kiln_frontend::{DType, Tensor};
//! // started by `mpirun -n 2 ./prog` (or torchrun-style RANK/WORLD_SIZE for NCCL)
//! dist::init_process_group(Backend::Mpi)?;
//! let t = Tensor::full(&[4], dist::rank() as f64 + 1.0, DType::F32);
//! dist::all_reduce(&t, ReduceOp::Sum)?;           // every rank: [3, 3, 3, 3]
//! let w = dist::all_reduce_async(&t, ReduceOp::Max)?; // runs on the communication thread
//! w.wait()?;
//! dist::destroy_process_group();
//! # Ok::<(), kiln_frontend::Error>(())
//! ```
//!
//! Every collective runs on one communication thread per process, in
//! submission order, non-blocking inside the engine and polled against the
//! group's timeout ([`InitOptions::timeout`], `KILN_DIST_TIMEOUT` seconds,
//! default 1800 as PyTorch's): a peer that died or hangs is an error naming
//! the collective on every other rank, and the group is unusable after it.
//! (mpirun itself also stops the job when one rank dies, unless started with
//! `--enable-recovery`.)

mod collectives;
mod ddp;
mod env;
mod group;
#[cfg(feature = "mpi")]
mod mpi_backend;
mod nccl_backend;
mod sampler;
mod store;
mod sync_bn;

pub use collectives::{all_gather, all_reduce, barrier, broadcast, reduce_scatter};
pub use collectives::{all_gather_async, all_reduce_async, broadcast_async, reduce_scatter_async};
pub use ddp::{DdpOptions, DistributedDataParallel, NoSyncGuard};
pub use env::LaunchEnv;
pub use group::{ProcessGroup, Work};
pub use nccl_backend::nccl_present;
pub use sampler::DistributedSampler;
pub(crate) use sync_bn::{active_group as sync_bn_group, forward as sync_bn_forward};
pub use sync_bn::{convert_sync_batchnorm, SyncBatchNorm};

use kiln_ir::{Error, Result};
use std::sync::Mutex;
use std::time::Duration;

/// The communication engine of a process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// MPI (OpenMPI, MPICH) on CPU tensors; needs the `mpi` cargo feature
    /// and a launch by `mpirun`.
    Mpi,
    /// NCCL on CUDA tensors, one GPU per rank (`cuda:{local_rank}`); the
    /// ranks meet at `MASTER_ADDR:MASTER_PORT` (rank 0 listens there).
    Nccl,
}

/// How a reduction combines the ranks' tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size (floating-point tensors only).
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// Options of [`init_process_group_with`].
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// How long one collective may take (from when it starts) before it is
    /// an error. `None`: `KILN_DIST_TIMEOUT` (seconds) or 1800 s.
    pub timeout: Option<Duration>,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions { timeout: None }
    }
}

/// The default timeout: `KILN_DIST_TIMEOUT` seconds, else 30 minutes.
fn default_timeout() -> Result<Duration> {
    match std::env::var("KILN_DIST_TIMEOUT") {
        Err(_) => Ok(Duration::from_secs(1800)),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::op(
                "init_process_group",
                format!("KILN_DIST_TIMEOUT={v:?} is not a positive number of seconds"),
            )),
        },
    }
}

static DEFAULT: Mutex<Option<ProcessGroup>> = Mutex::new(None);

fn default_slot() -> std::sync::MutexGuard<'static, Option<ProcessGroup>> {
    DEFAULT.lock().unwrap_or_else(|e| e.into_inner())
}

/// `torch.distributed.init_process_group(backend)`: joins the other ranks
/// the launcher started and makes the default group. An error when the
/// backend is unavailable (built without MPI, no NCCL library or GPU), when
/// the launcher's environment is inconsistent, or when a group exists.
pub fn init_process_group(backend: Backend) -> Result<ProcessGroup> {
    init_process_group_with(backend, InitOptions::default())
}

/// [`init_process_group`] with options (the timeout).
pub fn init_process_group_with(backend: Backend, opts: InitOptions) -> Result<ProcessGroup> {
    let mut slot = default_slot();
    if slot.is_some() {
        return Err(Error::op(
            "init_process_group",
            "a default process group exists already (call destroy_process_group first)",
        ));
    }
    let timeout = match opts.timeout {
        Some(t) => t,
        None => default_timeout()?,
    };
    let env = LaunchEnv::from_env()?;
    let group = match backend {
        Backend::Mpi => mpi_group(&env, timeout)?,
        Backend::Nccl => ProcessGroup::start(backend, timeout, nccl_backend::starter(env.clone()))?,
    };
    if env.launcher != "none" && group.world_size() != env.world_size {
        let (g, w) = (group.world_size(), env.world_size);
        group.shutdown();
        return Err(Error::op(
            "init_process_group",
            format!(
                "{} says the world has {w} ranks but {backend:?} sees {g}; start MPI ranks with mpirun",
                env.launcher
            ),
        ));
    }
    *slot = Some(group.clone());
    Ok(group)
}

#[cfg(feature = "mpi")]
fn mpi_group(_env: &LaunchEnv, timeout: std::time::Duration) -> Result<ProcessGroup> {
    ProcessGroup::start(Backend::Mpi, timeout, mpi_backend::starter())
}

#[cfg(not(feature = "mpi"))]
fn mpi_group(_env: &LaunchEnv, _timeout: std::time::Duration) -> Result<ProcessGroup> {
    Err(Error::op(
        "init_process_group",
        "Backend::Mpi is not available: kiln was built without the `mpi` cargo feature \
         (build with `--features mpi`; it needs an MPI library such as libopenmpi-dev, and libclang-dev)",
    ))
}

/// Whether the MPI backend was compiled in (the `mpi` feature).
pub fn mpi_available() -> bool {
    cfg!(feature = "mpi")
}

/// Whether a default group exists.
pub fn is_initialized() -> bool {
    default_slot().is_some()
}

/// The default group; an error before [`init_process_group`].
pub fn default_group() -> Result<ProcessGroup> {
    default_slot().clone().ok_or_else(|| {
        Error::op(
            "distributed",
            "the default process group is not initialized: call init_process_group first",
        )
    })
}

/// `destroy_process_group()`: finishes the queued collectives and shuts the
/// engine down (`MPI_Finalize`, which mpirun expects before a rank exits).
pub fn destroy_process_group() {
    let g = default_slot().take();
    if let Some(g) = g {
        g.shutdown();
    }
}

/// This process's rank in the default group (0 when there is none).
pub fn rank() -> usize {
    default_slot().as_ref().map_or(0, |g| g.rank())
}

/// The default group's size (1 when there is none).
pub fn world_size() -> usize {
    default_slot().as_ref().map_or(1, |g| g.world_size())
}

/// This process's rank on its host (0 when there is no group).
pub fn local_rank() -> usize {
    default_slot().as_ref().map_or(0, |g| g.local_rank())
}

/// Whether this process is rank 0 (or not distributed): the one that logs,
/// shows progress and writes checkpoints.
pub fn is_main_process() -> bool {
    rank() == 0
}

/// The seed rank `rank` uses under [`manual_seed_for_rank`]: `seed + rank`.
pub fn seed_for_rank(seed: u64, rank: usize) -> u64 {
    seed.wrapping_add(rank as u64)
}

/// Seeds the default generator with `seed + rank` (the PyTorch recipe), so
/// dropout masks and augmentations differ between ranks while each run
/// repeats; a `DataLoader` made afterwards draws its seed from it, so its
/// workers' streams differ per rank and worker. Model initialisation need
/// not match across ranks: [`DistributedDataParallel::new`] broadcasts rank
/// 0's parameters. Returns the seed used.
///
/// ```
/// let s = kiln_frontend::distributed::manual_seed_for_rank(7);
/// assert_eq!(s, 7 + kiln_frontend::distributed::rank() as u64);
/// ```
pub fn manual_seed_for_rank(seed: u64) -> u64 {
    let s = seed_for_rank(seed, rank());
    crate::random::manual_seed(s);
    s
}
