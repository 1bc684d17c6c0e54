//! CUDA devices: opening one without ever panicking, its memory, its kernels.
//!
//! Two implementations of [`Gpu`] stand behind `Device::Cuda(n)`:
//!
//! - [`driver::DriverGpu`]: a real NVIDIA device through `cudarc` (libcuda and
//!   NVRTC loaded at run time; kernels compiled to CUBIN and cached by
//!   [`nvrtc`]);
//! - [`emulator::Emulator`]: the same CUDA C run on the CPU through the C++
//!   shim of `kiln_codegen::cuda::shim`; its "device memory" is host buffers
//!   that only kernels and copies touch (host code reading it is a panic, as
//!   on a real device it would be a wild read).
//!
//! Tests and CI open the emulator ([`use_emulator`] before the first use, or
//! `KILN_CUDA=emulator`), so the whole device path — allocation, copies, and
//! launches of generated CUDA C with a grid and a block — runs on machines
//! without a GPU. `cudarc` panics when it cannot load a library, so
//! [`open_driver`] checks for each library first: a machine without the
//! driver, a device or NVRTC gets an ordinary [`Error`] that says which.

pub mod attention;
pub mod conv;
pub mod driver;
pub mod emulator;
pub mod epilogue;
pub mod gemm;
pub mod info;
pub mod launch;
pub mod nvrtc;
pub mod pinned;
pub mod take;

pub use nvrtc::{compile_cubin, KernelCache};

use crate::memory::{Device, MAX_CUDA_DEVICES};
use kiln_codegen::cuda::TemplateKernel;
use kiln_codegen::Kernel;
use kiln_ir::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Device memory: a base address the device understands plus what frees it.
pub struct Buffer {
    /// Device address (on the emulator, a host address only kernels use).
    pub ptr: u64,
    pub bytes: usize,
    pub(crate) owner: BufferOwner,
}

pub(crate) enum BufferOwner {
    Driver(Arc<driver::DriverGpu>),
    Host(#[allow(dead_code)] Vec<u128>),
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let BufferOwner::Driver(g) = &self.owner {
            g.free(self.ptr);
        }
    }
}

/// The arguments of one launch, in the kernel's ABI (see `kiln_codegen::cuda`):
/// operand addresses (already offset), loop sizes, strides operand-major, scalar bits.
#[derive(Debug, Clone)]
pub struct LaunchArgs {
    pub ptrs: Vec<u64>,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub scalars: Vec<u64>,
    pub start: i64,
    pub end: i64,
    pub grid: u32,
    pub block: u32,
}

/// What kiln needs from a CUDA device. All work is ordered on one stream per
/// device; copies to the host wait for it.
pub trait Gpu: Send + Sync {
    /// For messages: "NVIDIA H200 (sm_90)", "CPU emulator (C++ shim)".
    fn describe(&self) -> String;
    /// Zero-filled memory.
    fn alloc(&self, bytes: usize) -> Result<Buffer>;
    fn copy_to_device(&self, src: &[u8], dst: u64) -> Result<()>;
    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    fn copy_on_device(&self, src: u64, dst: u64, bytes: usize) -> Result<()>;
    /// Compiles `k` (cached) and launches it.
    fn launch(&self, k: &Kernel, args: &LaunchArgs) -> Result<()>;
    /// Compiles template `t` (cached) and launches it with one 8-byte word
    /// per parameter, on `grid` blocks of `t.block` threads.
    fn launch_template(&self, t: &TemplateKernel, words: &[u64], grid: u32) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// The most threads a reduction's block gets (a multiple of 32).
    fn max_reduce_block(&self) -> u32 {
        kiln_codegen::cuda::REDUCE_BLOCK
    }
    /// Compiles kernels ahead of their launches (the emulator batches them
    /// into one `c++` run per core); the driver compiles on first launch.
    fn prepare(&self, _kernels: &[Kernel]) -> Result<()> {
        Ok(())
    }
    /// Host memory for pinned storages ([`pinned`]): page-locked where the
    /// device has it, else ordinary memory that is only flagged pinned.
    fn alloc_pinned(&self, bytes: usize) -> Result<pinned::HostMemory> {
        Ok(pinned::HostMemory::ordinary(bytes))
    }
    /// Queues a copy of `src` to `dst`, returning the fence that passes once
    /// `src` has been read. Here, as wherever copies finish before returning,
    /// the fence has already passed.
    ///
    /// # Safety
    /// `src` stays alive and unwritten until the fence passes
    /// ([`pinned::copy_to_device`] sees to it).
    unsafe fn copy_to_device_async(&self, src: &[u8], dst: u64) -> Result<Box<dyn pinned::Fence>> {
        self.copy_to_device(src, dst)?;
        Ok(Box::new(pinned::Finished))
    }
}

/// `KILN_LOG=kernels` / `code` for a kernel compiled for a device, as the CPU
/// path logs KernelIR and Cranelift IR.
pub(crate) fn log_compile(k: &Kernel, source: &str) {
    if crate::log_enabled("kernels") {
        eprint!("[kiln kernels] {}", k.to_text());
    }
    if crate::log_enabled("code") {
        eprint!("[kiln code] {} (cuda)\n{source}", k.name);
    }
}

/// `KILN_LOG=code` for a template compiled for a device; remembered for
/// [`templates_compiled`].
pub(crate) fn log_template(t: &TemplateKernel) {
    if crate::log_enabled("code") {
        eprint!("[kiln code] {} (cuda)\n{}", t.name, t.source);
    }
    TEMPLATES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(t.clone());
}

static TEMPLATES: Mutex<Vec<TemplateKernel>> = Mutex::new(Vec::new());

/// Every template kernel this process has compiled for a device (the
/// emulator included), so tests can hand each to NVRTC.
pub fn templates_compiled() -> Vec<TemplateKernel> {
    TEMPLATES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static EMULATE: AtomicBool = AtomicBool::new(false);
type Slot = Option<Arc<dyn Gpu>>;
static DEVICES: Mutex<[Slot; MAX_CUDA_DEVICES]> = Mutex::new([const { None }; MAX_CUDA_DEVICES]);

/// Makes every CUDA device opened from now on the CPU emulator.
pub fn use_emulator() {
    EMULATE.store(true, Ordering::Relaxed);
}

fn emulating() -> bool {
    EMULATE.load(Ordering::Relaxed) || std::env::var("KILN_CUDA").as_deref() == Ok("emulator")
}

fn err(msg: String) -> Error {
    Error::op("cuda", msg)
}

/// The opened device `ordinal` (opening it on first use).
pub fn gpu(ordinal: u8) -> Result<Arc<dyn Gpu>> {
    let i = ordinal as usize;
    if i >= MAX_CUDA_DEVICES {
        return Err(err(format!(
            "device cuda:{ordinal} unavailable: kiln supports ordinals below {MAX_CUDA_DEVICES}"
        )));
    }
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = &d[i] {
        return Ok(g.clone());
    }
    let g: Arc<dyn Gpu> = if emulating() {
        Arc::new(emulator::Emulator::new(ordinal)?)
    } else {
        open_driver(ordinal)?
    };
    d[i] = Some(g.clone());
    Ok(g)
}

impl Device {
    /// CUDA device `ordinal`, opened now so that a machine without one gets a
    /// clear error here rather than at the first op.
    ///
    /// ```
    /// use kiln_runtime::Device;
    /// match Device::cuda(0) {
    ///     Ok(d) => assert_eq!(d.to_string(), "cuda:0"),
    ///     Err(e) => assert!(e.to_string().starts_with("cuda: device cuda:0")),
    /// }
    /// ```
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let o = u8::try_from(ordinal).map_err(|_| {
            err(format!(
                "device cuda:{ordinal} unavailable: ordinal out of range"
            ))
        })?;
        gpu(o).map(|_| Device::Cuda(o))
    }

    /// Waits until the work queued on this device is done
    /// (`torch.cuda.synchronize()`), e.g. before reading a clock; the CPU
    /// has nothing queued.
    pub fn synchronize(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(n) => {
                gpu(n)?.synchronize()?;
                pinned::retire();
                Ok(())
            }
        }
    }
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

/// Opens a real device `ordinal`, or says what is missing.
pub fn open_driver(ordinal: u8) -> Result<Arc<driver::DriverGpu>> {
    if !driver_present() {
        return Err(err(format!(
            "device cuda:{ordinal} unavailable: the CUDA driver library (libcuda.so) \
             cannot be loaded (no NVIDIA driver on this machine?)"
        )));
    }
    // `cudarc` ≥ 0.19 initialises the driver here; with a driver but no device it returns
    // CUDA_ERROR_NO_DEVICE (or INVALID_DEVICE for an ordinal past the last device).
    let ctx = cudarc::driver::CudaContext::new(ordinal as usize)
        .map_err(|e| err(format!("device cuda:{ordinal} unavailable: {e:?}")))?;
    if !nvrtc_present() {
        return Err(err(format!(
            "device cuda:{ordinal}: NVRTC (libnvrtc.so) cannot be loaded, so kernels cannot be \
             compiled; install nvidia-cuda-nvrtc or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH"
        )));
    }
    driver::DriverGpu::new(ordinal, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_device_is_an_error_or_a_device_never_a_panic() {
        match open_driver(0) {
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
            assert!(open_driver(200).is_err());
        }
        let e = gpu(200).err().map(|e| e.to_string());
        assert!(e.unwrap_or_default().contains("ordinals below 8"));
    }
}
