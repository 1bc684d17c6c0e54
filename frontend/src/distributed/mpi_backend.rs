//! The MPI transport (rsmpi over the system's MPI): every collective is the
//! non-blocking form (`MPI_Iallreduce`, `MPI_Ibcast`, `MPI_Iallgather`,
//! `MPI_Ireduce_scatter_block`, `MPI_Ibarrier`) polled with `MPI_Test`
//! until it completes or the deadline passes. The communicator returns
//! errors instead of aborting (`MPI_ERRORS_RETURN`), so a failure is an
//! error naming the collective. MPI is initialised on the communication
//! thread (`MPI_THREAD_FUNNELED`: only that thread calls MPI).

use super::group::{host_ptr, Kind, Started, Starter, Transport};
use super::ReduceOp;
use crate::Tensor;
use kiln_ir::{DType, Error, Result};
use kiln_runtime::Device;
use mpi::ffi;
use mpi::topology::Communicator;
use mpi::traits::AsRaw;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

struct Mpi {
    universe: Option<mpi::environment::Universe>,
    comm: ffi::MPI_Comm,
    world_size: usize,
}

pub(crate) fn starter() -> Starter {
    Box::new(|| {
        let Some((universe, _level)) = mpi::initialize_with_threading(mpi::Threading::Funneled)
        else {
            return Err(Error::op(
                "init_process_group",
                "MPI was initialised already in this process",
            ));
        };
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let comm = world.as_raw();
        // SAFETY: a valid communicator and a predefined error handler.
        unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        let local_rank = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
            .or_else(|_| std::env::var("MPI_LOCALRANKID"))
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(rank);
        Ok(Started {
            transport: Box::new(Mpi {
                universe: Some(universe),
                comm,
                world_size: size,
            }),
            rank,
            world_size: size,
            local_rank,
            device: Device::Cpu,
        })
    })
}

fn datatype(op: &str, dt: DType) -> Result<ffi::MPI_Datatype> {
    // SAFETY: reading the predefined handles.
    Ok(unsafe {
        match dt {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::U8 | DType::Bool => ffi::RSMPI_UINT8_T,
            other => {
                return Err(Error::op(
                    op,
                    format!("MPI has no type for {other} (reduce it as f32)"),
                ))
            }
        }
    })
}

fn reduce_op(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading the predefined handles.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

fn check(op: &str, call: &str, rc: c_int) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (256 in OpenMPI) bytes.
    unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut _, &mut len) };
    buf.truncate(len.max(0) as usize);
    Err(Error::op(
        op,
        format!(
            "{call} failed: {} (MPI error {rc})",
            String::from_utf8_lossy(&buf)
        ),
    ))
}

impl Mpi {
    /// Polls `req` until it completes or `deadline` passes: spins briefly
    /// (a small collective completes in microseconds), then sleeps between
    /// tests so the thread leaves the cores to compute.
    fn poll(&self, op: &str, mut req: ffi::MPI_Request, deadline: Instant) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `req` is an active request of this communicator.
            let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            check(op, "MPI_Test", rc)?;
            if flag != 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::op(
                    op,
                    format!(
                        "timed out after {:.1}s waiting for the other ranks (a rank died or hangs)",
                        now.duration_since(start).as_secs_f64()
                    ),
                ));
            }
            if now.duration_since(start) < Duration::from_micros(50) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(30));
            }
        }
    }
}

impl Transport for Mpi {
    fn run(
        &mut self,
        kind: &Kind,
        input: &Tensor,
        output: &Tensor,
        deadline: Instant,
    ) -> Result<()> {
        let name = match kind {
            Kind::AllReduce(_) => "all_reduce",
            Kind::Broadcast(_) => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::Barrier => "barrier",
        };
        let n = input.numel();
        if n > c_int::MAX as usize {
            return Err(Error::op(
                name,
                format!("{n} elements exceed MPI's count limit"),
            ));
        }
        let mut req: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        let comm = self.comm;
        let (send, recv) = (
            host_ptr(input) as *const c_void,
            host_ptr(output) as *mut c_void,
        );
        // SAFETY: `input` and `output` are contiguous host tensors of the
        // sizes each call expects; the group keeps both alive until the
        // request completes (and forever after a failure).
        let (call, rc) = unsafe {
            match kind {
                Kind::AllReduce(op) => {
                    let dt = datatype(name, input.dtype())?;
                    (
                        "MPI_Iallreduce",
                        ffi::MPI_Iallreduce(
                            send,
                            recv,
                            n as c_int,
                            dt,
                            reduce_op(*op),
                            comm,
                            &mut req,
                        ),
                    )
                }
                Kind::Broadcast(root) => {
                    let dt = datatype(name, input.dtype())?;
                    std::ptr::copy_nonoverlapping(
                        send as *const u8,
                        recv as *mut u8,
                        n * input.dtype().size(),
                    );
                    (
                        "MPI_Ibcast",
                        ffi::MPI_Ibcast(recv, n as c_int, dt, *root as c_int, comm, &mut req),
                    )
                }
                Kind::AllGather => {
                    let dt = datatype(name, input.dtype())?;
                    (
                        "MPI_Iallgather",
                        ffi::MPI_Iallgather(
                            send, n as c_int, dt, recv, n as c_int, dt, comm, &mut req,
                        ),
                    )
                }
                Kind::ReduceScatter(op) => {
                    let dt = datatype(name, input.dtype())?;
                    let block = n / self.world_size;
                    (
                        "MPI_Ireduce_scatter_block",
                        ffi::MPI_Ireduce_scatter_block(
                            send,
                            recv,
                            block as c_int,
                            dt,
                            reduce_op(*op),
                            comm,
                            &mut req,
                        ),
                    )
                }
                Kind::Barrier => ("MPI_Ibarrier", ffi::MPI_Ibarrier(comm, &mut req)),
            }
        };
        check(name, call, rc)?;
        self.poll(name, req, deadline)
    }

    fn finish(&mut self, clean: bool) {
        let u = self.universe.take();
        if clean {
            drop(u); // MPI_Finalize
        } else {
            // Finalize waits for peers that may be gone.
            std::mem::forget(u);
        }
    }
}
