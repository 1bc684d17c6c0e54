//! The fused `scaled_dot_product_attention` (one `attention` kernel,
//! forward and backward, no `[L, S]` scores stored) against the composite
//! (`scaled_dot_product_attention_math`): random shapes, masks, causal,
//! GQA and fully masked rows in f32 and f64; the compiled plan as one
//! kernel; and peak memory that grows with L, not L·S.
//!
//! The memory counters are process-wide, so every test of this binary
//! holds `LOCK` (another test's tensors would count in the peaks).

use kiln::compile::{compile_fn, CompileOptions, Stage};
use kiln::functional::{self as F, SdpaOpts};
use kiln::{memory, DType, Tensor};
use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(dims: &[usize], seed: u64, dt: DType) -> Tensor {
    kiln::bench::randn(dims, seed).to_dtype(dt).unwrap()
}

/// A deterministic stream of small integers for shapes and masks.
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Mask {
    None,
    /// `[L, S]`, about a third hidden, row 0 fully hidden.
    Bool,
    /// `[N, 1, L, S]` random values with some `-inf`, row 0 all `-inf`.
    Float,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    h: usize,
    hk: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    mask: Mask,
    causal: bool,
}

fn mask_tensor(c: &Case, rng: &mut Lcg, dt: DType) -> Option<Tensor> {
    match c.mask {
        Mask::None => None,
        Mask::Bool => {
            let m: Vec<bool> = (0..c.l * c.s)
                .map(|i| i >= c.s && rng.below(3) != 0)
                .collect();
            Some(Tensor::from_vec(m, &[c.l, c.s]).unwrap())
        }
        Mask::Float => {
            let m: Vec<f64> = (0..c.n * c.l * c.s)
                .map(|i| {
                    if i % (c.l * c.s) < c.s || rng.below(5) == 0 {
                        f64::NEG_INFINITY
                    } else {
                        rng.below(1000) as f64 / 250.0 - 2.0
                    }
                })
                .collect();
            Some(
                Tensor::from_vec(m, &[c.n, 1, c.l, c.s])
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap(),
            )
        }
    }
}

/// out and the gradients of q, k, v for one path.
fn run(c: &Case, dt: DType, seed: u64, fused: bool) -> Vec<Vec<f64>> {
    let q = randn(&[c.n, c.h, c.l, c.e], seed, dt).requires_grad_(true);
    let k = randn(&[c.n, c.hk, c.s, c.e], seed + 1, dt).requires_grad_(true);
    let v = randn(&[c.n, c.hk, c.s, c.ev], seed + 2, dt).requires_grad_(true);
    let g = randn(&[c.n, c.h, c.l, c.ev], seed + 3, dt);
    let mask = mask_tensor(c, &mut Lcg(seed), dt);
    let o = SdpaOpts {
        is_causal: c.causal,
        enable_gqa: c.hk != c.h,
        ..Default::default()
    };
    let f = if fused {
        F::scaled_dot_product_attention
    } else {
        F::scaled_dot_product_attention_math
    };
    let y = f(&q, &k, &v, mask.as_ref(), o).unwrap();
    y.mul(&g)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let grad = |t: &Tensor| t.grad().expect("a gradient").to_f64_vec();
    vec![y.to_f64_vec(), grad(&q), grad(&k), grad(&v)]
}

fn compare(c: &Case, dt: DType, seed: u64, tol: f64) {
    let (fused, math) = (run(c, dt, seed, true), run(c, dt, seed, false));
    for (what, (a, b)) in ["out", "dq", "dk", "dv"]
        .iter()
        .zip(fused.iter().zip(&math))
    {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let same =
                x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
            assert!(same, "{what}[{i}] {dt}: fused {x}, composite {y} ({c:?})");
        }
    }
}

fn random_case(rng: &mut Lcg) -> Case {
    let heads = [(1, 1), (2, 2), (4, 2), (4, 1), (3, 3)];
    let (h, hk) = heads[rng.below(heads.len())];
    let dims = [8, 16, 24, 32, 64, 128];
    let e = dims[rng.below(dims.len())];
    let mask = [Mask::None, Mask::Bool, Mask::Float][rng.below(3)];
    Case {
        n: 1 + rng.below(2),
        h,
        hk,
        l: 1 + rng.below(300),
        s: 1 + rng.below(300),
        e,
        ev: if rng.below(2) == 0 {
            e
        } else {
            dims[rng.below(4)]
        },
        causal: matches!(mask, Mask::None) && rng.below(2) == 0,
        mask,
    }
}

#[test]
fn fused_matches_the_composite_on_random_shapes() {
    let _g = lock();
    let mut rng = Lcg(15);
    let mut cases: Vec<Case> = (0..10).map(|_| random_case(&mut rng)).collect();
    // the named corners: causal rectangles both ways, GQA with a mask
    let base = Case {
        n: 1,
        h: 2,
        hk: 2,
        l: 130,
        s: 70,
        e: 32,
        ev: 32,
        mask: Mask::None,
        causal: true,
    };
    cases.push(base);
    cases.push(Case {
        l: 70,
        s: 130,
        ..base
    });
    cases.push(Case {
        h: 4,
        hk: 2,
        mask: Mask::Bool,
        causal: false,
        ..base
    });
    cases.extend(tile_edges());
    for (i, c) in cases.iter().enumerate() {
        compare(c, DType::F64, 100 + i as u64, 1e-10);
        compare(c, DType::F32, 200 + i as u64, 2e-5);
    }
    println!(
        "sdpa fused vs composite ({}): {} cases, f32 and f64, forward and backward",
        kiln::runtime::externs::cpu_isa::detect().name(),
        cases.len()
    );
}

/// The edges of the kernels' 64 x 64 tiles: one query row, lengths one
/// short of, at and one past a tile, a head with more key blocks than the
/// threads (its keys split across tasks), GQA under causal and masks.
fn tile_edges() -> Vec<Case> {
    let base = Case {
        n: 2,
        h: 4,
        hk: 4,
        l: 64,
        s: 64,
        e: 64,
        ev: 64,
        mask: Mask::None,
        causal: false,
    };
    vec![
        Case { l: 1, s: 1, ..base },
        Case {
            l: 1,
            s: 129,
            ..base
        },
        Case {
            l: 63,
            s: 65,
            causal: true,
            ..base
        },
        Case {
            l: 65,
            s: 63,
            mask: Mask::Bool,
            ..base
        },
        Case {
            l: 128,
            s: 128,
            causal: true,
            hk: 2,
            ..base
        },
        Case {
            n: 1,
            h: 1,
            hk: 1,
            l: 70,
            s: 300,
            e: 40,
            ev: 24,
            mask: Mask::Float,
            ..base
        },
        Case {
            h: 4,
            hk: 1,
            l: 129,
            s: 200,
            mask: Mask::Float,
            ..base
        },
    ]
}

/// The same comparison with the kernels' ISA capped to AVX2 and to the
/// portable body (`KILN_CPU_ISA` is read once per process, so each runs
/// this binary's random-shapes test in a child).
#[test]
fn fused_matches_the_composite_under_narrower_isas() {
    if std::env::var("KILN_CPU_ISA").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for isa in ["avx2", "scalar"] {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "fused_matches_the_composite_on_random_shapes"])
            .args(["--nocapture", "--test-threads=1"])
            .env("KILN_CPU_ISA", isa)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "KILN_CPU_ISA={isa}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // the child names the ISA its kernels ran with
        let want = format!("sdpa fused vs composite ({isa})");
        let at = text.find(&want);
        assert!(
            at.is_some(),
            "KILN_CPU_ISA={isa}: no `{want}` line in {text}"
        );
        println!("{}", text[at.unwrap()..].lines().next().unwrap_or_default());
    }
}

#[test]
fn compiled_attention_is_one_kernel() {
    let _g = lock();
    let c = compile_fn("sdpa", |t: &[Tensor]| {
        let o = SdpaOpts {
            is_causal: true,
            ..Default::default()
        };
        Ok(vec![F::scaled_dot_product_attention(
            &t[0], &t[1], &t[2], None, o,
        )?])
    })
    .with_options(CompileOptions {
        disk_cache: false,
        ..Default::default()
    });
    let args: Vec<Tensor> = (0..3)
        .map(|i| randn(&[2, 4, 16, 8], i, DType::F32))
        .collect();
    let got = c.call(&args).unwrap();
    let want = F::scaled_dot_product_attention_math(
        &args[0],
        &args[1],
        &args[2],
        None,
        SdpaOpts {
            is_causal: true,
            ..Default::default()
        },
    )
    .unwrap();
    let diff = got[0]
        .sub(&want)
        .unwrap()
        .abs()
        .unwrap()
        .amax(None, false)
        .unwrap()
        .item()
        .unwrap();
    assert!(diff < 1e-5, "compiled fused vs composite: {diff}");
    insta::assert_snapshot!("sdpa_fused_plan", c.dump(Stage::Fused, &args).unwrap());
    let kernels = c.explain().entries[0].kernels.clone();
    assert_eq!(kernels.len(), 1, "one attention kernel: {kernels:?}");
}

/// Peak bytes allocated beyond what was live before `f`.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    f();
    memory::max_memory_allocated().saturating_sub(base)
}

fn attention_peaks(l: usize, fused: bool) -> (usize, usize) {
    let dt = DType::F32;
    let (q, k, v) = (
        randn(&[1, 1, l, 64], 1, dt),
        randn(&[1, 1, l, 64], 2, dt),
        randn(&[1, 1, l, 64], 3, dt),
    );
    let o = SdpaOpts {
        is_causal: true,
        ..Default::default()
    };
    let f = if fused {
        F::scaled_dot_product_attention
    } else {
        F::scaled_dot_product_attention_math
    };
    let forward = peak_of(|| {
        let _no = kiln::autograd::no_grad();
        drop(f(&q, &k, &v, None, o).unwrap());
    });
    let (q, k, v) = (
        q.requires_grad_(true),
        k.requires_grad_(true),
        v.requires_grad_(true),
    );
    let backward = peak_of(|| {
        f(&q, &k, &v, None, o)
            .unwrap()
            .sum(None, false)
            .unwrap()
            .backward()
            .unwrap();
    });
    (forward, backward)
}

#[test]
fn fused_peak_memory_grows_with_l_not_l_times_s() {
    let _g = lock();
    let (small, big) = (256, 1024);
    let (f_small, b_small) = attention_peaks(small, true);
    let (f_big, b_big) = attention_peaks(big, true);
    let (m_big, _) = attention_peaks(big, false);
    let scores = big * big * 4;
    println!(
        "sdpa peak memory, L=S={small} -> {big}: fused forward {f_small} -> {f_big} B, fused training step {b_small} -> {b_big} B, composite forward at {big}: {m_big} B ([L, S] scores: {scores} B)"
    );
    // 4x the rows: linear growth is 4x, the scores would be 16x
    assert!(f_big <= 5 * f_small.max(1), "forward {f_small} -> {f_big}");
    assert!(b_big <= 5 * b_small.max(1), "backward {b_small} -> {b_big}");
    assert!(
        f_big < scores && b_big < scores,
        "fused peaks {f_big}, {b_big} vs scores {scores}"
    );
    assert!(
        m_big >= scores,
        "the composite stores the scores: {m_big} < {scores}"
    );
}

fn qkv(dims: &[usize]) -> [Tensor; 3] {
    [0, 1, 2].map(|i| randn(dims, 40 + i, DType::F32))
}

fn with_dropout(p: f64) -> SdpaOpts {
    SdpaOpts {
        dropout_p: p,
        ..Default::default()
    }
}

#[test]
fn dropout_runs_the_composite_with_pytorch_semantics() {
    let _g = lock();
    let [q, k, v] = qkv(&[2, 3, 16, 8]);
    let sdpa = |o| F::scaled_dot_product_attention(&q, &k, &v, None, o).unwrap();
    // p = 0: the fused kernel itself
    let fused = sdpa(SdpaOpts::default()).to_f64_vec();
    assert_eq!(sdpa(with_dropout(0.0)).to_f64_vec(), fused);
    // p = 1: every weight dropped
    assert!(sdpa(with_dropout(1.0))
        .to_f64_vec()
        .iter()
        .all(|&x| x == 0.0));
    // 0 < p < 1: weights kept with probability 1 - p and scaled by 1 / (1 - p),
    // so the mean over many draws is the undropped result; with v = 1 each
    // output is the sum of its row's kept weights, (1 / (1 - p)) * kept
    let ones = Tensor::ones(&[2, 3, 16, 8], DType::F32);
    kiln::manual_seed(7);
    let p = 0.25;
    let draws = 200;
    let mut mean = vec![0.0; 2 * 3 * 16 * 8];
    for _ in 0..draws {
        let y = F::scaled_dot_product_attention(&q, &k, &ones, None, with_dropout(p)).unwrap();
        mean.iter_mut()
            .zip(y.to_f64_vec())
            .for_each(|(m, y)| *m += y / draws as f64);
    }
    let avg = mean.iter().sum::<f64>() / mean.len() as f64;
    println!("sdpa dropout p={p}: mean of {draws} draws {avg:.4} (undropped 1)");
    assert!((avg - 1.0).abs() < 0.02, "mean {avg}");
    // the same seed draws the same mask
    kiln::manual_seed(3);
    let a = sdpa(with_dropout(0.5)).to_f64_vec();
    kiln::manual_seed(3);
    assert_eq!(sdpa(with_dropout(0.5)).to_f64_vec(), a);
    assert_ne!(a, fused);
    let e = F::scaled_dot_product_attention(&q, &k, &v, None, with_dropout(1.5)).unwrap_err();
    assert!(
        e.to_string()
            .contains("scaled_dot_product_attention: dropout probability"),
        "{e}"
    );
}

#[test]
fn dropout_trains_through_sdpa_and_multihead_attention() {
    let _g = lock();
    use kiln::nn::{Module, ModuleExt};
    let [q, k, v] = qkv(&[2, 2, 8, 4]).map(|t| t.requires_grad_(true));
    kiln::manual_seed(11);
    let y = F::scaled_dot_product_attention(&q, &k, &v, None, with_dropout(0.5)).unwrap();
    y.sum(None, false).unwrap().backward().unwrap();
    for t in [&q, &k, &v] {
        let g = t.grad().expect("a gradient").to_f64_vec();
        assert!(g.iter().all(|x| x.is_finite()) && g.iter().any(|&x| x != 0.0));
    }
    let mha = kiln::nn::MultiheadAttention::with(
        8,
        2,
        kiln::nn::MultiheadAttentionOptions {
            dropout: 0.5,
            batch_first: true,
            ..Default::default()
        },
    )
    .unwrap();
    mha.train();
    let x = randn(&[2, 5, 8], 9, DType::F32).requires_grad_(true);
    let (a, b) = (mha.forward(&x).unwrap(), mha.forward(&x).unwrap());
    assert_ne!(a.to_f64_vec(), b.to_f64_vec(), "training draws fresh masks");
    a.sum(None, false).unwrap().backward().unwrap();
    assert!(x
        .grad()
        .expect("a gradient")
        .to_f64_vec()
        .iter()
        .all(|g| g.is_finite()));
    mha.eval();
    assert_eq!(
        mha.forward(&x).unwrap().to_f64_vec(),
        mha.forward(&x).unwrap().to_f64_vec()
    );
}
