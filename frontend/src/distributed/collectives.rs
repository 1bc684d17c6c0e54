//! Collectives on tensors (`torch.distributed.all_reduce`, ...): each stages
//! its input for the engine (contiguous, on the group's device: the CPU for
//! MPI, which also reduces f16/bf16 in f32), queues it on the communication
//! thread and returns a [`Work`]; the blocking forms wait on it. In-place
//! collectives (`all_reduce`, `broadcast`) write the result into the tensor
//! when the work is waited for.

use super::group::{Kind, ProcessGroup, Work};
use super::{default_group, Backend, ReduceOp};
use crate::autograd::no_grad;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::Device;

/// The tensor the engine reads, and what to convert the result back to.
struct Staged {
    input: Tensor,
    dtype: DType,
    device: Device,
}

impl ProcessGroup {
    fn stage(&self, op: &'static str, t: &Tensor) -> Result<Staged> {
        let (dtype, device) = (t.dtype(), t.device());
        let mut x = t.detach();
        match self.backend() {
            Backend::Mpi => {
                if device != Device::Cpu {
                    x = x.to_device(Device::Cpu)?;
                }
                if matches!(dtype, DType::F16 | DType::BF16) {
                    x = x.to_dtype(DType::F32)?;
                }
            }
            Backend::Nccl => {
                if device != self.device() {
                    bail!(
                        op,
                        "the NCCL group of rank {} works on {} tensors; got one on {device} (shape {})",
                        self.rank(),
                        self.device(),
                        fmt_dims(t.dims())
                    );
                }
            }
        }
        let input = x.contiguous()?;
        Ok(Staged {
            input,
            dtype,
            device,
        })
    }

    fn output(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::empty_on(dims, dtype, self.device())
    }

    fn submit_work<T: 'static>(
        &self,
        op: &'static str,
        kind: Kind,
        staged: &Staged,
        out_dims: &[usize],
        then: impl FnOnce(Tensor) -> Result<T> + Send + 'static,
    ) -> Result<Work<T>> {
        let output = self.output(out_dims, staged.input.dtype())?;
        let rx = self.submit(op, kind, staged.input.clone(), output.clone())?;
        Ok(Work::new(op, rx, output, self.timeout(), then))
    }

    /// `all_reduce(t, op, async_op=True)`: `t` holds the reduction over all
    /// ranks once the work is waited for.
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work<()>> {
        let name = "all_reduce";
        if op == ReduceOp::Avg && !t.dtype().is_float() {
            bail!(
                name,
                "ReduceOp::Avg needs a floating-point tensor, got {} (shape {})",
                t.dtype(),
                fmt_dims(t.dims())
            );
        }
        let s = self.stage(name, t)?;
        let wire = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let (dest, world) = (t.clone(), self.world_size() as f64);
        let (dtype, device) = (s.dtype, s.device);
        self.submit_work(name, Kind::AllReduce(wire), &s, t.dims(), move |out| {
            let _g = no_grad();
            let out = if op == ReduceOp::Avg {
                out.div(
                    &Tensor::scalar(world)
                        .to_dtype(out.dtype())?
                        .to_device(out.device())?,
                )?
            } else {
                out
            };
            dest.copy_(&back(out, dtype, device)?)
        })
    }

    /// `broadcast(t, src, async_op=True)`: `t` holds rank `src`'s values once waited for.
    pub fn broadcast_async(&self, t: &Tensor, src: usize) -> Result<Work<()>> {
        let name = "broadcast";
        self.check_rank(name, src)?;
        let s = self.stage(name, t)?;
        let dest = t.clone();
        let (dtype, device) = (s.dtype, s.device);
        self.submit_work(name, Kind::Broadcast(src), &s, t.dims(), move |out| {
            let _g = no_grad();
            dest.copy_(&back(out, dtype, device)?)
        })
    }

    /// `all_gather(tensor_list, t, async_op=True)`: every rank's `t`, in rank order.
    pub fn all_gather_async(&self, t: &Tensor) -> Result<Work<Vec<Tensor>>> {
        let name = "all_gather";
        let s = self.stage(name, t)?;
        let world = self.world_size();
        let mut dims = vec![world];
        dims.extend_from_slice(t.dims());
        let (dtype, device) = (s.dtype, s.device);
        self.submit_work(name, Kind::AllGather, &s, &dims, move |out| {
            let out = back(out, dtype, device)?;
            (0..world).map(|r| out.select(0, r as i64)).collect()
        })
    }

    /// `reduce_scatter_tensor(out, t, op, async_op=True)`: `t`'s dim 0 is cut
    /// into world-size equal blocks; rank `r` gets block `r` reduced over all ranks.
    pub fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        let name = "reduce_scatter";
        let world = self.world_size();
        if t.rank() == 0 || t.dims()[0] % world != 0 {
            bail!(
                name,
                "dim 0 of the input (shape {}) must split into {world} equal blocks",
                fmt_dims(t.dims())
            );
        }
        if op == ReduceOp::Avg && !t.dtype().is_float() {
            bail!(
                name,
                "ReduceOp::Avg needs a floating-point tensor, got {}",
                t.dtype()
            );
        }
        let s = self.stage(name, t)?;
        let mut dims = t.dims().to_vec();
        dims[0] /= world;
        let wire = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let (dtype, device) = (s.dtype, s.device);
        self.submit_work(name, Kind::ReduceScatter(wire), &s, &dims, move |out| {
            let out = if op == ReduceOp::Avg {
                let w = Tensor::scalar(world as f64).to_dtype(out.dtype())?;
                out.div(&w.to_device(out.device())?)?
            } else {
                out
            };
            back(out, dtype, device)
        })
    }

    /// `barrier()`: returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        let s = Staged {
            input: self.output(&[0], DType::F32)?,
            dtype: DType::F32,
            device: self.device(),
        };
        self.submit_work("barrier", Kind::Barrier, &s, &[0], |_| Ok(()))?
            .wait()
    }

    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        self.broadcast_async(t, src)?.wait()
    }
    pub fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        self.all_gather_async(t)?.wait()
    }
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.reduce_scatter_async(t, op)?.wait()
    }

    fn check_rank(&self, op: &str, r: usize) -> Result<()> {
        if r >= self.world_size() {
            bail!(
                op,
                "rank {r} is out of range for a world of {}",
                self.world_size()
            );
        }
        Ok(())
    }
}

/// The engine's result in the caller's dtype and on its device.
fn back(out: Tensor, dtype: DType, device: Device) -> Result<Tensor> {
    let out = if out.dtype() != dtype {
        out.to_dtype(dtype)?
    } else {
        out
    };
    if out.device() != device {
        out.to_device(device)
    } else {
        Ok(out)
    }
}

/// [`ProcessGroup::all_reduce`] on the default group.
///
/// ```no_run
/// use kiln_frontend::distributed::{self as dist, ReduceOp};
/// let t = kiln_frontend::Tensor::full(&[2], 1.0, kiln_frontend::DType::F32);
/// dist::all_reduce(&t, ReduceOp::Sum)?; // [world, world]
/// # Ok::<(), kiln_frontend::Error>(())
/// ```
pub fn all_reduce(t: &Tensor, op: ReduceOp) -> Result<()> {
    default_group()?.all_reduce(t, op)
}
/// [`ProcessGroup::all_reduce_async`] on the default group.
pub fn all_reduce_async(t: &Tensor, op: ReduceOp) -> Result<Work<()>> {
    default_group()?.all_reduce_async(t, op)
}
/// [`ProcessGroup::broadcast`] on the default group.
pub fn broadcast(t: &Tensor, src: usize) -> Result<()> {
    default_group()?.broadcast(t, src)
}
/// [`ProcessGroup::broadcast_async`] on the default group.
pub fn broadcast_async(t: &Tensor, src: usize) -> Result<Work<()>> {
    default_group()?.broadcast_async(t, src)
}
/// [`ProcessGroup::all_gather`] on the default group.
pub fn all_gather(t: &Tensor) -> Result<Vec<Tensor>> {
    default_group()?.all_gather(t)
}
/// [`ProcessGroup::all_gather_async`] on the default group.
pub fn all_gather_async(t: &Tensor) -> Result<Work<Vec<Tensor>>> {
    default_group()?.all_gather_async(t)
}
/// [`ProcessGroup::reduce_scatter`] on the default group.
pub fn reduce_scatter(t: &Tensor, op: ReduceOp) -> Result<Tensor> {
    default_group()?.reduce_scatter(t, op)
}
/// [`ProcessGroup::reduce_scatter_async`] on the default group.
pub fn reduce_scatter_async(t: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
    default_group()?.reduce_scatter_async(t, op)
}
/// [`ProcessGroup::barrier`] on the default group.
pub fn barrier() -> Result<()> {
    default_group()?.barrier()
}
