//! Runs the CUDA C of the cuda backend on the CPU through a C++ shim
//! (`kiln_codegen::cuda::shim`) and compares it with the KernelIR
//! interpreter on the same inputs.
//!
//! Every kernel gets the shim's wrapper with the CPU-style ABI, so every
//! kernel is called the same way from Rust; all of them go into ONE library
//! built by one `c++` run and cached in the target dir's tmp under a hash of
//! its text. Without `c++` the test prints a skip line and passes.
//!
//! Every operand's storage starts 16-byte aligned, or a case's number of
//! elements past that (`Case::shift`), so the vector path of rank-1
//! pointwise kernels is tested taken and not taken.
//!
//! Tolerances: f32 rtol 1e-5 / atol 1e-6 and f64 rtol 1e-12 (glibc's math
//! functions on both sides here, but the interpreter may round through f64);
//! f16/bf16 one unit in the last place of the half type (an f32 result a few
//! ulp off may round the other way), and exactly where no transcendental runs;
//! integers and Max/Min/ArgMax/ArgMin exactly. Float Sum and Prod are added
//! in the kernel's tree order (per-thread strided partials, then warp
//! shuffles, then the block), not the interpreter's sequential order, so they
//! get rtol 1e-4 plus an atol of 1e-6 * row length * max |value|. Float
//! Sum/Prod inputs have no edge values (1e30 - 1e30 cancels order-dependently).

mod common;

use common::*;
use kiln_codegen::cuda::cuda_kernel_name;
use kiln_codegen::cuda::shim::{self, ShimLibrary};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

#[path = "cuda_shim/cases.rs"]
mod cases;
#[path = "cuda_shim/half.rs"]
mod half;
#[path = "cuda_shim/rows.rs"]
mod rows;
#[path = "cuda_shim/vector.rs"]
mod vector;

use cases::{all_cases, Case};

/// Compiles the kernels into one library (cached by hash); None without `c++`.
fn build(kernels: &BTreeMap<String, &Kernel>) -> Result<Option<ShimLibrary>, String> {
    if !shim::compiler_present() {
        return Ok(None);
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_shim");
    ShimLibrary::build(kernels.values().copied(), &dir)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Storage starting 16-byte aligned plus `shift` bytes, so whether the
/// vector path's alignment check passes is the case's choice, not the
/// allocator's.
struct Buf {
    mem: Vec<u8>,
    at: usize,
    len: usize,
}

impl Buf {
    fn new(bytes: &[u8], shift: usize) -> Buf {
        let mut mem = vec![0u8; bytes.len() + 16 + shift];
        let at = (16 - mem.as_ptr() as usize % 16) % 16 + shift;
        mem[at..at + bytes.len()].copy_from_slice(bytes);
        Buf {
            mem,
            at,
            len: bytes.len(),
        }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.mem[self.at..].as_mut_ptr()
    }
    fn bytes(&self) -> &[u8] {
        &self.mem[self.at..self.at + self.len]
    }
}

/// Runs one case through the shim and the interpreter (every output, an
/// in-place one starting from the case's data); Err describes a mismatch.
fn run_case(lib: &ShimLibrary, c: &Case) -> Result<(), String> {
    let k = &c.k;
    let f = lib.launcher(k).map_err(|e| e.to_string())?;
    let nout = k.outputs();
    let bufs = |range: std::ops::Range<usize>| -> Vec<Buf> {
        range
            .map(|i| {
                let shift = c.shift.get(i).copied().unwrap_or(0);
                Buf::new(&c.views[i].1, shift * k.operands[i].dtype.size())
            })
            .collect()
    };
    let mut out_i = bufs(0..nout);
    let mut out_s = bufs(0..nout);
    let mut inputs = bufs(nout..c.views.len());
    let in_ptrs: Vec<*mut u8> = inputs.iter_mut().map(Buf::ptr).collect();
    let strides: Vec<isize> = c.views.iter().flat_map(|v| v.0.iter().copied()).collect();
    let strides64: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    let sizes64: Vec<i64> = c.sizes.iter().map(|&s| s as i64).collect();
    let iter_dims = if k.reduce.is_some() {
        k.rank - 1
    } else {
        k.rank
    };
    let n0 = if iter_dims == 0 { 1 } else { c.sizes[0] };
    let ptrs = |outs: &mut Vec<Buf>| -> Vec<*mut u8> {
        outs.iter_mut()
            .map(Buf::ptr)
            .chain(in_ptrs.iter().copied())
            .collect()
    };
    let pi = ptrs(&mut out_i);
    unsafe { run_kernel(k, &pi, &strides, &c.sizes, &c.scalars, 0, n0) };
    let ps = ptrs(&mut out_s);
    // dim 0 split in three calls, as the CPU backend's threads do (but
    // one call without a dim to split: in place, it must run once); a
    // chunk's `p + start` is aligned or not as it falls.
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
        let (got, want) = (got.bytes(), want.bytes());
        let dt = k.operands[op].dtype;
        let sz = dt.size();
        for e in 0..want.len() / sz {
            let a = Val::from_le_bytes(&got[e * sz..], dt);
            let b = Val::from_le_bytes(&want[e * sz..], dt);
            if !close(a, b, &c.tol) {
                let inputs: Vec<String> = (nout..c.views.len())
                    .map(|i| {
                        let d = k.operands[i].dtype;
                        let v = &c.views[i].1;
                        let at = (e * d.size()).min(v.len().saturating_sub(d.size()));
                        format!("in{i}[{e}] = {:?}", Val::from_le_bytes(&v[at..], d))
                    })
                    .collect();
                return Err(format!(
                    "{}: out{op} element {e}: shim {a:?} vs interp {b:?} ({})\n{}",
                    c.label,
                    inputs.join(", "),
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
    let lib = match build(&kernels) {
        Ok(Some(lib)) => lib,
        Ok(None) => {
            let _ = writeln!(err, "cuda-shim: no c++ compiler found, skipped");
            return;
        }
        Err(e) => panic!("{e}"),
    };
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
