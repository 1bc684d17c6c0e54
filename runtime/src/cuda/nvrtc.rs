//! CUDA C to CUBIN with NVRTC, cached in memory and on disk.
//!
//! CUBIN rather than PTX: a driver only JIT-compiles PTX of a version it knows,
//! and a newer NVRTC than the driver emits PTX the driver refuses; CUBIN for
//! the device's exact `sm_XY` sidesteps that.
//!
//! The cache key is the FNV-1a hash of everything that changes the output:
//! the source, the compute capability, the NVRTC version and the option list.
//! A second process with the same key loads `<dir>/<key:016x>_sm<XY>.cubin`
//! instead of compiling. Files carry a checksummed header ([`encode`]), are
//! written to a temporary name and renamed (so a reader never sees half a
//! file), and one that fails the check is recompiled and overwritten.

use crate::profiler::{self, Category};
use kiln_codegen::cuda::stable_hash;
use kiln_ir::Error;
use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result, sys};

fn err(msg: String) -> Error {
    Error::op("nvrtc", msg)
}

/// The options every kernel is compiled with. `-default-device`: no host code
/// is ever compiled, so unannotated helpers are device functions. `--fmad=true`
/// is NVRTC's default, spelled out so the key records it (the CPU shim
/// comparisons allow for fused multiply-adds).
fn options(arch: (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "-default-device".into(),
        "--fmad=true".into(),
    ]
}

const MISSING: &str = "NVRTC (libnvrtc.so) cannot be loaded, so CUDA kernels cannot be \
    compiled; install nvidia-cuda-nvrtc or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH";

/// NVRTC's (major, minor) version, or why NVRTC cannot be used. Checks that the
/// library loads first: cudarc panics on a missing library.
pub fn nvrtc_version() -> Result<(i32, i32), Error> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    if !super::nvrtc_present() {
        return Err(err(MISSING.into()));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; both pointers are valid for writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| err(format!("nvrtcVersion failed: {e:?}")))?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// The `__global__` function names in `source`, for error messages.
fn kernel_names(source: &str) -> String {
    let names: Vec<&str> = source
        .split("__global__ void ")
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
        })
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        "<no kernel>".into()
    } else {
        names.join(", ")
    }
}

/// Destroys the program however compilation ends (cudarc's own wrapper
/// panics if destruction fails; here a failure only leaks).
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Compiles `source` (CUDA C with `extern "C" __global__` kernels) for
/// `sm_{major}{minor}` and returns the CUBIN (an ELF image). A compile error
/// carries NVRTC's log and the kernel names.
pub fn compile_cubin(source: &str, arch: (i32, i32)) -> Result<Vec<u8>, Error> {
    let names = kernel_names(source);
    let what = format!("{names} for sm_{}{}", arch.0, arch.1);
    nvrtc_version()?;
    let _p = profiler::scope_with(Category::Compile, || format!("nvrtc {names}"));
    let src = CString::new(source).map_err(|_| err(format!("{what}: source contains NUL")))?;
    let file = names.split(", ").next().unwrap_or("kiln").to_string() + ".cu";
    let file = CString::new(file).expect("kernel names have no NUL");
    let prog = result::create_program(&src, Some(&file))
        .map(Program)
        .map_err(|e| err(format!("{what}: nvrtcCreateProgram failed: {e:?}")))?;
    let opts = options(arch);
    // SAFETY (this and below): `prog` is live until `Program` drops.
    if let Err(e) = unsafe { result::compile_program(prog.0, &opts) } {
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| {
                l.iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect()
            })
            .map(|l: Vec<u8>| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_else(|e| format!("(no log: {e:?})"));
        return Err(err(format!(
            "{what}: compilation failed ({:?}, options {}):\n{log}",
            e.0,
            opts.join(" ")
        )));
    }
    let mut size = 0usize;
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| err(format!("{what}: nvrtcGetCUBINSize failed: {e:?}")))?;
    let mut cubin = vec![0u8; size];
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| err(format!("{what}: nvrtcGetCUBIN failed: {e:?}")))?;
    Ok(cubin)
}

const MAGIC: &[u8; 8] = b"KILNCUBN";
/// Bump when the header or the key's meaning changes: old files then read as corrupt.
const FORMAT: u32 = 1;
/// magic, format (u32), reserved (u32), payload length (u64), FNV-1a of the payload (u64).
const HEADER: usize = 32;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A cache file: a header (magic, format version, length, checksum), then `payload`.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a cache file, or `None` when the file is truncated, padded,
/// of another format, or its checksum does not match.
pub fn decode(bytes: &[u8]) -> Option<&[u8]> {
    let (head, payload) = bytes.split_at_checked(HEADER)?;
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap());
    let format = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let ok = &head[..8] == MAGIC
        && format == FORMAT
        && u64_at(16) == payload.len() as u64
        && u64_at(24) == fnv1a(payload);
    ok.then_some(payload)
}

/// Counters of one [`KernelCache`] since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub memory_hits: usize,
    pub disk_hits: usize,
    pub compiles: usize,
    /// Files that failed the header check (then recompiled and overwritten).
    pub corrupt: usize,
    /// Files that could not be written (the memory cache still holds the entry).
    pub write_failures: usize,
}

/// The NVRTC output cache: CUBIN by (source, arch, NVRTC version, options), in
/// memory and, when it has a directory, on disk.
#[derive(Debug, Default)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
    memory_hits: AtomicUsize,
    disk_hits: AtomicUsize,
    compiles: AtomicUsize,
    corrupt: AtomicUsize,
    write_failures: AtomicUsize,
}

/// The disk cache directory from the environment (`var` reads a variable):
/// `cuda/` under the cache root of [`crate::cache_dir::root_from`]
/// (`$KILN_CACHE_DIR`, `$XDG_CACHE_HOME/kiln`, `$HOME/.cache/kiln`);
/// `KILN_CACHE_DIR=off` turns the disk cache off.
fn cache_dir_from(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    crate::cache_dir::root_from(var).map(|r| r.join("cuda"))
}

/// The process-wide cache's folder: [`cache_dir_from`] this environment,
/// created private (mode 0700) and refused when other users could write it.
fn private_cache_dir() -> Option<PathBuf> {
    let dir = cache_dir_from(|k| std::env::var(k).ok())?;
    match crate::cache_dir::ensure_private(&dir) {
        Ok(()) => Some(dir),
        Err(why) => {
            eprintln!(
                "kiln: warning: nvrtc cache: not using {}: {why}; caching in memory only",
                dir.display()
            );
            None
        }
    }
}

impl KernelCache {
    /// A cache over `dir` (created on first write), or memory only for `None`.
    pub fn new(dir: Option<PathBuf>) -> Self {
        KernelCache {
            dir,
            ..Default::default()
        }
    }

    /// The process-wide cache, its directory taken from the environment once
    /// (see `KILN_CACHE_DIR`, `XDG_CACHE_HOME`, `HOME`).
    pub fn global() -> &'static KernelCache {
        static GLOBAL: OnceLock<KernelCache> = OnceLock::new();
        GLOBAL.get_or_init(|| KernelCache::new(private_cache_dir()))
    }

    /// The disk cache's directory (None: memory only).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        CacheStats {
            memory_hits: n(&self.memory_hits),
            disk_hits: n(&self.disk_hits),
            compiles: n(&self.compiles),
            corrupt: n(&self.corrupt),
            write_failures: n(&self.write_failures),
        }
    }

    /// The file an entry lives in (whether or not it exists).
    pub fn path_for(&self, source: &str, arch: (i32, i32)) -> Result<Option<PathBuf>, Error> {
        Ok(self.path(Self::key(source, arch)?, arch))
    }

    fn path(&self, key: u64, arch: (i32, i32)) -> Option<PathBuf> {
        let name = format!("{key:016x}_sm{}{}.cubin", arch.0, arch.1);
        self.dir.as_ref().map(|d| d.join(name))
    }

    fn key(source: &str, arch: (i32, i32)) -> Result<u64, Error> {
        let (vmaj, vmin) = nvrtc_version()?;
        let opts = options(arch).join(" ");
        // The source goes last, so no two different inputs share one text.
        let text = format!(
            "nvrtc {vmaj}.{vmin}\nsm_{}{}\n{opts}\n{source}",
            arch.0, arch.1
        );
        Ok(stable_hash(&text))
    }

    /// The CUBIN of `source` for `arch`: from memory, else from disk, else compiled
    /// with [`compile_cubin`] and stored in both.
    pub fn get_or_compile(&self, source: &str, arch: (i32, i32)) -> Result<Arc<Vec<u8>>, Error> {
        let key = Self::key(source, arch)?;
        let lock = || self.memory.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = lock().get(&key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(c.clone());
        }
        // The lock is not held from here on: other kernels compile in parallel
        // (two threads racing on one kernel both compile; the first one stays).
        let path = self.path(key, arch);
        if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            if let Some(payload) = decode(&bytes) {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                let c = Arc::new(payload.to_vec());
                return Ok(lock().entry(key).or_insert(c).clone());
            }
            if self.corrupt.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!(
                    "kiln: warning: nvrtc cache: {} failed its checksum; recompiling it",
                    path.as_ref()
                        .map_or(String::new(), |p| p.display().to_string())
                );
            }
        }
        let cubin = Arc::new(compile_cubin(source, arch)?);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = &path {
            if let Err(e) = write_atomically(p, &encode(&cubin)) {
                // Only the first failure is printed: a read-only cache would
                // otherwise print once per kernel.
                if self.write_failures.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "kiln: nvrtc cache: cannot write {}: {e}; caching in memory only",
                        p.display()
                    );
                }
            }
        }
        Ok(lock().entry(key).or_insert(cubin).clone())
    }
}

/// Writes `bytes` atomically beside `path` (see [`crate::atomic_file`]),
/// creating the folder private (mode 0700) first.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache files live in a directory");
    crate::cache_dir::ensure_private(dir).map_err(std::io::Error::other)?;
    crate::atomic_file::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_codegen::{Inner, Kernel, KernelBuilder, Operand};
    use kiln_ir::{BinaryOp, DType::F32, UnaryOp};

    /// `out = exp(x) + y`, generated like the backend's kernels.
    fn source() -> String {
        let mut b = KernelBuilder::default();
        let x = b.load(1, F32);
        let y = b.load(2, F32);
        let e = b.unary(UnaryOp::Exp, x, F32);
        let z = b.binary(BinaryOp::Add, e, y, F32);
        let op = |inner| Operand { dtype: F32, inner };
        let k = Kernel {
            name: "exp_add".into(),
            rank: 2,
            operands: vec![
                op(Inner::Contiguous),
                op(Inner::Contiguous),
                op(Inner::Strided),
            ],
            scalars: vec![],
            body: b.instrs,
            reduce: None,
            epilogue: vec![],
            out: z,
            extra_out: vec![],
            rows: None,
        };
        kiln_codegen::cuda::cuda_source(&k).unwrap()
    }

    fn present(test: &str) -> bool {
        let p = super::super::nvrtc_present();
        if !p {
            eprintln!("nvrtc: library not found (put it on LD_LIBRARY_PATH), {test} skipped");
        }
        p
    }

    /// A fresh directory per test (tests run in parallel in one process).
    fn temp_dir(test: &str) -> PathBuf {
        let base =
            option_env!("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let d = base.join(format!("kiln-nvrtc-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// [memory_hits, disk_hits, compiles, corrupt]
    fn counts(c: &KernelCache) -> [usize; 4] {
        let s = c.stats();
        [s.memory_hits, s.disk_hits, s.compiles, s.corrupt]
    }

    #[test]
    fn cache_file_format_round_trips_and_detects_corruption() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let file = encode(&payload);
        assert_eq!(decode(&file), Some(&payload[..]));
        assert_eq!(decode(&encode(&[])), Some(&[][..]));
        for cut in [0, 5, HEADER - 1, HEADER, file.len() - 1] {
            assert_eq!(decode(&file[..cut]), None, "truncated to {cut}");
        }
        for i in [0, 8, 17, 25, HEADER, file.len() - 1] {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert_eq!(decode(&bad), None, "byte {i} flipped");
        }
        let mut padded = file.clone();
        padded.push(0);
        assert_eq!(decode(&padded), None);
    }

    #[test]
    fn cuda_cache_dir_follows_the_environment() {
        type Vars = &'static [(&'static str, &'static str)];
        #[rustfmt::skip]
        let cases: [(Vars, Option<&str>); 6] = [
            (&[("KILN_CACHE_DIR", "/k"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")], Some("/k/cuda")),
            (&[("KILN_CACHE_DIR", "off"), ("HOME", "/h")], None),
            (&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")], Some("/x/kiln/cuda")),
            (&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")], Some("/h/.cache/kiln/cuda")),
            (&[("KILN_CACHE_DIR", ""), ("HOME", "/h")], Some("/h/.cache/kiln/cuda")),
            (&[], None),
        ];
        for (vars, want) in cases {
            let got = cache_dir_from(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.into()));
            assert_eq!(got, want.map(PathBuf::from), "{vars:?}");
        }
    }

    #[test]
    fn cuda_kernel_names_are_found_in_the_source() {
        let n = kernel_names(&source());
        assert!(n.starts_with("kiln_exp_add_") && !n.contains(','), "{n}");
        assert_eq!(
            kernel_names("__global__ void a(){} __global__ void b_2 (){}"),
            "a, b_2"
        );
    }

    #[test]
    fn nvrtc_missing_is_an_error_not_a_panic() {
        if super::super::nvrtc_present() {
            return;
        }
        let e = compile_cubin(&source(), (9, 0)).unwrap_err().to_string();
        assert!(
            e.starts_with("nvrtc: NVRTC (libnvrtc.so) cannot be loaded"),
            "{e}"
        );
        let cache = KernelCache::new(None);
        assert!(cache.get_or_compile(&source(), (9, 0)).is_err());
    }

    #[test]
    fn nvrtc_compiles_to_cubin() {
        if !present("nvrtc_compiles_to_cubin") {
            return;
        }
        let cubin = compile_cubin(&source(), (9, 0)).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
        // NVRTC itself rejects an arch it does not know, with a log.
        let e = compile_cubin(&source(), (0, 0)).unwrap_err().to_string();
        assert!(
            e.contains("kiln_exp_add_") && e.contains("--gpu-architecture"),
            "{e}"
        );
    }

    #[test]
    fn nvrtc_compile_error_has_the_log_and_the_kernel() {
        if !present("nvrtc_compile_error_has_the_log_and_the_kernel") {
            return;
        }
        let bad = source().replace("expf(", "undeclared_fn(");
        assert_ne!(bad, source());
        let cache = KernelCache::new(None);
        let e = cache.get_or_compile(&bad, (9, 0)).unwrap_err().to_string();
        assert!(e.starts_with("nvrtc: kiln_exp_add_"), "{e}");
        assert!(
            e.contains("for sm_90") && e.contains("compilation failed"),
            "{e}"
        );
        assert!(
            e.contains("error") && e.contains("undeclared_fn"),
            "NVRTC's log: {e}"
        );
    }

    #[test]
    fn nvrtc_cache_memory_disk_and_arch() {
        if !present("nvrtc_cache_memory_disk_and_arch") {
            return;
        }
        let dir = temp_dir("cache");
        let src = source();
        let first = KernelCache::new(Some(dir.clone()));
        let a = first.get_or_compile(&src, (9, 0)).unwrap();
        assert_eq!(counts(&first), [0, 0, 1, 0]);
        let b = first.get_or_compile(&src, (9, 0)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(counts(&first), [1, 0, 1, 0]);
        let path = first.path_for(&src, (9, 0)).unwrap().unwrap();
        assert!(path.to_string_lossy().ends_with("_sm90.cubin"), "{path:?}");
        assert_eq!(decode(&std::fs::read(&path).unwrap()), Some(&a[..]));

        // A second process: loads, does not compile.
        let second = KernelCache::new(Some(dir.clone()));
        assert_eq!(second.get_or_compile(&src, (9, 0)).unwrap(), a);
        assert_eq!(counts(&second), [0, 1, 0, 0]);
        // Another arch is another entry and another file.
        let old = second.get_or_compile(&src, (8, 0)).unwrap();
        assert_ne!(old, a);
        assert_eq!(counts(&second), [0, 1, 1, 0]);
        assert_ne!(second.path_for(&src, (8, 0)).unwrap().unwrap(), path);
        // Two files, no temporary one left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

        // Truncated, then one payload byte flipped: detected, recompiled, rewritten.
        let file = std::fs::read(&path).unwrap();
        let mut flipped = file.clone();
        flipped[HEADER + 100] ^= 1;
        for bad in [&file[..file.len() / 2], &flipped[..]] {
            std::fs::write(&path, bad).unwrap();
            let third = KernelCache::new(Some(dir.clone()));
            assert_eq!(third.get_or_compile(&src, (9, 0)).unwrap(), a);
            assert_eq!(counts(&third), [0, 0, 1, 1]);
            assert_eq!(std::fs::read(&path).unwrap(), file);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nvrtc_cache_survives_an_unwritable_dir() {
        if !present("nvrtc_cache_survives_an_unwritable_dir") {
            return;
        }
        // A file where the directory should be: every write fails.
        let blocker = temp_dir("unwritable");
        std::fs::write(&blocker, b"not a directory").unwrap();
        let c = KernelCache::new(Some(blocker.join("cuda")));
        let a = c.get_or_compile(&source(), (9, 0)).unwrap();
        assert_eq!(&a[..4], b"\x7fELF");
        assert_eq!(c.get_or_compile(&source(), (9, 0)).unwrap(), a);
        let s = c.stats();
        assert_eq!((s.memory_hits, s.compiles, s.write_failures), (1, 1, 1));
        let _ = std::fs::remove_file(&blocker);
    }
}
