//! Compiles CUDA C from the cuda backend with real NVRTC for sm_90 (to CUBIN,
//! so ptxas checks the inline PTX too): every unary and binary op (also in
//! f16/bf16), casts between all dtypes, every reduction kind (also over half
//! inputs), epilogues, scalars, several ranks, multi-output in-place kernels,
//! the vector path of rank-1 contiguous kernels for every dtype, and the
//! snapshot kernels.
//!
//! NVRTC is loaded at run time (cudarc's dynamic loading). When it cannot be
//! loaded the test says so and passes; `.ci/run` installs it from PyPI
//! (`nvidia-cuda-nvrtc`) and puts it on `LD_LIBRARY_PATH`. `KILN_NVRTC_LIB`
//! may name the library file instead.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
use kiln_codegen::cuda::cuda_source;
use kiln_codegen::{AccPart, Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};
use std::io::Write;
use DType::*;

#[path = "common/multi_out.rs"]
mod multi_out;

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

fn pointwise(name: &str, rank: usize, ops: Vec<Operand>, b: KernelBuilder, out: usize) -> Kernel {
    Kernel {
        name: name.into(),
        rank,
        operands: ops,
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
        extra_out: vec![],
        rows: None,
    }
}

fn unary_ops() -> Vec<UnaryOp> {
    UnaryOp::EXAMPLES.to_vec()
}

fn binary_ops() -> Vec<BinaryOp> {
    BinaryOp::ALL.to_vec()
}

fn unary(u: UnaryOp, dt: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let y = b.unary(u, x, dt);
    let ops = vec![op(dt, Inner::Contiguous), op(dt, Inner::Strided)];
    pointwise(&format!("{u}.{dt}"), 2, ops, b, y)
}

fn binary(o: BinaryOp, dt: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let y = b.load(2, dt);
    let rd = if o.is_comparison() { Bool } else { dt };
    let z = b.binary(o, x, y, rd);
    let ops = vec![
        op(rd, Inner::Contiguous),
        op(dt, Inner::Contiguous),
        op(dt, Inner::Broadcast),
    ];
    pointwise(&format!("{o}.{dt}"), 3, ops, b, z)
}

fn cast(from: DType, to: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, from);
    let y = b.cast(x, to);
    let ops = vec![op(to, Inner::Contiguous), op(from, Inner::Contiguous)];
    pointwise(&format!("cast.{from}.{to}"), 1, ops, b, y)
}

/// Rank 1, every operand contiguous (the vector path): `x + y`, `x && y` for bool.
fn vector(dt: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let y = b.load(2, dt);
    let o = if dt == Bool {
        BinaryOp::And
    } else {
        BinaryOp::Add
    };
    let z = b.binary(o, x, y, dt);
    let ops = vec![op(dt, Inner::Contiguous); 3];
    pointwise(&format!("vector.{dt}"), 1, ops, b, z)
}

/// `out = half(f32(x) * y + s0)` as the frontend builds it, x in `dt`, y f32:
/// the half snapshot kernel when `dt` is f16.
fn half_axpy(dt: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let x = b.cast(x, F32);
    let y = b.load(2, F32);
    let s = b.scalar(0, F32);
    let m = b.binary(BinaryOp::Mul, x, y, F32);
    let a = b.binary(BinaryOp::Add, m, s, F32);
    let h = b.cast(a, dt);
    let ops = vec![
        op(dt, Inner::Contiguous),
        op(dt, Inner::Contiguous),
        op(F32, Inner::Contiguous),
    ];
    let mut k = pointwise(&format!("axpy.{dt}"), 1, ops, b, h);
    k.scalars = vec![F32];
    k
}

/// A row sum of a half input in f32, stored as a half (as the frontend does).
fn half_sum(dt: DType, rank: usize) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let v = b.cast(x, F32);
    let n = b.instrs.len();
    let ops = vec![op(dt, Inner::Broadcast), op(dt, Inner::Strided)];
    let mut k = pointwise(&format!("sum.{dt}.f32"), rank, ops, b, n + 1);
    k.reduce = Some(Reduction {
        kind: ReduceKind::Sum,
        value: v,
        dtype: F32,
    });
    k.epilogue = vec![(Instr::Acc, F32), (Instr::Cast(n), dt)];
    k
}

/// `where(x > s0, x * s1, c)` with runtime scalars, at rank 0 and 4.
fn scalars(dt: DType, rank: usize) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let s0 = b.scalar(0, dt);
    let s1 = b.scalar(1, F64);
    let c = b.constant(2.5, dt);
    let gt = b.binary(BinaryOp::Gt, x, s0, Bool);
    let s1 = b.cast(s1, dt);
    let m = b.binary(BinaryOp::Mul, x, s1, dt);
    let w = b.select(gt, m, c, dt);
    let ops = vec![op(dt, Inner::Contiguous), op(dt, Inner::Contiguous)];
    let mut k = pointwise(&format!("scalars.{dt}"), rank, ops, b, w);
    k.scalars = vec![dt, F64];
    k
}

/// reduce(kind) of `x * 2` along the last dim, epilogue `acc (+ load) `.
fn reduction(kind: ReduceKind, dt: DType, rank: usize, epi_load: bool) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let two = b.constant(2.0, dt);
    let v = b.binary(BinaryOp::Mul, x, two, dt);
    let arg = matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let acc_dt = if arg { I64 } else { dt };
    let nb = b.instrs.len();
    let mut epilogue = vec![(Instr::Acc, acc_dt)];
    let mut ops = vec![op(acc_dt, Inner::Broadcast), op(dt, Inner::Strided)];
    if epi_load {
        epilogue.push((Instr::Load(2), acc_dt));
        epilogue.push((Instr::Binary(BinaryOp::Add, nb, nb + 1), acc_dt));
        ops.push(op(acc_dt, Inner::Broadcast));
    }
    let out = nb + epilogue.len() - 1;
    // the other results of one-pass reductions are stored after it
    let mut extra_out = vec![];
    for &p in parts(kind) {
        epilogue.push((Instr::AccPart(p), acc_dt));
        extra_out.push(nb + epilogue.len() - 1);
    }
    Kernel {
        name: format!("{kind}.{dt}"),
        rank,
        operands: ops,
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind,
            value: v,
            dtype: acc_dt,
        }),
        epilogue,
        out,
        extra_out,
        rows: None,
    }
}

/// The parts a kind gives besides `acc`.
fn parts(kind: ReduceKind) -> &'static [AccPart] {
    match kind {
        ReduceKind::LogSumExp => &[AccPart::Shift, AccPart::LogSum],
        ReduceKind::Welford => &[AccPart::Mean],
        _ => &[],
    }
}

/// The three kernels of the snapshot tests.
fn snapshot_kernels() -> Vec<Kernel> {
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let y = b.load(2, F32);
    let z = b.binary(BinaryOp::Add, x, y, F32);
    let add = pointwise(
        "add",
        2,
        vec![
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ],
        b,
        z,
    );
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let e = b.unary(UnaryOp::Exp, x, F32);
    let exp = pointwise(
        "exp",
        2,
        vec![op(F32, Inner::Contiguous), op(F32, Inner::Strided)],
        b,
        e,
    );
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let m = b.load(2, F32);
    let d = b.binary(BinaryOp::Sub, x, m, F32);
    let e = b.unary(UnaryOp::Exp, d, F32);
    let n = b.instrs.len();
    let mut sum = pointwise(
        "softmax.sum",
        2,
        vec![
            op(F32, Inner::Broadcast),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ],
        b,
        n,
    );
    sum.reduce = Some(Reduction {
        kind: ReduceKind::Sum,
        value: e,
        dtype: F32,
    });
    sum.epilogue = vec![(Instr::Acc, F32)];
    vec![add, exp, sum]
}

fn corpus() -> Vec<Kernel> {
    let mut ks = snapshot_kernels();
    for u in unary_ops() {
        ks.push(unary(u, F32));
        ks.push(unary(u, F64));
    }
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Square, UnaryOp::Relu] {
        for dt in [U8, I8, I16, I32, I64] {
            ks.push(unary(u, dt));
        }
    }
    ks.push(unary(UnaryOp::Not, Bool));
    for u in unary_ops() {
        if u != UnaryOp::Not {
            ks.push(unary(u, F16));
            ks.push(unary(u, BF16));
        }
    }
    for o in binary_ops() {
        for dt in [F32, F64, I32, I64, U8, I8, F16, BF16] {
            ks.push(binary(o, dt));
        }
    }
    for o in [BinaryOp::And, BinaryOp::Or, BinaryOp::Eq, BinaryOp::Ne] {
        ks.push(binary(o, Bool));
    }
    for from in DType::ALL {
        for to in DType::ALL {
            if from != to {
                ks.push(cast(from, to));
            }
        }
    }
    for dt in [F32, F64, I32, I64, F16, BF16] {
        ks.push(scalars(dt, 0));
        ks.push(scalars(dt, 4));
    }
    for kind in ReduceKind::ALL {
        for dt in [F32, F64, I64, I32, U8, F16, BF16] {
            if kind.float_only() && !dt.is_float() {
                continue;
            }
            ks.push(reduction(kind, dt, 2, false));
        }
        ks.push(reduction(kind, F32, 1, true));
        ks.push(reduction(kind, F32, 3, true));
    }
    for dt in [F32, F64] {
        ks.push(multi_out::adam_step(
            dt,
            1,
            Inner::Contiguous,
            Inner::Contiguous,
        ));
        ks.push(multi_out::adam_step(
            dt,
            0,
            Inner::Strided,
            Inner::Broadcast,
        ));
        ks.push(multi_out::swap(dt, Bool, 2, Inner::Strided));
        ks.push(multi_out::lstm_cell(
            dt,
            2,
            Inner::Contiguous,
            Inner::Broadcast,
        ));
    }
    for dt in DType::ALL {
        ks.push(vector(dt));
    }
    for dt in [F16, BF16] {
        ks.push(half_axpy(dt));
        ks.push(half_sum(dt, 1));
        ks.push(half_sum(dt, 3));
        ks.push(multi_out::adam_step(
            dt,
            1,
            Inner::Contiguous,
            Inner::Contiguous,
        ));
        ks.push(multi_out::swap(dt, F32, 1, Inner::Contiguous));
        ks.push(multi_out::lstm_cell(
            dt,
            1,
            Inner::Contiguous,
            Inner::Contiguous,
        ));
    }
    ks
}

/// Loads NVRTC if possible; the reason it is not otherwise.
fn nvrtc_available() -> bool {
    if let Ok(p) = std::env::var("KILN_NVRTC_LIB") {
        extern "C" {
            fn dlopen(file: *const std::ffi::c_char, mode: i32) -> *mut std::ffi::c_void;
        }
        if let Ok(c) = std::ffi::CString::new(p) {
            // RTLD_NOW | RTLD_GLOBAL: cudarc's later dlopen by soname finds it.
            unsafe { dlopen(c.as_ptr(), 0x2 | 0x100) };
        }
    }
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles for sm_90 (a real architecture: NVRTC runs ptxas, so inline PTX
/// is checked too, as a load on the GPU would).
fn compile(name: &str, src: &str) -> Result<(), String> {
    let opts = CompileOptions {
        arch: Some("sm_90"),
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    match compile_ptx_with_opts(src, opts) {
        Ok(_) => Ok(()),
        Err(CompileError::CompileError { log, .. }) => Err(log.to_string_lossy().into_owned()),
        Err(e) => Err(format!("{e:?}")),
    }
}

#[test]
fn nvrtc_compiles_every_kernel() {
    let ks = corpus();
    // The text is produced (and valid) whether or not NVRTC is here.
    let srcs: Vec<(String, String)> = ks
        .iter()
        .map(|k| {
            let s = cuda_source(k).unwrap_or_else(|e| panic!("{e}\n{}", k.to_text()));
            (k.name.clone(), s)
        })
        .collect();
    let mut err = std::io::stderr();
    if !nvrtc_available() {
        let _ = writeln!(
            err,
            "nvrtc: library not found (set KILN_NVRTC_LIB or LD_LIBRARY_PATH), skipped"
        );
        return;
    }
    // NVRTC's cost is mostly per program: compile batches of kernels, each
    // wrapped in its own namespace (helpers repeat; the extern "C" names differ),
    // and recompile a failing batch kernel by kernel to report each log.
    // The check can fail: NVRTC rejects broken code with a readable log.
    let bad = compile("bad", "extern \"C\" __global__ void f() { undeclared(); }");
    assert!(bad.unwrap_err().contains("undeclared"));
    // and ptxas runs: the half helpers' inline PTX is checked, not just passed through
    let asm = "extern \"C\" __global__ void f(float* p) { float x; asm(\"bogus.f32 %0;\" : \"=f\"(x)); p[0] = x; }";
    assert!(compile("asm", asm).is_err(), "inline PTX went unchecked");
    let mut failed = vec![];
    for chunk in srcs.chunks(48) {
        let batch: String = chunk
            .iter()
            .enumerate()
            .map(|(i, (_, s))| format!("namespace k{i} {{\n{s}}}\n"))
            .collect();
        if compile("batch", &batch).is_ok() {
            continue;
        }
        for (name, src) in chunk {
            if let Err(log) = compile(name, src) {
                failed.push(format!("{name}:\n{log}\n{src}"));
            }
        }
    }
    let _ = writeln!(
        err,
        "nvrtc: {} kernels compiled, {} failed",
        srcs.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
