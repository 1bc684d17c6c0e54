//! Runs the CUDA C of the cuda backend on the CPU through a C++ shim
//! (`cuda_shim/kiln_cuda_shim.h`) and compares it with the KernelIR
//! interpreter on the same inputs.
//!
//! Every kernel gets a generated wrapper `<name>_launch(void** ptrs,
//! const long long* sizes, const long long* strides, const unsigned long
//! long* scalars, long long start, long long end, unsigned grid, unsigned
//! block)` that takes the CPU-style ABI and calls the kernel for every
//! (block, thread), so every kernel is called the same way from Rust. All of
//! them go into ONE .cpp compiled by ONE `c++ -O1 -shared -fPIC -std=c++17
//! -pthread`; the library is cached in the target dir's tmp under a hash of
//! its text. Without `c++` the test prints a skip line and passes.
//!
//! Tolerances: f32 rtol 1e-5 / atol 1e-6 and f64 rtol 1e-12 (glibc's math
//! functions on both sides here, but the interpreter may round through f64);
//! integers and Max/Min/ArgMax/ArgMin exactly. Float Sum and Prod are added
//! in the kernel's tree order (per-thread strided partials, then warp
//! shuffles, then the block), not the interpreter's sequential order, so they
//! get rtol 1e-4 plus an atol of 1e-6 * row length * max |value|. Float
//! Sum/Prod inputs have no edge values (1e30 - 1e30 cancels order-dependently).

mod common;

use common::*;
use kiln_codegen::cuda::{c_storage_type, cuda_kernel_name, cuda_source, stable_hash};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

const HEADER: &str = include_str!("cuda_shim/kiln_cuda_shim.h");
const FLAGS: [&str; 6] = ["-O1", "-shared", "-fPIC", "-std=c++17", "-pthread", "-w"];

type LaunchFn = unsafe extern "C" fn(
    *const *mut u8,
    *const i64,
    *const i64,
    *const u64,
    i64,
    i64,
    u32,
    u32,
) -> i32;

#[path = "cuda_shim/cases.rs"]
mod cases;

use cases::{all_cases, Case};

/// Wrapper of `k` (already in namespace `ns`) with the CPU-style ABI.
fn wrapper(k: &Kernel, ns: &str) -> String {
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
    let sync = cuda_source(k).unwrap().contains("__syncthreads");
    format!(
        "extern \"C\" int {name}_launch(void** p, const long long* n, const long long* s,\n\
         \x20   const unsigned long long* sc, long long start, long long end, unsigned grid,\n\
         \x20   unsigned block) {{\n\
         \x20 (void)p; (void)n; (void)s; (void)sc;\n\
         \x20 return kiln_shim::launch(grid, block, {sync}, [&] {{ {ns}::{name}({}); }});\n}}\n",
        args.join(", ")
    )
}

/// Compiles the kernels into one library (cached by hash); None without `c++`.
fn build(kernels: &BTreeMap<String, &Kernel>) -> Result<Option<PathBuf>, String> {
    let mut cpp = String::from(HEADER);
    for (i, k) in kernels.values().enumerate() {
        let src = cuda_source(k).map_err(|e| format!("{e}\n{}", k.to_text()))?;
        cpp.push_str(&format!("namespace k{i} {{\n{src}}}\n"));
        cpp.push_str(&wrapper(k, &format!("k{i}")));
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_shim");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let key = stable_hash(&format!("{}\n{cpp}", FLAGS.join(" ")));
    let so = dir.join(format!("shim_{key:016x}.so"));
    if so.exists() {
        return Ok(Some(so));
    }
    if Command::new("c++").arg("--version").output().is_err() {
        return Ok(None);
    }
    let src = dir.join(format!("shim_{key:016x}.cpp"));
    std::fs::write(&src, &cpp).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("shim_{key:016x}.{}.tmp", std::process::id()));
    let out = Command::new("c++")
        .args(FLAGS)
        .arg(&src)
        .arg("-o")
        .arg(&tmp)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "c++ failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&tmp, &so).map_err(|e| e.to_string())?;
    Ok(Some(so))
}

/// Runs one case through the shim and the interpreter (every output, an
/// in-place one starting from the case's data); Err describes a mismatch.
fn run_case(lib: &libloading::Library, c: &Case) -> Result<(), String> {
    let k = &c.k;
    let name = format!("{}_launch", cuda_kernel_name(k));
    let f: libloading::Symbol<LaunchFn> =
        unsafe { lib.get(name.as_bytes()) }.map_err(|e| format!("{name}: {e}"))?;
    let nout = k.outputs();
    let mut out_i: Vec<Vec<u8>> = c.views[..nout].iter().map(|v| v.1.clone()).collect();
    let mut out_s = out_i.clone();
    let strides: Vec<isize> = c.views.iter().flat_map(|v| v.0.iter().copied()).collect();
    let strides64: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    let sizes64: Vec<i64> = c.sizes.iter().map(|&s| s as i64).collect();
    let iter_dims = if k.reduce.is_some() {
        k.rank - 1
    } else {
        k.rank
    };
    let n0 = if iter_dims == 0 { 1 } else { c.sizes[0] };
    let ptrs = |outs: &mut Vec<Vec<u8>>| -> Vec<*mut u8> {
        outs.iter_mut()
            .map(|o| o.as_mut_ptr())
            .chain(c.views[nout..].iter().map(|v| v.1.as_ptr() as *mut u8))
            .collect()
    };
    let pi = ptrs(&mut out_i);
    unsafe { run_kernel(k, &pi, &strides, &c.sizes, &c.scalars, 0, n0) };
    let ps = ptrs(&mut out_s);
    // dim 0 split in three calls, as the CPU backend's threads do (but
    // one call without a dim to split: in place, it must run once).
    let cuts = if iter_dims == 0 {
        vec![0, n0]
    } else {
        vec![0, n0 / 3, (2 * n0) / 3, n0]
    };
    for w in cuts.windows(2) {
        let rc = unsafe {
            f(
                ps.as_ptr(),
                sizes64.as_ptr(),
                strides64.as_ptr(),
                c.scalars.as_ptr(),
                w[0] as i64,
                w[1] as i64,
                c.grid,
                c.block,
            )
        };
        if rc != 0 {
            return Err(format!("{}: launch returned {rc}", c.label));
        }
    }
    for (op, (got, want)) in out_s.iter().zip(&out_i).enumerate() {
        let dt = k.operands[op].dtype;
        let sz = dt.size();
        for e in 0..want.len() / sz {
            let a = Val::from_le_bytes(&got[e * sz..], dt);
            let b = Val::from_le_bytes(&want[e * sz..], dt);
            if !close(a, b, &c.tol) {
                return Err(format!(
                    "{}: out{op} element {e}: shim {a:?} vs interp {b:?}\n{}",
                    c.label,
                    k.to_text()
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn cuda_c_on_cpu_shim_matches_interpreter() {
    let cases = all_cases();
    let mut kernels: BTreeMap<String, &Kernel> = BTreeMap::new();
    for c in &cases {
        kernels.entry(cuda_kernel_name(&c.k)).or_insert(&c.k);
    }
    let mut err = std::io::stderr();
    let so = match build(&kernels) {
        Ok(Some(so)) => so,
        Ok(None) => {
            let _ = writeln!(err, "cuda-shim: no c++ compiler found, skipped");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let mut failed = vec![];
    for c in &cases {
        if let Err(e) = run_case(&lib, c) {
            failed.push(e);
        }
    }
    let t = cases.len();
    let _ = writeln!(
        err,
        "cuda-shim kernels: {}/{t} ({} distinct kernels)",
        t - failed.len(),
        kernels.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
