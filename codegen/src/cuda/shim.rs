//! The CUDA C of [`super::cuda_source`] compiled for the CPU through a C++
//! shim header (`shim.h`), so generated kernels run — and are tested —
//! on machines without a GPU.
//!
//! Every kernel gets a wrapper `<name>_launch(void** p, const long long* n,
//! const long long* s, const unsigned long long* sc, long long start, long
//! long end, unsigned grid, unsigned block)` with the CPU backend's ABI (one
//! array each of pointers, sizes, strides and scalar bits), which calls the
//! kernel for every (block, thread) of a 1-D launch. Many kernels go into one
//! `.cpp` (each in its own namespace) compiled by one `c++` run; the library
//! is cached on disk under a hash of its text, so a second run loads it.

use super::{c_storage_type, cuda_kernel_name, cuda_source, stable_hash, TemplateKernel};
use crate::Kernel;
use kiln_ir::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The header that maps CUDA C onto C++17 + pthreads (see its comments).
pub const HEADER: &str = include_str!("shim.h");

/// Flags of the one `c++` run per library.
pub const FLAGS: [&str; 6] = ["-O1", "-shared", "-fPIC", "-std=c++17", "-pthread", "-w"];

/// The wrapper's C signature (returns 0, or -1 for an invalid launch shape).
pub type LaunchFn = unsafe extern "C" fn(
    *const *mut u8,
    *const i64,
    *const i64,
    *const u64,
    i64,
    i64,
    u32,
    u32,
) -> i32;

/// The symbol of `k`'s wrapper.
pub fn launch_symbol(k: &Kernel) -> String {
    format!("{}_launch", cuda_kernel_name(k))
}

/// The wrapper of `k` (its kernel already defined in namespace `ns`).
pub fn wrapper(k: &Kernel, ns: &str, source: &str) -> String {
    let name = cuda_kernel_name(k);
    let mut args = vec![];
    for (i, o) in k.operands.iter().enumerate() {
        let c = if i < k.outputs() { "" } else { "const " };
        args.push(format!("({c}{}*)p[{i}]", c_storage_type(o.dtype)));
    }
    for d in 0..k.rank {
        args.push(format!("n[{d}]"));
    }
    for i in 0..k.operands.len() * k.rank {
        args.push(format!("s[{i}]"));
    }
    for (i, dt) in k.scalars.iter().enumerate() {
        if dt.is_float() {
            args.push(format!("kiln_shim::f64_of_bits(sc[{i}])"));
        } else {
            args.push(format!("(long long)sc[{i}]"));
        }
    }
    args.push("start".into());
    args.push("end".into());
    let sync = source.contains("__syncthreads");
    format!(
        "extern \"C\" int {name}_launch(void** p, const long long* n, const long long* s,\n\
         \x20   const unsigned long long* sc, long long start, long long end, unsigned grid,\n\
         \x20   unsigned block) {{\n\
         \x20 (void)p; (void)n; (void)s; (void)sc;\n\
         \x20 return kiln_shim::launch(grid, block, {sync}, [&] {{ {ns}::{name}({}); }});\n}}\n",
        args.join(", ")
    )
}

/// One C++ translation unit holding `kernels` and their wrappers.
pub fn library_source<'a>(kernels: impl IntoIterator<Item = &'a Kernel>) -> Result<String, Error> {
    let mut cpp = String::from(HEADER);
    for (i, k) in kernels.into_iter().enumerate() {
        let src = cuda_source(k)?;
        cpp.push_str(&format!("namespace k{i} {{\n{src}}}\n"));
        cpp.push_str(&wrapper(k, &format!("k{i}"), &src));
    }
    Ok(cpp)
}

/// The wrapper of template `t` (defined in namespace `ns`): `<symbol>_launch(const
/// unsigned long long* a, unsigned grid, unsigned block)`, one word per parameter.
pub fn template_wrapper(t: &TemplateKernel, ns: &str) -> String {
    let args: Vec<String> = t
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| p.of_word(i))
        .collect();
    let sync = t.source.contains("__syncthreads");
    format!(
        "extern \"C\" int {s}_launch(const unsigned long long* a, unsigned grid, unsigned block) {{\n\
         \x20 (void)a;\n\
         \x20 return kiln_shim::launch(grid, block, {sync}, [&] {{ {ns}::{s}({}); }});\n}}\n",
        args.join(", "),
        s = t.symbol,
    )
}

/// The wrapper signature of a template (see [`template_wrapper`]).
pub type TemplateLaunchFn = unsafe extern "C" fn(*const u64, u32, u32) -> i32;

/// Whether a C++ compiler (`c++`) can be run here.
pub fn compiler_present() -> bool {
    Command::new("c++").arg("--version").output().is_ok()
}

/// A loaded shim library.
pub struct ShimLibrary {
    lib: libloading::Library,
    pub path: PathBuf,
}

impl ShimLibrary {
    /// Compiles `kernels` into one library under `dir` (or loads the one a
    /// previous run left there). Errors name the compiler's complaint; a
    /// missing `c++` is an error too — check [`compiler_present`] first.
    pub fn build<'a>(
        kernels: impl IntoIterator<Item = &'a Kernel>,
        dir: &Path,
    ) -> Result<ShimLibrary, Error> {
        ShimLibrary::compile(library_source(kernels)?, dir)
    }

    /// [`ShimLibrary::build`] for templates.
    pub fn build_templates<'a>(
        templates: impl IntoIterator<Item = &'a TemplateKernel>,
        dir: &Path,
    ) -> Result<ShimLibrary, Error> {
        let mut cpp = String::from(HEADER);
        for (i, t) in templates.into_iter().enumerate() {
            cpp.push_str(&format!("namespace t{i} {{\n{}}}\n", t.source));
            cpp.push_str(&template_wrapper(t, &format!("t{i}")));
        }
        ShimLibrary::compile(cpp, dir)
    }

    fn compile(cpp: String, dir: &Path) -> Result<ShimLibrary, Error> {
        let fail = |m: String| Error::op("cuda shim", m);
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let key = stable_hash(&format!("{}\n{cpp}", FLAGS.join(" ")));
        let so = dir.join(format!("shim_{key:016x}.so"));
        if !so.exists() {
            let src = dir.join(format!("shim_{key:016x}.cpp"));
            std::fs::write(&src, &cpp).map_err(|e| fail(format!("{}: {e}", src.display())))?;
            // unique per process and call, renamed into place: concurrent builders never
            // see a half-written library
            let tmp = dir.join(format!(
                "shim_{key:016x}.{}.{:?}.tmp",
                std::process::id(),
                std::thread::current().id()
            ));
            let out = Command::new("c++")
                .args(FLAGS)
                .arg(&src)
                .arg("-o")
                .arg(&tmp)
                .output()
                .map_err(|e| fail(format!("cannot run c++: {e}")))?;
            if !out.status.success() {
                return Err(fail(format!(
                    "c++ failed on {}:\n{}",
                    src.display(),
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            std::fs::rename(&tmp, &so).map_err(|e| fail(format!("{}: {e}", so.display())))?;
        }
        // SAFETY: a library we just compiled from our own source; its initialisers only
        // set up the shim's statics.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| fail(format!("cannot load {}: {e}", so.display())))?;
        Ok(ShimLibrary { lib, path: so })
    }

    /// The wrapper of template `t`, which must be one it was built from.
    pub fn template_launcher(&self, t: &TemplateKernel) -> Result<TemplateLaunchFn, Error> {
        let name = format!("{}_launch", t.symbol);
        // SAFETY: the symbol was generated by `template_wrapper` with this signature.
        let f: libloading::Symbol<TemplateLaunchFn> = unsafe { self.lib.get(name.as_bytes()) }
            .map_err(|e| Error::op("cuda shim", format!("{name}: {e}")))?;
        Ok(*f)
    }

    /// The wrapper of `k`, which must be one of the kernels it was built from.
    pub fn launcher(&self, k: &Kernel) -> Result<LaunchFn, Error> {
        let name = launch_symbol(k);
        // SAFETY: the symbol was generated by `wrapper` with the `LaunchFn` signature.
        let f: libloading::Symbol<LaunchFn> = unsafe { self.lib.get(name.as_bytes()) }
            .map_err(|e| Error::op("cuda shim", format!("{name}: {e}")))?;
        Ok(*f)
    }
}
