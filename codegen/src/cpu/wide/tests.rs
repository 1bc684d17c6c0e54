//! The wide helpers against the portable one-lane build of the same code,
//! bit for bit, on every supported op over random values, edge values and
//! lengths that leave partial tiles (NaN counts as equal to NaN).

use super::*;

fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let edges = [
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-40,
        -1e-40,
        1e-30,
        88.7,
        -88.7,
        89.5,
        -104.5,
        2.5,
        -2.5,
        2.5000002,
        3.9,
        4.1,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -1.0,
        0.7071067,
        1e30,
        -1e30,
    ];
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 5 == 0 {
                edges[(s as usize >> 3) % edges.len()]
            } else {
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 24.0
            }
        })
        .collect()
}

/// Every ISA this CPU runs, the portable one first.
fn isas_here() -> Vec<WideIsa> {
    [WideIsa::Portable, WideIsa::Avx2, WideIsa::Avx512]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn wide_isas_match_the_portable_helper_bit_for_bit() {
    let isas: Vec<WideIsa> = [WideIsa::Avx2, WideIsa::Avx512]
        .into_iter()
        .filter(|i| i.available())
        .collect();
    eprintln!(
        "wide ISAs available here: {:?} (detected: {:?})",
        isas,
        detect()
    );
    for (c, &op) in SUPPORTED.iter().enumerate() {
        for n in [0, 1, 7, 16, 255, 256, 257, 1000] {
            let x = inputs(n, 11 + c as u64 * 7 + n as u64);
            let mut want = x.clone();
            apply(Some(WideIsa::Portable), op, &mut want).unwrap();
            for &isa in &isas {
                let mut got = x.clone();
                apply(Some(isa), op, &mut got).unwrap();
                for i in 0..n {
                    assert!(
                        same(got[i], want[i]),
                        "{op:?} on {}: x={:e} got {:e} want {:e}",
                        isa.name(),
                        x[i],
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn portable_helper_is_close_to_libm() {
    // an accuracy sanity check of the port (the bit-exact checks against the
    // Cranelift code are in codegen/tests/cpu_wide.rs)
    let x = inputs(4000, 5);
    for (op, f) in [
        (UnaryOp::Exp, f64::exp as fn(f64) -> f64),
        (UnaryOp::Log, f64::ln),
        (UnaryOp::Tanh, f64::tanh),
        (UnaryOp::Erf, kiln_ir::interp::erf),
    ] {
        let mut y = x.clone();
        apply(None, op, &mut y).unwrap();
        for (a, b) in x.iter().zip(&y) {
            let r = f(*a as f64) as f32;
            let ok = same(r, *b)
                || (r - b).abs() <= 1e-6 * r.abs().max(1e-30) * 8.0
                || (r - b).abs() < 1e-37;
            assert!(ok, "{op:?}({a:e}) = {b:e}, libm {r:e}");
        }
    }
}

#[test]
fn unsupported_op_is_an_error() {
    let e = apply(None, UnaryOp::Relu, &mut [1.0]).unwrap_err();
    assert!(e.to_string().contains("Relu"), "{e}");
}

#[test]
fn reduce_helpers_agree_across_isas() {
    let isas = isas_here();
    for n in [1, 9, 256, 300] {
        let x: Vec<f32> = inputs(n, 3 + n as u64)
            .into_iter()
            .map(|v| {
                if v.is_finite() {
                    v.clamp(-50.0, 50.0)
                } else {
                    1.5
                }
            })
            .collect();
        let mut got = vec![];
        for &isa in &isas {
            let mut lse = [f32::MIN, 0.0];
            fold_tile(Some(isa), LSE, &x, &mut lse, 0).unwrap();
            fold_tile(Some(isa), LSE, &x[..n / 2], &mut lse, n as u64).unwrap();
            let mut w = [0.0, 0.0];
            fold_tile(Some(isa), WELFORD, &x, &mut w, 0).unwrap();
            fold_tile(Some(isa), WELFORD, &x[..n / 2], &mut w, n as u64).unwrap();
            got.push((isa, lse, w));
        }
        let (_, l0, w0) = got[0];
        for &(isa, l, w) in &got[1..] {
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(1.0);
            assert_eq!(l[0], l0[0], "{} lse shift, n {n}", isa.name());
            assert!(
                close(l[1], l0[1]),
                "{} lse sum {} vs {}",
                isa.name(),
                l[1],
                l0[1]
            );
            assert!(
                close(w[0], w0[0]),
                "{} mean {} vs {}",
                isa.name(),
                w[0],
                w0[0]
            );
            assert!(
                close(w[1], w0[1]),
                "{} m2 {} vs {}",
                isa.name(),
                w[1],
                w0[1]
            );
        }
    }
}

/// Softmax rows of random and edge values (`seed`), partial tiles, one all
/// -inf and one holding a NaN.
fn softmax_rows(seed: u64) -> Vec<Vec<f32>> {
    let mut rows: Vec<Vec<f32>> = [0, 1, 15, 64, 300, 1024]
        .into_iter()
        .map(|n| inputs(n, seed + n as u64))
        .collect();
    rows.push(vec![f32::NEG_INFINITY; 70]);
    rows.push(
        (0..70)
            .map(|i| if i == 33 { f32::NAN } else { i as f32 })
            .collect(),
    );
    rows
}

#[test]
fn softmax_row_from_a_source_matches_the_row_done_in_place() {
    for &isa in &isas_here() {
        for src in &softmax_rows(17) {
            let mut in_place = src.clone();
            let want = lse_store_row(Some(isa), &mut in_place).unwrap();
            let mut dst = vec![7.0; src.len()];
            let got = lse_store_from(Some(isa), src, &mut dst).unwrap();
            let n = src.len();
            assert!(
                same(got[0], want[0]) && same(got[1], want[1]),
                "{} n {n}: state {got:?} vs {want:?}",
                isa.name()
            );
            for i in 0..n {
                assert!(same(dst[i], in_place[i]), "{} n {n} [{i}]", isa.name());
            }
        }
    }
    let e = lse_store_from(None, &[1.0; 3], &mut [0.0; 2]).unwrap_err();
    assert!(e.to_string().contains("src has 3 values, dst 2"), "{e}");
}

/// `SOFTMAX_ROW` is `LSE_STORE` then each exp times `1 / s`: the JIT row
/// pass's bits, on every ISA here (NaN, all -inf and partial tiles too).
#[test]
fn the_whole_softmax_row_is_the_stored_exps_times_the_reciprocal() {
    for &isa in &isas_here() {
        for src in &softmax_rows(29) {
            let mut exps = vec![7.0; src.len()];
            let want = lse_store_from(Some(isa), src, &mut exps).unwrap();
            let mut dst = vec![7.0; src.len()];
            let got = softmax_from(Some(isa), src, &mut dst).unwrap();
            let n = src.len();
            assert!(
                same(got[0], want[0]) && same(got[1], want[1]),
                "{} n {n}",
                isa.name()
            );
            let scale = 1.0 / want[1];
            for i in 0..n {
                assert!(same(dst[i], exps[i] * scale), "{} n {n} [{i}]", isa.name());
            }
        }
    }
}

/// The default uses: rows and chains everywhere, pointwise tiles only on
/// AVX-512 (where each was measured to pay), expression rows never;
/// `KILN_WIDE` and `KILN_CHAIN` override.
#[test]
fn default_uses_follow_the_measurements() {
    if std::env::var("KILN_WIDE").is_ok() || std::env::var("KILN_CHAIN").is_ok() {
        return; // the environment chose
    }
    let avx512 = Uses::from_env(WideIsa::Avx512);
    assert!(avx512.pointwise && avx512.rows && !avx512.expression_rows && avx512.chains);
    let avx2 = Uses::from_env(WideIsa::Avx2);
    assert!(!avx2.pointwise && avx2.rows && !avx2.expression_rows && avx2.chains);
    assert_eq!(Uses::all(false), Uses::default());
    assert!(!Uses::default().any() && Uses::all(true).any());
}

/// Not a test: one thread's nanoseconds per vector of gelu, erf, silu, sigmoid and exp on a
/// tile in L1 (`cargo test --release -p kiln-codegen --lib time_tile_ops
/// -- --ignored --nocapture`).
#[test]
#[ignore]
fn time_tile_ops() {
    let Some(isa) = detect() else { return };
    for (name, op, x) in [
        ("gelu, |x| < 2.5", UnaryOp::Gelu, 1.5f32),
        ("erf, |x| < 2.5", UnaryOp::Erf, 1.2),
        ("silu", UnaryOp::Silu, 1.2),
        ("sigmoid", UnaryOp::Sigmoid, 1.2),
        ("exp", UnaryOp::Exp, 1.2),
    ] {
        let mut buf = vec![x; TILE];
        let reps = 200_000;
        for round in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                buf.fill(x);
                apply(Some(isa), op, &mut buf).unwrap();
            }
            let ns = t.elapsed().as_nanos() as f64 / reps as f64;
            eprintln!(
                "{name} ({}) round {round}: {:.2} ns per vector",
                isa.name(),
                ns / (TILE / isa.lanes()) as f64
            );
        }
    }
}
