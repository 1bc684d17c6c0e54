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

struct Case {
    label: String,
    k: Kernel,
    sizes: Vec<usize>,
    /// (strides, storage); `views[0]` is the output.
    views: Vec<(Vec<isize>, Vec<u8>)>,
    scalars: Vec<u64>,
    tol: Tol,
    grid: u32,
    block: u32,
}

const LAYOUTS: [Layout; 4] = [
    Layout::Contiguous,
    Layout::Permuted,
    Layout::Broadcast,
    Layout::OuterBroadcast,
];

fn kernel(name: &str, rank: usize, operands: Vec<Operand>, b: KernelBuilder, out: usize) -> Kernel {
    Kernel {
        name: name.into(),
        rank,
        operands,
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
    }
}

/// Pointwise `out = body(in1 [, in2])` cases for every shape of `rank`.
#[allow(clippy::too_many_arguments)]
fn pointwise_cases(
    cases: &mut Vec<Case>,
    label: &str,
    body: &dyn Fn(&mut KernelBuilder) -> usize,
    in_dts: &[DType],
    out_dt: DType,
    layouts: &[Layout],
    rank: usize,
    range: (f64, f64),
    scalars: (&[DType], &[u64]),
    rng: &mut Rng,
) {
    let mut b = KernelBuilder::default();
    let out = body(&mut b);
    for sizes in shapes(rank) {
        let (ost, olen) = layout(&sizes, Layout::Contiguous);
        let mut views = vec![(ost, vec![0u8; olen * out_dt.size()])];
        let mut operands = vec![op(out_dt, Inner::Contiguous)];
        for (i, &dt) in in_dts.iter().enumerate() {
            let (st, len) = layout(&sizes, layouts[i]);
            operands.push(op(dt, inner_of(&st)));
            views.push((st, gen(rng, dt, len, range.0, range.1, true)));
        }
        let mut k = kernel(label, rank, operands, b.clone_builder(), out);
        k.scalars = scalars.0.to_vec();
        cases.push(Case {
            label: format!("{label} {sizes:?} {layouts:?}"),
            k,
            sizes,
            views,
            scalars: scalars.1.to_vec(),
            tol: tol_for(out_dt),
            grid: 2,
            block: 64,
        });
    }
}

trait CloneBuilder {
    fn clone_builder(&self) -> KernelBuilder;
}
impl CloneBuilder for KernelBuilder {
    fn clone_builder(&self) -> KernelBuilder {
        KernelBuilder {
            instrs: self.instrs.clone(),
        }
    }
}

fn unary_ops() -> Vec<UnaryOp> {
    use UnaryOp::*;
    vec![
        Neg,
        Abs,
        Exp,
        Log,
        Log1p,
        Expm1,
        Sqrt,
        Rsqrt,
        Reciprocal,
        Square,
        Sin,
        Cos,
        Tanh,
        Erf,
        Floor,
        Not,
        Sigmoid,
        Relu,
        Gelu,
        GeluTanh,
        Silu,
        Softplus {
            beta: Float(1.0),
            threshold: Float(20.0),
        },
        LeakyRelu { slope: Float(0.01) },
        Elu { alpha: Float(1.0) },
    ]
}

fn binary_ops() -> Vec<BinaryOp> {
    use BinaryOp::*;
    vec![
        Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder, Fmod, FloorDiv, Eq, Ne, Lt, Le, Gt,
        Ge, And, Or,
    ]
}

/// reduce(kind) of `x * 2` along the last dim; epilogue `acc (+ load in2)`.
#[allow(clippy::too_many_arguments)]
fn reduction_cases(
    cases: &mut Vec<Case>,
    kind: ReduceKind,
    dt: DType,
    in_layout: Layout,
    rank: usize,
    epi_load: bool,
    block: u32,
    rng: &mut Rng,
) {
    let arg = matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let acc_dt = if arg { I64 } else { dt };
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let two = b.constant(2.0, dt);
    let v = b.binary(BinaryOp::Mul, x, two, dt);
    let nb = b.instrs.len();
    let mut epilogue = vec![(Instr::Acc, acc_dt)];
    if epi_load {
        epilogue.push((Instr::Load(2), acc_dt));
        epilogue.push((Instr::Binary(BinaryOp::Add, nb, nb + 1), acc_dt));
    }
    let out = nb + epilogue.len() - 1;
    let sum_prod = matches!(kind, ReduceKind::Sum | ReduceKind::Prod);
    let (lo, hi) = match kind {
        ReduceKind::Prod => (-1.5, 1.5),
        _ => (-3.0, 3.0),
    };
    let shapes: Vec<Vec<usize>> = match rank {
        1 => vec![vec![1], vec![7], vec![37], vec![1000]],
        2 => vec![vec![3, 13], vec![5, 8], vec![2, 0], vec![4, 1], vec![2, 67]],
        _ => vec![vec![2, 3, 17], vec![3, 2, 9]],
    };
    for sizes in shapes {
        let outer = &sizes[..rank - 1];
        let (mut ost, olen) = layout(outer, Layout::Contiguous);
        ost.push(0);
        let mut views = vec![(ost.clone(), vec![0u8; olen * acc_dt.size()])];
        let (st, len) = layout(&sizes, in_layout);
        let mut operands = vec![op(acc_dt, Inner::Broadcast), op(dt, inner_of(&st))];
        let edges = !(sum_prod && dt.is_float());
        views.push((st, gen(rng, dt, len, lo, hi, edges)));
        if epi_load {
            operands.push(op(acc_dt, Inner::Broadcast));
            views.push((ost, gen(rng, acc_dt, olen, -1.0, 1.0, false)));
        }
        let n = *sizes.last().unwrap() as f64;
        let tol = if sum_prod && acc_dt.is_float() {
            Tol {
                rtol: 1e-4,
                atol: 1e-6 * n.max(1.0) * 2.0 * hi,
            }
        } else {
            tol_for(acc_dt)
        };
        let k = Kernel {
            name: format!("{kind}.{dt}"),
            rank,
            operands,
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: Some(Reduction {
                kind,
                value: v,
                dtype: acc_dt,
            }),
            epilogue: epilogue.clone(),
            out,
        };
        cases.push(Case {
            label: format!("{kind}.{dt} {sizes:?} {in_layout:?} epi={epi_load} block={block}"),
            k,
            sizes,
            views,
            scalars: vec![],
            tol,
            grid: 2,
            block,
        });
    }
}

/// The three kernels of the snapshot tests, on their snapshot layouts.
fn snapshot_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    let l = [Layout::Contiguous, Layout::OuterBroadcast];
    let add = |b: &mut KernelBuilder| {
        let x = b.load(1, F32);
        let y = b.load(2, F32);
        b.binary(BinaryOp::Add, x, y, F32)
    };
    // `add`'s in2 is broadcast along the inner dim: a [n0, 1]-like view.
    let mut b = KernelBuilder::default();
    let z = add(&mut b);
    for sizes in [vec![3usize, 13], vec![5, 8]] {
        let (ost, olen) = layout(&sizes, Layout::Contiguous);
        let (ist, ilen) = layout(&sizes, l[0]);
        let bst = vec![1isize, 0];
        let views = vec![
            (ost, vec![0u8; olen * 4]),
            (ist, gen(rng, F32, ilen, -3.0, 3.0, true)),
            (bst, gen(rng, F32, sizes[0], -3.0, 3.0, true)),
        ];
        let ops = vec![
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ];
        cases.push(Case {
            label: format!("snapshot add {sizes:?}"),
            k: kernel("add", 2, ops, b.clone_builder(), z),
            sizes,
            views,
            scalars: vec![],
            tol: F32TOL,
            grid: 2,
            block: 256,
        });
    }
    let mut rng2 = Rng(rng.0 ^ 0x55);
    pointwise_cases(
        cases,
        "exp",
        &|b| {
            let x = b.load(1, F32);
            b.unary(UnaryOp::Exp, x, F32)
        },
        &[F32],
        F32,
        &[Layout::Permuted],
        2,
        (-5.0, 5.0),
        (&[], &[]),
        &mut rng2,
    );
    // softmax.sum: out[i] = sum_j exp(x[i, j] - m[i]), block 256 as on a GPU.
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let m = b.load(2, F32);
    let d = b.binary(BinaryOp::Sub, x, m, F32);
    let e = b.unary(UnaryOp::Exp, d, F32);
    let n = b.instrs.len();
    for sizes in [vec![3usize, 13], vec![2, 300], vec![1, 1000]] {
        let (ost, olen) = layout(&sizes[..1], Layout::Contiguous);
        let ost = vec![ost[0], 0];
        let (ist, ilen) = layout(&sizes, Layout::Contiguous);
        let views = vec![
            (ost.clone(), vec![0u8; olen * 4]),
            (ist, gen(rng, F32, ilen, -20.0, 5.0, false)),
            (ost, gen(rng, F32, olen, -1.0, 1.0, false)),
        ];
        let ops = vec![
            op(F32, Inner::Broadcast),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ];
        let mut k = kernel("softmax.sum", 2, ops, b.clone_builder(), n);
        k.reduce = Some(Reduction {
            kind: ReduceKind::Sum,
            value: e,
            dtype: F32,
        });
        k.epilogue = vec![(Instr::Acc, F32)];
        cases.push(Case {
            label: format!("snapshot softmax.sum {sizes:?}"),
            k,
            tol: Tol {
                rtol: 1e-4,
                atol: 1e-6 * sizes[1] as f64 * 150.0,
            },
            sizes,
            views,
            scalars: vec![],
            grid: 2,
            block: 256,
        });
    }
}

fn all_cases() -> Vec<Case> {
    let mut rng = Rng(0x5eed_c0da);
    let mut cases = vec![];
    snapshot_cases(&mut cases, &mut rng);
    for (i, u) in unary_ops().into_iter().enumerate() {
        let (rank, l) = (1 + i % 3, LAYOUTS[i % 4]);
        let dts: &[DType] = match u {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square | UnaryOp::Relu => &[F32, I32, I64],
            UnaryOp::Not => &[Bool],
            _ => &[F32],
        };
        for &dt in dts {
            pointwise_cases(
                &mut cases,
                &format!("{u}.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    b.unary(u, x, dt)
                },
                &[dt],
                dt,
                &[l],
                rank,
                (-3.0, 3.0),
                (&[], &[]),
                &mut rng,
            );
        }
    }
    for (i, o) in binary_ops().into_iter().enumerate() {
        let rank = 1 + i % 3;
        let ls = [LAYOUTS[i % 4], LAYOUTS[(i + 1) % 4]];
        let dts: &[DType] = match o {
            BinaryOp::And | BinaryOp::Or => &[Bool, I32],
            _ => &[F32, I32, I64],
        };
        for &dt in dts {
            let rd = if o.is_comparison() { Bool } else { dt };
            pointwise_cases(
                &mut cases,
                &format!("{o}.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let y = b.load(2, dt);
                    b.binary(o, x, y, rd)
                },
                &[dt, dt],
                rd,
                &ls,
                rank,
                (-3.0, 3.0),
                (&[], &[]),
                &mut rng,
            );
        }
    }
    let casts = [
        (F32, I32),
        (F32, I64),
        (F32, U8),
        (F32, I8),
        (F32, Bool),
        (F32, F64),
        (F64, F32),
        (I64, F32),
        (I32, F64),
        (U8, I8),
        (I64, I16),
        (Bool, F32),
        (I8, U8),
    ];
    for (i, (from, to)) in casts.into_iter().enumerate() {
        pointwise_cases(
            &mut cases,
            &format!("cast.{from}.{to}"),
            &|b| {
                let x = b.load(1, from);
                b.cast(x, to)
            },
            &[from],
            to,
            &[LAYOUTS[i % 4]],
            1 + i % 3,
            (-300.0, 300.0),
            (&[], &[]),
            &mut rng,
        );
    }
    // where(x > s0, x * s1, 2.5) with runtime scalars, rank 0 and 2.
    for dt in [F32, I64] {
        let s0 = if dt.is_float() {
            0.25f64.to_bits()
        } else {
            (-7i64) as u64
        };
        let s1 = 1.5f64.to_bits();
        for rank in [0, 2] {
            pointwise_cases(
                &mut cases,
                &format!("scalars.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let s0 = b.scalar(0, dt);
                    let s1 = b.scalar(1, F64);
                    let c = b.constant(2.5, dt);
                    let gt = b.binary(BinaryOp::Gt, x, s0, Bool);
                    let s1 = b.cast(s1, dt);
                    let m = b.binary(BinaryOp::Mul, x, s1, dt);
                    b.select(gt, m, c, dt)
                },
                &[dt],
                dt,
                &[Layout::Contiguous],
                rank,
                (-3.0, 3.0),
                (&[dt, F64], &[s0, s1]),
                &mut rng,
            );
        }
    }
    use ReduceKind::*;
    let mut i = 0;
    for kind in [Sum, Prod, Max, Min, ArgMax, ArgMin] {
        for dt in [F32, I64] {
            for (rank, l) in [
                (1, Layout::Contiguous),
                (2, Layout::Permuted),
                (3, Layout::OuterBroadcast),
            ] {
                i += 1;
                let block = if i % 3 == 0 { 96 } else { 64 };
                reduction_cases(&mut cases, kind, dt, l, rank, rank == 3, block, &mut rng);
            }
        }
    }
    reduction_cases(
        &mut cases,
        Max,
        U8,
        Layout::Broadcast,
        2,
        false,
        32,
        &mut rng,
    );
    cases
}

/// Wrapper of `k` (already in namespace `ns`) with the CPU-style ABI.
fn wrapper(k: &Kernel, ns: &str) -> String {
    let name = cuda_kernel_name(k);
    let mut args = vec![];
    for (i, o) in k.operands.iter().enumerate() {
        let c = if i == 0 { "" } else { "const " };
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

/// Runs one case through the shim and the interpreter; Err describes a mismatch.
fn run_case(lib: &libloading::Library, c: &Case) -> Result<(), String> {
    let k = &c.k;
    let name = format!("{}_launch", cuda_kernel_name(k));
    let f: libloading::Symbol<LaunchFn> =
        unsafe { lib.get(name.as_bytes()) }.map_err(|e| format!("{name}: {e}"))?;
    let out_dt = k.operands[0].dtype;
    let mut out_i = c.views[0].1.clone();
    let mut out_s = c.views[0].1.clone();
    let strides: Vec<isize> = c.views.iter().flat_map(|v| v.0.iter().copied()).collect();
    let strides64: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    let sizes64: Vec<i64> = c.sizes.iter().map(|&s| s as i64).collect();
    let iter_dims = if k.reduce.is_some() {
        k.rank - 1
    } else {
        k.rank
    };
    let n0 = if iter_dims == 0 { 1 } else { c.sizes[0] };
    let ptrs = |out: &mut Vec<u8>| -> Vec<*mut u8> {
        std::iter::once(out.as_mut_ptr())
            .chain(c.views[1..].iter().map(|v| v.1.as_ptr() as *mut u8))
            .collect()
    };
    let pi = ptrs(&mut out_i);
    unsafe { run_kernel(k, &pi, &strides, &c.sizes, &c.scalars, 0, n0) };
    let ps = ptrs(&mut out_s);
    // dim 0 split in three calls, as the CPU backend's threads do.
    let cuts = [0, n0 / 3, (2 * n0) / 3, n0];
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
    let sz = out_dt.size();
    for e in 0..out_i.len() / sz {
        let a = Val::from_le_bytes(&out_s[e * sz..], out_dt);
        let b = Val::from_le_bytes(&out_i[e * sz..], out_dt);
        if !close(a, b, &c.tol) {
            return Err(format!(
                "{}: element {e}: shim {a:?} vs interp {b:?}\n{}",
                c.label,
                k.to_text()
            ));
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
