//! A real CUDA device through `cudarc`: stream-ordered memory, copies, and
//! generated kernels compiled by NVRTC to CUBIN for the device's compute
//! capability (cached in memory and on disk by [`super::nvrtc`]).
//!
//! Everything runs on one stream per device, so kernels, copies and frees
//! are ordered without events; a copy to the host synchronises the stream
//! before returning. Memory comes from `cuMemAllocAsync`, the driver's
//! stream-ordered pool, which is the caching allocator on this device.

use super::{Buffer, BufferOwner, Gpu, LaunchArgs};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use kiln_codegen::cuda::{cuda_kernel_name, cuda_source, TemplateKernel};
use kiln_codegen::Kernel;
use kiln_ir::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

pub struct DriverGpu {
    pub ordinal: u8,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// (major, minor), e.g. (9, 0) on an H200.
    pub compute_capability: (i32, i32),
    name: String,
    kernels: Mutex<HashMap<Kernel, CudaFunction>>,
    templates: Mutex<HashMap<String, CudaFunction>>,
    this: Weak<DriverGpu>,
}

fn fail(ordinal: u8, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::op("cuda", format!("cuda:{ordinal}: {what}: {e:?}"))
}

impl DriverGpu {
    pub(crate) fn new(ordinal: u8, ctx: Arc<CudaContext>) -> Result<Arc<DriverGpu>> {
        let compute_capability = ctx
            .compute_capability()
            .map_err(|e| fail(ordinal, "compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let stream = ctx
            .new_stream()
            .map_err(|e| fail(ordinal, "new stream", e))?;
        Ok(Arc::new_cyclic(|this| DriverGpu {
            ordinal,
            ctx,
            stream,
            compute_capability,
            name,
            kernels: Mutex::new(HashMap::new()),
            templates: Mutex::new(HashMap::new()),
            this: this.clone(),
        }))
    }

    pub(crate) fn free(&self, ptr: u64) {
        // A failed free at drop time cannot be reported to anyone; the pool keeps it.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from `alloc` on this stream and is freed once (Buffer's drop).
        let _ = unsafe { result::free_async(ptr, self.stream.cu_stream()) };
    }

    fn template_function(&self, t: &TemplateKernel) -> Result<CudaFunction> {
        let mut cache = self.templates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(&t.symbol) {
            return Ok(f.clone());
        }
        super::log_template(t);
        let image = super::nvrtc::KernelCache::global()
            .get_or_compile(&t.source, self.compute_capability)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(|e| fail(self.ordinal, &format!("loading {}", t.name), e))?;
        let f = module
            .load_function(&t.symbol)
            .map_err(|e| fail(self.ordinal, &format!("kernel {}", t.name), e))?;
        cache.insert(t.symbol.clone(), f.clone());
        Ok(f)
    }

    fn function(&self, k: &Kernel) -> Result<CudaFunction> {
        let mut cache = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(k) {
            return Ok(f.clone());
        }
        let src = cuda_source(k)?;
        super::log_compile(k, &src);
        let image =
            super::nvrtc::KernelCache::global().get_or_compile(&src, self.compute_capability)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(|e| fail(self.ordinal, &format!("loading {}", k.name), e))?;
        let f = module
            .load_function(&cuda_kernel_name(k))
            .map_err(|e| fail(self.ordinal, &format!("kernel {}", k.name), e))?;
        cache.insert(k.clone(), f.clone());
        Ok(f)
    }
}

impl Gpu for DriverGpu {
    fn describe(&self) -> String {
        let (a, b) = self.compute_capability;
        format!("{} (sm_{a}{b})", self.name)
    }

    fn alloc(&self, bytes: usize) -> Result<Buffer> {
        let o = self.ordinal;
        self.ctx.bind_to_thread().map_err(|e| fail(o, "bind", e))?;
        let s = self.stream.cu_stream();
        // SAFETY: a fresh allocation on our stream, zeroed before anyone reads it.
        let ptr = unsafe {
            let p = result::malloc_async(s, bytes.max(1))
                .map_err(|e| fail(o, &format!("out of memory allocating {bytes} bytes"), e))?;
            result::memset_d8_async(p, 0, bytes, s).map_err(|e| fail(o, "memset", e))?;
            p
        };
        let owner = self
            .this
            .upgrade()
            .expect("a device outlives its buffers' creation");
        Ok(Buffer {
            ptr,
            bytes,
            owner: BufferOwner::Driver(owner),
        })
    }

    fn copy_to_device(&self, src: &[u8], dst: u64) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(self.ordinal, "bind", e))?;
        // SAFETY: `dst` has room for `src` (the caller's storage bounds); pageable memory is
        // staged by the driver before the call returns, so `src` may be freed after it.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| fail(self.ordinal, "copy to device", e))
    }

    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(self.ordinal, "bind", e))?;
        // SAFETY: `src` holds `dst.len()` bytes; the stream is synchronised before `dst` is read.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| fail(self.ordinal, "copy to host", e))?;
        self.synchronize()
    }

    fn copy_on_device(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(self.ordinal, "bind", e))?;
        // SAFETY: both ranges lie in live buffers of this device.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| fail(self.ordinal, "copy on device", e))
    }

    fn launch(&self, k: &Kernel, a: &LaunchArgs) -> Result<()> {
        let f = self.function(k)?;
        let mut b = self.stream.launch_builder(&f);
        for p in &a.ptrs {
            b.arg(p);
        }
        for n in &a.sizes {
            b.arg(n);
        }
        for s in &a.strides {
            b.arg(s);
        }
        // Float scalars are `double` parameters and integer ones `long long`: both are
        // the 8 bytes in `scalars` as they are.
        for s in &a.scalars {
            b.arg(s);
        }
        b.arg(&a.start);
        b.arg(&a.end);
        let cfg = LaunchConfig {
            grid_dim: (a.grid, 1, 1),
            block_dim: (a.block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments follow the kernel's ABI (kiln_codegen::cuda) one by one.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| fail(self.ordinal, &format!("launching {}", k.name), e))
    }

    fn launch_template(&self, t: &TemplateKernel, words: &[u64], grid: u32) -> Result<()> {
        let f = self.template_function(t)?;
        let mut b = self.stream.launch_builder(&f);
        // every parameter is 8 bytes: a pointer, a `long long` or a `double`'s bits
        for w in words {
            b.arg(w);
        }
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (t.block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `words` follow the template's parameter list (checked by its launcher).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| fail(self.ordinal, &format!("launching {}", t.name), e))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| fail(self.ordinal, "synchronize", e))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<super::pinned::HostMemory> {
        self.alloc_page_locked(bytes)
    }

    unsafe fn copy_to_device_async(
        &self,
        src: &[u8],
        dst: u64,
    ) -> Result<Box<dyn super::pinned::Fence>> {
        // SAFETY: the trait's contract is this method's (see pinned.rs).
        unsafe { self.copy_page_locked(src, dst) }
    }
}
