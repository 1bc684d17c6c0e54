//! The NCCL transport, through cudarc's `nccl` module (libnccl is loaded at
//! run time, so kiln builds and runs without it; its absence is an error
//! here, at process-group creation). Rank `r` uses `cuda:{local_rank}`;
//! rank 0 makes the unique id and hands it out at
//! `MASTER_ADDR:MASTER_PORT` (`store.rs`). Collectives are queued on a
//! stream of the communication thread after the device's own stream has
//! drained, then polled (`cuStreamQuery`, `ncclCommGetAsyncError`) against
//! the deadline; on a timeout the communicator is aborted (`ncclCommAbort`).

use super::env::LaunchEnv;
use super::group::{device_ptr, Kind, Started, Starter, Transport};
use super::{store, ReduceOp};
use crate::Tensor;
use cudarc::driver::sys as cu;
use cudarc::nccl::{result as nccl, sys as ncs};
use kiln_ir::{DType, Error, Result};
use kiln_runtime::Device;
use std::os::raw::c_void;
use std::time::{Duration, Instant};

/// Whether libnccl can be loaded.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { ncs::is_culib_present() }
}

fn err(msg: String) -> Error {
    Error::op("init_process_group", msg)
}

struct Nccl {
    comm: ncs::ncclComm_t,
    gpu: std::sync::Arc<kiln_runtime::cuda::driver::DriverGpu>,
    device: Device,
    world_size: usize,
}

// SAFETY: the communicator is used only by the communication thread.
unsafe impl Send for Nccl {}

pub(crate) fn starter(env: LaunchEnv) -> Starter {
    Box::new(move || {
        if !nccl_present() {
            return Err(err(
                "Backend::Nccl is not available: the NCCL library (libnccl.so.2) cannot be loaded; \
                 install NCCL (the distribution's libnccl2, or pip's nvidia-nccl-cu13) and put it on \
                 LD_LIBRARY_PATH, or use Backend::Mpi for CPU processes"
                    .into(),
            ));
        }
        let ordinal = u8::try_from(env.local_rank)
            .map_err(|_| err(format!("local rank {} has no GPU ordinal", env.local_rank)))?;
        if std::env::var("KILN_CUDA").as_deref() == Ok("emulator") {
            return Err(err(
                "Backend::Nccl needs a real GPU, not the CUDA emulator".into()
            ));
        }
        let device = Device::cuda(env.local_rank)?;
        let gpu = kiln_runtime::cuda::open_driver(ordinal)?;
        let deadline = Instant::now() + Duration::from_secs(300);
        let id = if env.rank == 0 {
            let id = nccl::get_uniqueid().map_err(|e| err(format!("ncclGetUniqueId: {e:?}")))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            if env.world_size > 1 {
                store::serve(
                    &env.master_addr,
                    env.master_port,
                    env.world_size,
                    &bytes,
                    deadline,
                )?;
            }
            id
        } else {
            let bytes = store::fetch(&env.master_addr, env.master_port, env.rank, deadline)?;
            let mut id = ncs::ncclUniqueId { internal: [0; 128] };
            if bytes.len() != id.internal.len() {
                return Err(err(format!(
                    "rank 0 sent a {}-byte NCCL id, expected 128",
                    bytes.len()
                )));
            }
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as _;
            }
            id
        };
        let mut comm: ncs::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a fresh communicator slot and the id every rank shares.
        unsafe { nccl::comm_init_rank(&mut comm, env.world_size as i32, id, env.rank as i32) }
            .map_err(|e| {
                err(format!(
                    "ncclCommInitRank (rank {} of {}): {e:?}",
                    env.rank, env.world_size
                ))
            })?;
        Ok(Started {
            transport: Box::new(Nccl {
                comm,
                gpu,
                device,
                world_size: env.world_size,
            }),
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            device,
        })
    })
}

fn datatype(op: &str, dt: DType) -> Result<ncs::ncclDataType_t> {
    use ncs::ncclDataType_t::*;
    Ok(match dt {
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::I64 => ncclInt64,
        DType::I32 => ncclInt32,
        DType::U8 | DType::Bool => ncclUint8,
        other => return Err(Error::op(op, format!("NCCL has no type for {other}"))),
    })
}

fn red_op(op: ReduceOp) -> ncs::ncclRedOp_t {
    use ncs::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Avg => ncclAvg,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
    }
}

impl Transport for Nccl {
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
        // The inputs were written on the device's stream: let it drain first.
        self.device.synchronize()?;
        let stream = self.gpu.stream.cu_stream() as ncs::cudaStream_t;
        let n = input.numel();
        let (send, recv) = (
            device_ptr(input) as *const c_void,
            device_ptr(output) as *mut c_void,
        );
        let dt = datatype(name, input.dtype())?;
        // SAFETY: contiguous device buffers of the sizes each call expects,
        // kept alive by the group until the stream has finished with them.
        let r = unsafe {
            match kind {
                Kind::AllReduce(op) => {
                    nccl::all_reduce(send, recv, n, dt, red_op(*op), self.comm, stream)
                }
                Kind::Broadcast(root) => {
                    ncs::ncclBroadcast(send, recv, n, dt, *root as i32, self.comm, stream).result()
                }
                Kind::AllGather => nccl::all_gather(send, recv, n, dt, self.comm, stream),
                Kind::ReduceScatter(op) => nccl::reduce_scatter(
                    send,
                    recv,
                    n / self.world_size,
                    dt,
                    red_op(*op),
                    self.comm,
                    stream,
                ),
                // an all-reduce of nothing orders the ranks like a barrier
                Kind::Barrier => {
                    nccl::all_reduce(send, recv, 0, dt, red_op(ReduceOp::Sum), self.comm, stream)
                }
            }
        };
        r.map_err(|e| Error::op(name, format!("NCCL: {e:?}")))?;
        loop {
            // SAFETY: our stream and communicator.
            let q = unsafe { cu::cuStreamQuery(self.gpu.stream.cu_stream()) };
            if q == cu::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            if q != cu::CUresult::CUDA_ERROR_NOT_READY {
                return Err(Error::op(
                    name,
                    format!("CUDA stream error {q:?} during the collective"),
                ));
            }
            let mut async_err = ncs::ncclResult_t::ncclSuccess;
            unsafe { ncs::ncclCommGetAsyncError(self.comm, &mut async_err) };
            if async_err != ncs::ncclResult_t::ncclSuccess {
                return Err(Error::op(name, format!("NCCL failed: {async_err:?}")));
            }
            if Instant::now() >= deadline {
                return Err(Error::op(
                    name,
                    "timed out waiting for the other ranks (a rank died or hangs)".to_string(),
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn finish(&mut self, clean: bool) {
        // SAFETY: our communicator, used by no one else.
        unsafe {
            if clean {
                let _ = nccl::comm_destroy(self.comm);
            } else {
                let _ = nccl::comm_abort(self.comm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_library_creating_a_group_is_a_clear_error() {
        if nccl_present() {
            eprintln!("libnccl is present: the library-absent path is not exercised here");
            return;
        }
        let env = LaunchEnv::from_lookup(&|_| None).unwrap();
        let e = super::super::group::ProcessGroup::start(
            super::super::Backend::Nccl,
            Duration::from_secs(5),
            starter(env),
        )
        .err()
        .expect("no NCCL here")
        .to_string();
        assert!(
            e.contains("libnccl.so.2") && e.contains("Backend::Nccl"),
            "{e}"
        );
    }
}
