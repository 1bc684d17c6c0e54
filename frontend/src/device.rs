//! Where a tensor lives: `device()`, `to_device()` (PyTorch's `.to(device)`),
//! and allocation next to an op's inputs.
//!
//! An op's result goes on its inputs' device (a one-element CPU tensor may
//! join CUDA operands as a scalar, as in PyTorch); a kernel over tensors on
//! two devices is an error naming both. Host reads of a CUDA tensor
//! (`to_vec`, `item`, printing) copy it to the CPU first.

use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::Layout;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::Device;
use std::sync::Arc;

impl Tensor {
    /// The device of this tensor's storage.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// `tensor.to(device)`: `self` when it is already there, else a contiguous
    /// copy on `device`. Differentiable: the gradient goes back to `self`'s device.
    ///
    /// ```
    /// use kiln_frontend::Tensor;
    /// use kiln_runtime::Device;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    /// assert_eq!(x.to_device(Device::Cpu).unwrap().device(), Device::Cpu);
    /// ```
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        trace::read_value("to_device", self)?;
        let from = self.device();
        // a dense copy first, so only this tensor's elements cross
        let dense = if self.is_contiguous() && self.numel() == self.storage.len() {
            self.detach()
        } else {
            trace::untraced(|| self.detach().copy())?
        };
        let storage = dense.storage.to_device(device)?;
        let out = Tensor::from_parts(Arc::new(storage), Layout::contiguous(self.dims()));
        crate::autograd::rules::view::view("to_device", self, out, move |g, _| g.to_device(from))
    }

    /// `tensor.to(device, non_blocking=True)`. From a pinned CPU tensor
    /// ([`Tensor::pin_memory`]) to a CUDA device the copy is queued on the
    /// device's stream and this returns at once: work on the result is
    /// ordered after the copy, dropping `self` meanwhile is fine (the device
    /// keeps the pinned memory until the copy is done), and host access to
    /// `self` — writes included — waits for the copy, so it cannot corrupt it.
    ///
    /// Every other direction behaves like [`Tensor::to_device`]: from pageable
    /// memory the driver stages the bytes before returning anyway, and a copy
    /// to the CPU always finishes before returning, because a host tensor
    /// whose contents are still arriving could be read too early.
    pub fn to_device_non_blocking(&self, device: Device) -> Result<Tensor> {
        let dense = self.is_contiguous() || self.numel() == 0;
        if !(self.is_pinned() && device.is_cuda() && dense) {
            return self.to_device(device);
        }
        trace::read_value("to_device", self)?;
        let from = self.device();
        let range = self.offset()..self.offset() + self.numel();
        let storage = self.storage.to_device_non_blocking(device, range)?;
        let out = Tensor::from_parts(Arc::new(storage), Layout::contiguous(self.dims()));
        crate::autograd::rules::view::view("to_device", self, out, move |g, _| g.to_device(from))
    }

    /// `tensor.pin_memory()`: a copy of this CPU tensor in pinned
    /// (page-locked) host memory, from which copies to a CUDA device can run
    /// asynchronously ([`Tensor::to_device_non_blocking`]); `self` when it is
    /// pinned already. As in PyTorch it needs a CUDA device: without one it
    /// is an error. On the CPU emulator the memory is ordinary host memory,
    /// flagged pinned.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if self.device().is_cuda() {
            bail!(
                "pin_memory",
                "cannot pin a {} tensor: only CPU tensors can be pinned",
                self.device()
            );
        }
        if self.is_pinned() {
            return Ok(self.clone());
        }
        trace::read_value("pin_memory", self)?;
        let storage = if self.is_contiguous() || self.numel() == 0 {
            let range = self.offset()..self.offset() + self.numel();
            self.storage.pin(range)?
        } else {
            let dense = trace::untraced(|| self.detach().copy())?;
            dense.storage.pin(0..dense.numel())?
        };
        let out = Tensor::from_parts(Arc::new(storage), Layout::contiguous(self.dims()));
        crate::autograd::rules::view::view("pin_memory", self, out, |g, _| Ok(g.clone()))
    }

    /// Whether this tensor's storage is pinned host memory (`is_pinned()`).
    pub fn is_pinned(&self) -> bool {
        self.storage.is_pinned()
    }

    /// A fresh contiguous tensor on `device` whose contents are unspecified.
    pub fn empty_on(dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::empty_for("empty", dims, dtype, device)
    }

    /// A fresh zero-filled tensor on `device`.
    pub fn zeros_on(dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::zeros_for("zeros", dims, dtype, device)
    }

    /// A CPU copy when this tensor is on a device (for host reads), else `self`.
    pub(crate) fn on_host(&self) -> Result<Tensor> {
        if self.device().is_cuda() {
            trace::untraced(|| self.detach().to_device(Device::Cpu))
        } else {
            Ok(self.clone())
        }
    }
}

/// Results of an op that can move between devices.
pub(crate) trait Placed: Sized {
    fn place(self, device: Device) -> Result<Self>;
}

impl Placed for Tensor {
    fn place(self, device: Device) -> Result<Tensor> {
        self.to_device(device)
    }
}

impl Placed for (Tensor, Tensor) {
    fn place(self, device: Device) -> Result<Self> {
        Ok((self.0.to_device(device)?, self.1.to_device(device)?))
    }
}

impl Placed for Vec<Tensor> {
    fn place(self, device: Device) -> Result<Self> {
        self.into_iter().map(|t| t.to_device(device)).collect()
    }
}

static HOST_FALLBACKS: std::sync::Mutex<Vec<(&'static str, usize)>> = std::sync::Mutex::new(vec![]);

/// How often each op without a device kernel ran on the host for CUDA tensors
/// (see [`via_host`]), in order of first use.
pub fn host_fallbacks() -> Vec<(&'static str, usize)> {
    HOST_FALLBACKS.lock().map(|v| v.clone()).unwrap_or_default()
}

/// For an op with no CUDA kernel for its operands' placement (a gather or an
/// embedding lookup whose operands are split between the host and a device):
/// when any of `ins` is on a CUDA device, runs `f` on CPU
/// copies of them and moves its results back to that device. Both copies
/// are differentiable, so autograd is unchanged; nothing is traced (the
/// traced node is the op itself). None when everything is on the CPU.
pub(crate) fn via_host<R: Placed>(
    op: &'static str,
    ins: &[&Tensor],
    f: impl FnOnce(&[Tensor]) -> Result<R>,
) -> Option<Result<R>> {
    let dev = device_of(ins.iter().copied());
    if !dev.is_cuda() {
        return None;
    }
    if let Ok(mut v) = HOST_FALLBACKS.lock() {
        match v.iter_mut().find(|(n, _)| *n == op) {
            Some((_, c)) => *c += 1,
            None => {
                if kiln_runtime::log_enabled("fallback") {
                    eprintln!(
                        "[kiln fallback] {op} on {dev} runs on the host (no device kernel yet)"
                    );
                }
                v.push((op, 1))
            }
        }
    }
    Some(trace::untraced(|| {
        let host = ins
            .iter()
            .map(|t| t.to_device(Device::Cpu))
            .collect::<Result<Vec<_>>>()?;
        f(&host)?.place(dev)
    }))
}

/// The device an op over `ts` runs on: the first CUDA one, else the CPU.
pub(crate) fn device_of<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> Device {
    ts.into_iter()
        .map(Tensor::device)
        .find(|d| d.is_cuda())
        .unwrap_or(Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_tensors_stay_put_and_host_access_to_device_memory_is_loud() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
        assert!(x.to_device(Device::Cpu).unwrap().shares_storage(&x));
        assert_eq!(device_of([&x]), Device::Cpu);
    }

    /// This test binary never opens the emulator, so without a driver there
    /// is no CUDA device: pinning is then an error that says why, as in PyTorch.
    #[test]
    fn pin_memory_needs_a_cuda_device() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
        match (x.pin_memory(), Device::cuda(0)) {
            (Ok(p), Ok(_)) => {
                assert!(p.is_pinned() && !x.is_pinned());
                assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
            }
            (Err(e), Err(_)) => {
                let m = e.to_string();
                assert!(
                    m.starts_with(
                        "pin_memory: pinned memory needs a CUDA device: cuda: device cuda:0"
                    ),
                    "{m}"
                );
            }
            (p, d) => panic!("pinning {p:?} disagrees with the device {d:?}"),
        }
        // a pageable tensor's non-blocking copy within the CPU is the blocking one
        assert!(x
            .to_device_non_blocking(Device::Cpu)
            .unwrap()
            .shares_storage(&x));
    }
}
