//! The template kernels — the implicit-GEMM conv (`kiln_codegen::cuda::conv`)
//! and the batched GEMM (`kiln_codegen::cuda::gemm`) — run through the C++
//! shim against direct loops written here, and compiled by NVRTC for sm_90
//! when NVRTC can be loaded.
//!
//! The geometries cover what the tiling and the patch indexing can get
//! wrong: more output channels than one 64-row tile, output positions not a
//! multiple of 64, reductions shorter and longer than one 16-deep slice,
//! stride, padding, dilation, groups, 1-d, and a grid smaller than the tile
//! count (blocks loop). Each runs bare and with a fused epilogue
//! `max(conv * scale[c] + shift[c], 0) + sc0` (a folded BatchNorm + ReLU plus
//! a scalar), whose operands arrive with broadcast strides.

use kiln_codegen::cuda::conv::{conv_template, ConvSpec, Epilogue, GEOMETRY};
use kiln_codegen::cuda::gemm::{gemm_template, GemmSpec};
use kiln_codegen::cuda::shim::{self, ShimLibrary};
use kiln_codegen::cuda::take::take_template;
use kiln_codegen::cuda::TemplateKernel;
use kiln_codegen::{Inner, Kernel, KernelBuilder, Operand};
use kiln_ir::{BinaryOp, DType};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy)]
struct Geom {
    n: usize,
    c: usize,
    hw: [usize; 2],
    k: usize,
    rs: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
}

impl Geom {
    fn out(&self) -> [usize; 2] {
        [0, 1].map(|d| {
            (self.hw[d] + 2 * self.pad[d] - self.dil[d] * (self.rs[d] - 1) - 1) / self.stride[d] + 1
        })
    }
    fn words(&self) -> [u64; 16] {
        let [oh, ow] = self.out();
        let v = [
            self.n,
            self.c,
            self.hw[0],
            self.hw[1],
            self.k,
            oh,
            ow,
            self.rs[0],
            self.rs[1],
            self.stride[0],
            self.stride[1],
            self.pad[0],
            self.pad[1],
            self.dil[0],
            self.dil[1],
            self.groups,
        ];
        v.map(|x| x as u64)
    }
}

fn geometries() -> Vec<Geom> {
    let g = |n, c, hw, k, rs, stride, pad, dil, groups| Geom {
        n,
        c,
        hw,
        k,
        rs,
        stride,
        pad,
        dil,
        groups,
    };
    vec![
        g(2, 3, [9, 7], 5, [3, 3], [1, 1], [1, 1], [1, 1], 1),
        g(1, 4, [6, 11], 80, [3, 2], [2, 1], [1, 0], [1, 2], 1), // two channel tiles
        g(3, 6, [5, 5], 4, [1, 1], [1, 1], [0, 0], [1, 1], 2),   // 1x1, groups
        g(2, 8, [12, 12], 6, [5, 5], [2, 2], [2, 2], [1, 1], 2), // k longer than a slice
        g(2, 5, [1, 40], 7, [1, 3], [1, 2], [0, 1], [1, 1], 1),  // 1-d
        g(4, 2, [10, 9], 3, [3, 3], [1, 1], [2, 2], [2, 2], 1),  // dilation, wide pad
    ]
}

/// A deterministic pseudo-random fill in [-1, 1).
fn fill(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// The direct convolution, in f64.
fn reference(g: &Geom, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let [oh, ow] = g.out();
    let (cg, kg) = (g.c / g.groups, g.k / g.groups);
    let mut out = vec![0.0; g.n * g.k * oh * ow];
    for n in 0..g.n {
        for co in 0..g.k {
            let gi = co / kg;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = b[co];
                    for ci in 0..cg {
                        for r in 0..g.rs[0] {
                            for s in 0..g.rs[1] {
                                let ih =
                                    (y * g.stride[0] + r * g.dil[0]) as isize - g.pad[0] as isize;
                                let iw =
                                    (xo * g.stride[1] + s * g.dil[1]) as isize - g.pad[1] as isize;
                                if ih < 0
                                    || iw < 0
                                    || ih >= g.hw[0] as isize
                                    || iw >= g.hw[1] as isize
                                {
                                    continue;
                                }
                                let xi = ((n * g.c + gi * cg + ci) * g.hw[0] + ih as usize)
                                    * g.hw[1]
                                    + iw as usize;
                                acc += w[((co * cg + ci) * g.rs[0] + r) * g.rs[1] + s] * x[xi];
                            }
                        }
                    }
                    out[((n * g.k + co) * oh + y) * ow + xo] = acc;
                }
            }
        }
    }
    out
}

/// `max(conv * scale + shift, 0) + sc0`: operand 0 the output (read as the
/// conv's value), 1 and 2 per-channel tensors.
fn bn_relu(dt: DType) -> Kernel {
    let mut b = KernelBuilder::default();
    let c = b.load(0, dt);
    let sc = b.load(1, dt);
    let sh = b.load(2, dt);
    let m = b.binary(BinaryOp::Mul, c, sc, dt);
    let a = b.binary(BinaryOp::Add, m, sh, dt);
    let z = b.constant(0.0, dt);
    let r = b.binary(BinaryOp::Maximum, a, z, dt);
    let s = b.scalar(0, DType::F64);
    let s = b.cast(s, dt);
    let out = b.binary(BinaryOp::Add, r, s, dt);
    let op = |inner| Operand { dtype: dt, inner };
    Kernel {
        name: "bn_relu".into(),
        rank: 4,
        operands: vec![
            op(Inner::Contiguous),
            op(Inner::Broadcast),
            op(Inner::Broadcast),
        ],
        scalars: vec![DType::F64],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
        extra_out: vec![],
        rows: None,
    }
}

trait Elem: Copy {
    fn of(v: f64) -> Self;
    fn get(self) -> f64;
}
impl Elem for f32 {
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn get(self) -> f64 {
        self as f64
    }
}
impl Elem for f64 {
    fn of(v: f64) -> f64 {
        v
    }
    fn get(self) -> f64 {
        self
    }
}

fn cast<T: Elem>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::of(x)).collect()
}

/// Runs `t` (variant `v`) for `g` on `grid` blocks; the largest error
/// against the reference, relative to 1 + |reference|.
fn run<T: Elem>(lib: &ShimLibrary, t: &TemplateKernel, v: ConvVariant, g: &Geom, grid: u32) -> f64 {
    let [oh, ow] = g.out();
    let cg = g.c / g.groups;
    let x = fill(g.n * g.c * g.hw[0] * g.hw[1], 1);
    let w = fill(g.k * cg * g.rs[0] * g.rs[1], 2);
    let b = if v.bias { fill(g.k, 3) } else { vec![0.0; g.k] };
    let epi = v.epi;
    let (scale, shift) = (fill(g.k, 4), fill(g.k, 5));
    let bonus = 0.25;
    let mut want = reference(g, &x, &w, &b);
    if epi {
        for (i, v) in want.iter_mut().enumerate() {
            let co = i / (oh * ow) % g.k;
            *v = (*v * scale[co] + shift[co]).max(0.0) + bonus;
        }
    }
    let (xt, wt, bt, st, ht) = (
        cast::<T>(&x),
        cast::<T>(&w),
        cast::<T>(&b),
        cast::<T>(&scale),
        cast::<T>(&shift),
    );
    let mut out = vec![T::of(f64::NAN); want.len()];
    let mut words: Vec<u64> = vec![
        out.as_mut_ptr() as u64,
        xt.as_ptr() as u64,
        wt.as_ptr() as u64,
    ];
    if v.bias {
        words.push(bt.as_ptr() as u64);
    }
    if epi {
        words.push(st.as_ptr() as u64);
        words.push(ht.as_ptr() as u64);
    }
    words.extend(g.words());
    if epi {
        // per-channel operands: stride 1 along K, 0 elsewhere
        for _ in 0..2 {
            words.extend([0, 1, 0, 0]);
        }
        words.push(bonus.to_bits());
    }
    assert_eq!(words.len(), t.params.len(), "{}", t.name);
    let f = lib.template_launcher(t).unwrap();
    // SAFETY: the words follow the template's parameters; the buffers outlive the call.
    let rc = unsafe { f(words.as_ptr(), grid, t.block) };
    assert_eq!(rc, 0, "{} launch", t.name);
    let scale_of = |i: usize| 1.0 + want[i].abs();
    out.iter()
        .enumerate()
        .map(|(i, o)| (o.get() - want[i]).abs() / scale_of(i))
        .fold(
            0.0,
            |m: f64, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}

/// Every variant: dtype x epilogue x bias.
fn templates() -> Vec<(ConvVariant, TemplateKernel)> {
    let mut ts = vec![];
    for dt in [DType::F32, DType::F64] {
        let k = bn_relu(dt);
        for epi in [false, true] {
            for bias in [false, true] {
                let spec = ConvSpec {
                    dtype: dt,
                    bias,
                    epilogue: epi.then_some(Epilogue {
                        kernel: &k,
                        value_operands: &[],
                    }),
                };
                ts.push((ConvVariant { dt, epi, bias }, conv_template(&spec).unwrap()));
            }
        }
    }
    ts
}

#[derive(Debug, Clone, Copy)]
struct ConvVariant {
    dt: DType,
    epi: bool,
    bias: bool,
}

#[test]
fn conv_template_matches_a_direct_convolution() {
    if !shim::compiler_present() {
        eprintln!("cuda-shim conv: no c++ compiler, skipped");
        return;
    }
    let ts = templates();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_shim");
    let lib = ShimLibrary::build_templates(ts.iter().map(|t| &t.1), &dir).unwrap();
    let (mut pass, mut total) = (0, 0);
    for g in geometries() {
        for (v, t) in &ts {
            // one block loops over every tile; many blocks take one each
            for grid in [1, 64] {
                let (err, tol) = match v.dt {
                    DType::F32 => (run::<f32>(&lib, t, *v, &g, grid), 1e-5),
                    _ => (run::<f64>(&lib, t, *v, &g, grid), 1e-12),
                };
                total += 1;
                if err <= tol {
                    pass += 1;
                } else {
                    eprintln!(
                        "{} {v:?} grid {grid} {g:?}: error {err:e} > {tol:e}",
                        t.name
                    );
                }
            }
        }
    }
    eprintln!("cuda-shim conv: {pass}/{total}");
    assert_eq!(pass, total);
}

#[test]
fn conv_template_params_and_errors() {
    let k = bn_relu(DType::F32);
    let spec = ConvSpec {
        dtype: DType::F32,
        bias: false,
        epilogue: Some(Epilogue {
            kernel: &k,
            value_operands: &[2],
        }),
    };
    // operand 2 reads the conv's value, so only operand 1 gets a pointer
    assert_eq!(spec.epilogue_inputs(), vec![1]);
    let t = conv_template(&spec).unwrap();
    assert_eq!(t.params.len(), 3 + 1 + GEOMETRY.len() + 4 + 1);
    assert!(t.source.contains("p0[oc] ="), "{}", t.source);
    assert!(t.symbol.starts_with("kiln_conv2d_bn_relu_"), "{}", t.symbol);
    let half = ConvSpec {
        dtype: DType::F16,
        bias: false,
        epilogue: None,
    };
    let e = conv_template(&half).unwrap_err().to_string();
    assert!(e.contains("f32 or f64, got f16"), "{e}");
    let mut rank3 = bn_relu(DType::F32);
    rank3.rank = 3;
    let bad = ConvSpec {
        epilogue: Some(Epilogue {
            kernel: &rank3,
            value_operands: &[],
        }),
        ..spec
    };
    let e = conv_template(&bad).unwrap_err().to_string();
    assert!(e.contains("epilogue bn_relu: rank 3"), "{e}");
}

/// `(B, M, N, K)`, and whether `a` and `w` are stored transposed.
const GEMMS: [([usize; 4], bool, bool); 6] = [
    ([1, 5, 7, 3], false, false),
    ([2, 70, 66, 17], false, true), // two tiles each way, k past one slice
    ([3, 64, 64, 16], true, false), // exactly one tile and one slice
    ([1, 1, 130, 40], true, true),
    ([4, 9, 2, 33], false, false),
    ([2, 0, 3, 4], false, false), // empty
];

/// Runs the GEMM `t` for one shape with `a` broadcast over the batch when
/// `shared_a`, with the `bn_relu` epilogue over columns when `epi`; the
/// largest error relative to 1 + |reference|.
fn run_gemm<T: Elem>(
    lib: &ShimLibrary,
    t: &TemplateKernel,
    epi: bool,
    g: ([usize; 4], bool, bool),
    shared_a: bool,
    grid: u32,
) -> f64 {
    let ([b, m, n, k], ta, tw) = g;
    let a = fill(b * m * k, 7);
    let w = fill(b * k * n, 8);
    // element (i, j) of a matrix with `c` columns, stored row-major or transposed
    let at = |r: usize, c: usize, rows: usize, cols: usize, tr: bool| {
        if tr {
            c * rows + r
        } else {
            r * cols + c
        }
    };
    let a_batch = |bi: usize| if shared_a { 0 } else { bi * m * k };
    let mut want = vec![0.0; b * m * n];
    for bi in 0..b {
        for i in 0..m {
            for j in 0..n {
                want[(bi * m + i) * n + j] = (0..k)
                    .map(|l| {
                        a[a_batch(bi) + at(i, l, m, k, ta)] * w[bi * k * n + at(l, j, k, n, tw)]
                    })
                    .sum();
            }
        }
    }
    let (scale, shift, bonus) = (fill(n, 9), fill(n, 10), -0.5);
    if epi {
        for (i, v) in want.iter_mut().enumerate() {
            *v = (*v * scale[i % n] + shift[i % n]).max(0.0) + bonus;
        }
    }
    let (a_t, w_t) = (cast::<T>(&a), cast::<T>(&w));
    let (st, ht) = (cast::<T>(&scale), cast::<T>(&shift));
    let mut out = vec![T::of(f64::NAN); want.len()];
    let (sa_m, sa_k) = if ta { (1, m) } else { (k, 1) };
    let (sw_k, sw_n) = if tw { (1, k) } else { (n, 1) };
    let sa_b = if shared_a { 0 } else { m * k };
    let mut words = vec![
        out.as_mut_ptr() as u64,
        a_t.as_ptr() as u64,
        w_t.as_ptr() as u64,
    ];
    if epi {
        words.extend([st.as_ptr() as u64, ht.as_ptr() as u64]);
    }
    words.extend([b, m, n, k, sa_b, sa_m, sa_k, k * n, sw_k, sw_n].map(|x| x as u64));
    if epi {
        // per-column operands: stride 1 along N
        words.extend([0, 0, 1, 0, 0, 1]);
        words.push(f64::to_bits(bonus));
    }
    assert_eq!(words.len(), t.params.len());
    let f = lib.template_launcher(t).unwrap();
    // SAFETY: the words follow the template's parameters; the buffers outlive the call.
    assert_eq!(unsafe { f(words.as_ptr(), grid, t.block) }, 0);
    out.iter()
        .enumerate()
        .map(|(i, o)| (o.get() - want[i]).abs() / (1.0 + want[i].abs()))
        .fold(
            0.0,
            |mx: f64, e| if e.is_nan() { f64::INFINITY } else { mx.max(e) },
        )
}

/// Every GEMM variant: dtype x epilogue (the conv test's `bn_relu`, over `[B, M, N]`).
fn gemm_templates() -> Vec<(DType, bool, TemplateKernel)> {
    let mut ts = vec![];
    for dt in [DType::F32, DType::F64] {
        let mut k = bn_relu(dt);
        k.rank = 3;
        for epi in [false, true] {
            let spec = GemmSpec {
                dtype: dt,
                epilogue: epi.then_some(Epilogue {
                    kernel: &k,
                    value_operands: &[],
                }),
            };
            ts.push((dt, epi, gemm_template(&spec).unwrap()));
        }
    }
    ts
}

#[test]
fn gemm_template_matches_a_direct_product() {
    if !shim::compiler_present() {
        eprintln!("cuda-shim gemm: no c++ compiler, skipped");
        return;
    }
    let ts = gemm_templates();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_shim");
    let lib = ShimLibrary::build_templates(ts.iter().map(|t| &t.2), &dir).unwrap();
    let (mut pass, mut total) = (0, 0);
    for g in GEMMS {
        for shared_a in [false, true] {
            for grid in [1, 64] {
                for (dt, epi, t) in &ts {
                    let (err, tol) = match dt {
                        DType::F32 => (run_gemm::<f32>(&lib, t, *epi, g, shared_a, grid), 1e-5),
                        _ => (run_gemm::<f64>(&lib, t, *epi, g, shared_a, grid), 1e-12),
                    };
                    total += 1;
                    if err <= tol {
                        pass += 1;
                    } else {
                        eprintln!(
                            "{} {g:?} shared_a {shared_a} grid {grid}: error {err:e}",
                            t.name
                        );
                    }
                }
            }
        }
    }
    eprintln!("cuda-shim gemm: {pass}/{total}");
    assert_eq!(pass, total);
}

/// `out[o, j, i] = x[o, idx[j], i]` for `x` of `[o, n, i]` stored with its
/// last two dims swapped (strided reads), negative indices counting from the
/// end; whether the take template gives exactly that.
fn run_take<T: Copy + PartialEq + std::fmt::Debug>(
    lib: &ShimLibrary,
    t: &TemplateKernel,
    of: impl Fn(usize) -> T,
    grid: u32,
) -> bool {
    let (o, n, i) = (3usize, 7usize, 5usize);
    let idx: Vec<i64> = vec![0, 6, -1, 3, -7, 3, 2, 5];
    let k = idx.len();
    // x[a, r, c] lives at a*n*i + c*n + r
    let x: Vec<T> = (0..o * n * i).map(&of).collect();
    let mut want = vec![];
    for a in 0..o {
        for &r in &idx {
            let r = if r < 0 { r + n as i64 } else { r } as usize;
            for c in 0..i {
                want.push(x[a * n * i + c * n + r]);
            }
        }
    }
    let mut out = vec![of(usize::MAX % 251); o * k * i];
    let mut words = vec![
        out.as_mut_ptr() as u64,
        x.as_ptr() as u64,
        idx.as_ptr() as u64,
    ];
    words.extend([o, k, i, n, n * i, 1, n].map(|v| v as u64));
    let f = lib.template_launcher(t).unwrap();
    // SAFETY: the words follow the template's parameters; the buffers outlive the call.
    assert_eq!(unsafe { f(words.as_ptr(), grid, t.block) }, 0);
    out == want
}

#[test]
fn take_template_picks_rows_of_every_dtype() {
    if !shim::compiler_present() {
        eprintln!("cuda-shim take: no c++ compiler, skipped");
        return;
    }
    let ts = [DType::F32, DType::F64, DType::F16, DType::I64, DType::Bool].map(take_template);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_shim");
    let lib = ShimLibrary::build_templates(&ts, &dir).unwrap();
    for grid in [1, 3, 64] {
        assert!(
            run_take(&lib, &ts[0], |v| v as f32 * 0.5, grid),
            "f32 grid {grid}"
        );
        assert!(
            run_take(&lib, &ts[1], |v| v as f64 - 0.25, grid),
            "f64 grid {grid}"
        );
        assert!(
            run_take(&lib, &ts[2], |v| (v * 7) as u16, grid),
            "f16 bits grid {grid}"
        );
        assert!(
            run_take(&lib, &ts[3], |v| -(v as i64) << 33, grid),
            "i64 grid {grid}"
        );
        assert!(
            run_take(&lib, &ts[4], |v| (v % 3 == 0) as u8, grid),
            "bool grid {grid}"
        );
    }
}

#[test]
fn nvrtc_compiles_the_templates() {
    // SAFETY: only tries to dlopen NVRTC by its known names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("nvrtc templates: library not found, skipped");
        return;
    }
    let mut ts: Vec<TemplateKernel> = templates().into_iter().map(|t| t.1).collect();
    ts.extend(gemm_templates().into_iter().map(|t| t.2));
    ts.extend([DType::F32, DType::F16, DType::I64, DType::Bool].map(take_template));
    for dt in [DType::F32, DType::F64] {
        ts.extend(kiln_codegen::cuda::attention::attention_templates(dt).unwrap());
    }
    let mut failed = 0;
    for t in &ts {
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some("sm_90"),
            ..Default::default()
        };
        if let Err(e) = cudarc::nvrtc::compile_ptx_with_opts(&t.source, opts) {
            failed += 1;
            eprintln!("{}: {e:?}\n{}", t.name, t.source);
        }
    }
    eprintln!("nvrtc templates: {} compiled, {failed} failed", ts.len());
    assert_eq!(failed, 0);
}
