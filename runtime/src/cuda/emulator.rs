//! A CUDA device emulated on the CPU: the generated CUDA C compiled by `c++`
//! against the shim header (`kiln_codegen::cuda::shim`) and launched with
//! the grid and block a GPU would get; "device memory" is host buffers.
//!
//! It exists so that every machine runs the device path end to end: the
//! frontend's placement of tensors, copies in both directions, and the
//! generated kernels themselves. Kernels are compiled in batches: a miss
//! compiles one library, and [`Gpu::prepare`] compiles many kernels in
//! one `c++` run per core (about 65 ms a kernel, against ~0.5 s for a lone
//! one). Libraries are cached on disk under a hash of their text.

use super::{Buffer, BufferOwner, Gpu, LaunchArgs};
use kiln_codegen::cuda::shim::{self, LaunchFn, ShimLibrary, TemplateLaunchFn};
use kiln_codegen::cuda::TemplateKernel;
use kiln_codegen::Kernel;
use kiln_ir::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub struct Emulator {
    pub ordinal: u8,
    dir: PathBuf,
    kernels: Mutex<HashMap<Kernel, (Arc<ShimLibrary>, LaunchFn)>>,
    templates: Mutex<HashMap<String, (Arc<ShimLibrary>, TemplateLaunchFn)>>,
}

fn fail(ordinal: u8, msg: String) -> Error {
    Error::op("cuda", format!("cuda:{ordinal} (emulator): {msg}"))
}

/// Where shim libraries are cached: `shim/` under the per-user cache root
/// ([`crate::cache_dir`]), else (caching off, or no usable root) a private
/// folder of this process in the temp dir: code this process loads is never
/// taken from a folder another user can write.
fn cache_dir() -> PathBuf {
    crate::cache_dir::subdir("shim").unwrap_or_else(|| {
        let d = std::env::temp_dir().join(format!("kiln-cuda-shim-{}", std::process::id()));
        let _ = crate::cache_dir::ensure_private(&d);
        d
    })
}

impl Emulator {
    pub(crate) fn new(ordinal: u8) -> Result<Emulator> {
        if !shim::compiler_present() {
            return Err(fail(
                ordinal,
                "no C++ compiler (`c++`) to build the emulated kernels".into(),
            ));
        }
        Ok(Emulator {
            ordinal,
            dir: cache_dir(),
            kernels: Mutex::new(HashMap::new()),
            templates: Mutex::new(HashMap::new()),
        })
    }

    /// Compiles every kernel of `ks` not yet loaded, in one library per core.
    fn build(&self, ks: &[Kernel]) -> Result<()> {
        let mut todo: Vec<&Kernel> = {
            let have = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
            ks.iter().filter(|k| !have.contains_key(*k)).collect()
        };
        todo.sort_by_key(|k| kiln_codegen::cuda::cuda_kernel_name(k));
        todo.dedup();
        if todo.is_empty() {
            return Ok(());
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = todo.len().div_ceil(cores);
        let built: Vec<Result<(Vec<&Kernel>, ShimLibrary)>> = std::thread::scope(|s| {
            let jobs: Vec<_> = todo
                .chunks(chunk)
                .map(|c| {
                    s.spawn(|| {
                        ShimLibrary::build(c.iter().copied(), &self.dir).map(|l| (c.to_vec(), l))
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().expect("shim build thread"))
                .collect()
        });
        for k in &todo {
            super::log_compile(k, &kiln_codegen::cuda::cuda_source(k)?);
        }
        let mut have = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        for b in built {
            let (ks, lib) = b.map_err(|e| fail(self.ordinal, e.to_string()))?;
            let lib = Arc::new(lib);
            for k in ks {
                let f = lib.launcher(k)?;
                have.insert(k.clone(), (lib.clone(), f));
            }
        }
        Ok(())
    }

    fn launcher(&self, k: &Kernel) -> Result<LaunchFn> {
        if let Some((_, f)) = self
            .kernels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(k)
        {
            return Ok(*f);
        }
        self.build(std::slice::from_ref(k))?;
        Ok(self.kernels.lock().unwrap_or_else(|e| e.into_inner())[k].1)
    }
}

impl Gpu for Emulator {
    fn describe(&self) -> String {
        "CPU emulator (CUDA C through the C++ shim)".into()
    }

    fn alloc(&self, bytes: usize) -> Result<Buffer> {
        let v: Vec<u128> = crate::scratch::try_zeroed("cuda alloc", bytes.div_ceil(16).max(1))?;
        Ok(Buffer {
            ptr: v.as_ptr() as u64,
            bytes,
            owner: BufferOwner::Host(v),
        })
    }

    fn copy_to_device(&self, src: &[u8], dst: u64) -> Result<()> {
        // SAFETY: `dst` is an emulated device address (host memory) with room for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as above, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy_on_device(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: both ranges lie in live emulated buffers; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn launch(&self, k: &Kernel, a: &LaunchArgs) -> Result<()> {
        let f = self.launcher(k)?;
        let ptrs: Vec<*mut u8> = a.ptrs.iter().map(|&p| p as *mut u8).collect();
        // SAFETY: the wrapper takes the kernel's arguments from these arrays, laid out as
        // the driver's launch passes them one by one.
        let rc = unsafe {
            f(
                ptrs.as_ptr(),
                a.sizes.as_ptr(),
                a.strides.as_ptr(),
                a.scalars.as_ptr(),
                a.start,
                a.end,
                a.grid,
                a.block,
            )
        };
        if rc != 0 {
            return Err(fail(
                self.ordinal,
                format!(
                    "{}: invalid launch (grid {}, block {})",
                    k.name, a.grid, a.block
                ),
            ));
        }
        Ok(())
    }

    fn launch_template(&self, t: &TemplateKernel, words: &[u64], grid: u32) -> Result<()> {
        let f = {
            let mut have = self.templates.lock().unwrap_or_else(|e| e.into_inner());
            match have.get(&t.symbol) {
                Some((_, f)) => *f,
                None => {
                    super::log_template(t);
                    let lib = ShimLibrary::build_templates([t], &self.dir)
                        .map_err(|e| fail(self.ordinal, e.to_string()))?;
                    let f = lib.template_launcher(t)?;
                    have.insert(t.symbol.clone(), (Arc::new(lib), f));
                    f
                }
            }
        };
        // SAFETY: `words` follow the template's parameter list (checked by its launcher).
        let rc = unsafe { f(words.as_ptr(), grid, t.block) };
        if rc != 0 {
            return Err(fail(
                self.ordinal,
                format!(
                    "{}: invalid launch (grid {grid}, block {})",
                    t.name, t.block
                ),
            ));
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Two warps: the combine across warps still runs, while every emulated
    /// thread is a fiber that each barrier switches (kiln-codegen's shim
    /// tests launch blocks of 32 to 1024).
    fn max_reduce_block(&self) -> u32 {
        64
    }

    fn prepare(&self, ks: &[Kernel]) -> Result<()> {
        self.build(ks)
    }
}
