//! The CUDA device, opened without ever panicking.
//!
//! `cudarc` loads libcuda and libnvrtc at run time and panics when a library
//! is missing, so [`cuda_device`] checks that each library can be loaded
//! before touching it. A machine without the driver, without a device, or
//! without NVRTC gets an ordinary [`Error`] that says which is missing.

pub mod nvrtc;

pub use nvrtc::{compile_cubin, KernelCache};

use kiln_ir::Error;
use std::sync::Arc;

/// An opened CUDA device: its context and compute capability (for the kernel cache key).
#[derive(Debug, Clone)]
pub struct CudaDevice {
    pub ordinal: usize,
    pub ctx: Arc<cudarc::driver::CudaContext>,
    /// (major, minor), e.g. (9, 0) on an H200.
    pub compute_capability: (i32, i32),
}

fn err(msg: String) -> Error {
    Error::op("cuda", msg)
}

/// Whether the CUDA driver library (libcuda) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC (libnvrtc) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Opens CUDA device `ordinal`, or says what is missing.
pub fn cuda_device(ordinal: usize) -> Result<CudaDevice, Error> {
    if !driver_present() {
        return Err(err(format!(
            "device cuda:{ordinal} unavailable: the CUDA driver library (libcuda.so) \
             cannot be loaded (no NVIDIA driver on this machine?)"
        )));
    }
    // `cudarc` ≥ 0.19 initialises the driver here; with a driver but no device it returns
    // CUDA_ERROR_NO_DEVICE (or INVALID_DEVICE for an ordinal past the last device).
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(|e| err(format!("device cuda:{ordinal} unavailable: {e:?}")))?;
    if !nvrtc_present() {
        return Err(err(format!(
            "device cuda:{ordinal}: NVRTC (libnvrtc.so) cannot be loaded, so kernels cannot be \
             compiled; install nvidia-cuda-nvrtc or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH"
        )));
    }
    let compute_capability = ctx
        .compute_capability()
        .map_err(|e| err(format!("device cuda:{ordinal}: {e:?}")))?;
    Ok(CudaDevice {
        ordinal,
        ctx,
        compute_capability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_device_is_an_error_or_a_device_never_a_panic() {
        match cuda_device(0) {
            Ok(d) => assert!(d.compute_capability.0 >= 1),
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("cuda: device cuda:0"), "{m}");
                if !driver_present() {
                    assert!(m.contains("CUDA driver library"), "{m}");
                }
            }
        }
        // An ordinal no machine has is always an error.
        if driver_present() {
            assert!(cuda_device(1 << 20).is_err());
        }
    }
}
