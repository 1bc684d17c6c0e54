//! What `kiln doctor` reports about the CUDA installation: the driver's
//! CUDA version and each device's name, memory and compute capability.
//! Every function checks that libcuda loads first (cudarc panics otherwise).

use cudarc::driver::{sys, CudaContext};

/// The CUDA version the installed driver supports (`cuDriverGetVersion`),
/// as (major, minor); None without libcuda.
///
/// ```
/// if let Some((major, _)) = kiln_runtime::cuda::info::driver_version() {
///     assert!(major >= 1);
/// }
/// ```
pub fn driver_version() -> Option<(i32, i32)> {
    if !super::driver_present() {
        return None;
    }
    let mut v = 0i32;
    // SAFETY: the library is present (checked above); `v` is valid for a write.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some((v / 1000, v % 1000 / 10))
}

/// One device as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_memory: usize,
    pub compute_capability: (i32, i32),
}

/// Every device the driver sees, or why none can be listed.
pub fn devices() -> Result<Vec<DeviceInfo>, String> {
    if !super::driver_present() {
        return Err("no libcuda.so.1 found".into());
    }
    let n = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    (0..n as usize)
        .map(|i| {
            let ctx = CudaContext::new(i).map_err(|e| format!("cuda:{i}: {e:?}"))?;
            Ok(DeviceInfo {
                ordinal: i,
                name: ctx.name().unwrap_or_else(|_| "CUDA device".into()),
                total_memory: ctx.total_mem().unwrap_or(0),
                compute_capability: ctx
                    .compute_capability()
                    .map_err(|e| format!("cuda:{i}: compute capability: {e:?}"))?,
            })
        })
        .collect()
}
