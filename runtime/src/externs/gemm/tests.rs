//! Tests of `gemm` against naive reference loops.

use super::super::testutil::{assert_close, Lcg};
use super::*;

#[allow(clippy::too_many_arguments)]
fn naive(
    m: usize,
    k: usize,
    n: usize,
    a: &[f64],
    ars: usize,
    acs: usize,
    b: &[f64],
    brs: usize,
    bcs: usize,
) -> Vec<f64> {
    let mut o = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            o[i * n + j] = (0..k)
                .map(|p| a[i * ars + p * acs] * b[p * brs + j * bcs])
                .sum();
        }
    }
    o
}

#[test]
fn matmul_matches_naive_incl_transposed_views() {
    let mut r = Lcg(1);
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 9),
        (64, 70, 65),
        (0, 3, 4),
        (3, 0, 4),
    ] {
        let a: Vec<f64> = r.vec(m * k);
        let b: Vec<f64> = r.vec(k * n);
        let want = naive(m, k, n, &a, k, 1, &b, n, 1);
        let mut got = vec![f64::NAN; m * n];
        matmul(m, k, n, &a, k as isize, 1, &b, n as isize, 1, &mut got);
        assert_close(&got, &want, 1e-12, "f64");
        // A stored as [k,m] and read transposed; B stored as [n,k] read transposed.
        let at: Vec<f64> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
        let bt: Vec<f64> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
        matmul(m, k, n, &at, 1, m as isize, &bt, 1, k as isize, &mut got);
        assert_close(&got, &want, 1e-12, "transposed");
        let af: Vec<f32> = a.iter().map(|&x| x as f32).collect();
        let bf: Vec<f32> = b.iter().map(|&x| x as f32).collect();
        let mut gf = vec![0f32; m * n];
        matmul(m, k, n, &af, k as isize, 1, &bf, n as isize, 1, &mut gf);
        let wf: Vec<f32> = want.iter().map(|&x| x as f32).collect();
        assert_close(&gf, &wf, 1e-4, "f32");
    }
}

#[test]
fn batched_with_broadcast_and_big_threaded() {
    let mut r = Lcg(2);
    let (bt, m, k, n) = (5, 4, 6, 3);
    let a: Vec<f64> = r.vec(bt * m * k);
    let b: Vec<f64> = r.vec(k * n); // broadcast over the batch
    let mut got = vec![0.0; bt * m * n];
    batched_matmul(
        bt,
        m,
        k,
        n,
        &a,
        m * k,
        k as isize,
        1,
        &b,
        0,
        n as isize,
        1,
        &mut got,
    );
    for i in 0..bt {
        let want = naive(m, k, n, &a[i * m * k..], k, 1, &b, n, 1);
        assert_close(&got[i * m * n..(i + 1) * m * n], &want, 1e-12, "bmm");
    }
    // [2,1] x [1,3] batch broadcast via offsets.
    let a: Vec<f64> = r.vec(2 * m * k);
    let b: Vec<f64> = r.vec(3 * k * n);
    let ao = batch_offsets(&[2, 3], &[m * k, 0]);
    let bo = batch_offsets(&[2, 3], &[0, k * n]);
    assert_eq!(ao, vec![0, 0, 0, 24, 24, 24]);
    let mut got = vec![0.0; 6 * m * n];
    batched_matmul_offsets(
        m, k, n, &a, &ao, k as isize, 1, &b, &bo, n as isize, 1, &mut got, None,
    );
    for i in 0..6 {
        let want = naive(m, k, n, &a[ao[i]..], k, 1, &b[bo[i]..], n, 1);
        assert_close(&got[i * m * n..(i + 1) * m * n], &want, 1e-12, "bcast");
    }
    let (m, k, n) = (130, 150, 140);
    let a: Vec<f64> = r.vec(3 * m * k);
    let b: Vec<f64> = r.vec(3 * k * n);
    let mut got = vec![0.0; 3 * m * n];
    batched_matmul(
        3,
        m,
        k,
        n,
        &a,
        m * k,
        k as isize,
        1,
        &b,
        k * n,
        n as isize,
        1,
        &mut got,
    );
    for i in 0..3 {
        let want = naive(m, k, n, &a[i * m * k..], k, 1, &b[i * k * n..], n, 1);
        assert_close(&got[i * m * n..(i + 1) * m * n], &want, 1e-12, "big");
    }
}

#[test]
fn linear_with_bias() {
    let mut r = Lcg(3);
    let (m, k, n) = (7, 11, 5);
    let x: Vec<f32> = r.vec(m * k);
    let w: Vec<f32> = r.vec(n * k);
    let bias: Vec<f32> = r.vec(n);
    let mut got = vec![0f32; m * n];
    linear(m, k, n, &x, &w, Some(&bias), &mut got);
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = bias[j] + (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>();
        }
    }
    assert_close(&got, &want, 1e-5, "linear");
    linear(m, k, n, &x, &w, None, &mut got);
    for i in 0..m * n {
        want[i] -= bias[i % n];
    }
    assert_close(&got, &want, 1e-5, "linear no bias");
}

#[test]
fn half_rounds_to_nearest_even() {
    use half::bf16;
    let mut r = Lcg(4);
    let (m, k, n) = (5, 9, 6);
    let a: Vec<bf16> = (0..m * k).map(|_| bf16::from_f64(r.next_f64())).collect();
    let b: Vec<bf16> = (0..k * n).map(|_| bf16::from_f64(r.next_f64())).collect();
    let mut got = vec![bf16::ZERO; m * n];
    matmul_half(m, k, n, &a, k as isize, 1, &b, n as isize, 1, &mut got);
    for i in 0..m {
        for j in 0..n {
            let exact: f32 = (0..k)
                .map(|p| a[i * k + p].to_f32() * b[p * n + j].to_f32())
                .sum();
            let want = bf16::from_f32(exact);
            assert!(
                (got[i * n + j].to_f32() - want.to_f32()).abs()
                    <= 1e-2 * (1.0 + want.to_f32().abs())
            );
        }
    }
    // 1 + 2^-8 is a tie between bf16 1.0 and 1.0078125: even mantissa (1.0) wins.
    let one = [bf16::ONE];
    let tie = [half::bf16::from_f32(1.0), half::bf16::from_f32(0.00390625)];
    let mut o = [bf16::ZERO];
    matmul_half(1, 2, 1, &tie, 2, 1, &[one[0], one[0]], 1, 1, &mut o);
    assert_eq!(o[0], bf16::ONE);
}

#[test]
#[ignore]
fn bench_matmul_1024() {
    let n = 1024;
    let mut r = Lcg(5);
    let a: Vec<f32> = r.vec(n * n);
    let b: Vec<f32> = r.vec(n * n);
    let mut c = vec![0f32; n * n];
    let mut times = vec![];
    for it in 0..23 {
        let t = std::time::Instant::now();
        matmul(n, n, n, &a, n as isize, 1, &b, n as isize, 1, &mut c);
        if it >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let f = 2.0 * (n * n * n) as f64;
    println!(
        "matmul 1024^3 f32 ({} threads): median {:.2} ms = {:.1} GFLOP/s, best {:.1} GFLOP/s",
        threads(),
        times[10] * 1e3,
        f / times[10] / 1e9,
        f / times[0] / 1e9
    );
}

/// `x @ w^T` with a weight big enough to be copied row-major first
/// (`transposed::MIN_ELEMS`), a padded row stride, ragged edges, both
/// overwriting and accumulating, serial and threaded.
#[test]
fn transposed_weight_copied_row_major_matches_naive() {
    let mut r = Lcg(5);
    let (m, k, n, pad) = (37, 301, 229, 3);
    assert!(wants_row_major_copy(k, n, 1, (k + pad) as isize));
    let a: Vec<f64> = r.vec(m * k);
    let w: Vec<f64> = r.vec(n * (k + pad));
    let want = naive(m, k, n, &a, k, 1, &w, 1, k + pad);
    let af: Vec<f32> = a.iter().map(|&x| x as f32).collect();
    let wf: Vec<f32> = w.iter().map(|&x| x as f32).collect();
    let ws = (k + pad) as isize;
    let plus_one: Vec<f32> = want.iter().map(|&x| x as f32 + 1.0).collect();
    let plain: Vec<f32> = want.iter().map(|&x| x as f32).collect();
    for par in [Parallelism::None, Parallelism::Rayon(0)] {
        let mut got = vec![1f32; m * n];
        let run = |got: &mut [f32], accumulate| {
            gemm_with(
                m, k, n, &af, k as isize, 1, &wf, 1, ws, got, n as isize, 1, accumulate, par,
            )
        };
        run(&mut got, true);
        assert_close(&got, &plus_one, 1e-4, "accumulated");
        run(&mut got, false);
        assert_close(&got, &plain, 1e-4, "overwritten");
    }
}

/// A threaded product of few rows split into column blocks: ragged last
/// block, row-major and transposed right operands, a padded output row
/// stride whose padding stays untouched, overwriting and accumulating.
#[test]
fn column_blocks_match_naive_and_stay_in_their_columns() {
    let mut r = Lcg(6);
    let (m, k, n, pad) = (40, 70, 333, 5);
    assert!(column_split(m, n, Parallelism::Rayon(0)));
    assert!(!column_split(m, n, Parallelism::None));
    let a: Vec<f64> = r.vec(m * k);
    let b: Vec<f64> = r.vec(k * n);
    let af: Vec<f32> = a.iter().map(|&x| x as f32).collect();
    let bf: Vec<f32> = b.iter().map(|&x| x as f32).collect();
    // b as stored (k x n row-major) and read transposed (b^T's n x k storage)
    let bt: Vec<f32> = (0..n * k).map(|i| bf[(i % k) * n + i / k]).collect();
    let want = naive(m, k, n, &a, k, 1, &b, n, 1);
    let ld = n + pad;
    for (rhs, brs, bcs) in [(&bf, n as isize, 1), (&bt, 1, k as isize)] {
        for accumulate in [false, true] {
            let mut got = vec![1f32; m * ld];
            gemm_with(
                m,
                k,
                n,
                &af,
                k as isize,
                1,
                rhs,
                brs,
                bcs,
                &mut got,
                ld as isize,
                1,
                accumulate,
                Parallelism::Rayon(0),
            );
            let base = if accumulate { 1.0 } else { 0.0 };
            for i in 0..m {
                let row: Vec<f32> = (0..n).map(|j| got[i * ld + j]).collect();
                let exp: Vec<f32> = (0..n).map(|j| want[i * n + j] as f32 + base).collect();
                assert_close(&row, &exp, 1e-4, "column blocks");
                assert!(
                    got[i * ld + n..(i + 1) * ld].iter().all(|&v| v == 1.0),
                    "row {i} padding"
                );
            }
        }
    }
}

/// With a bias, every row starts from it and the product accumulates onto
/// it; what `out` held before (NaN here) is never read. Covers the crate's
/// GEMM, the skinny dot products (few rows, `b` read by columns), the
/// column split (few rows, many columns, threaded), batches on the pool,
/// and `k = 0` (the bias alone).
#[test]
fn batched_bias_starts_every_row() {
    let mut r = Lcg(5);
    for &(batch, m, k, n, b_by_columns) in &[
        (1, 64, 70, 65, false),
        (1, 2, 300, 33, true),
        (1, 100, 96, 512, false),
        (16, 40, 50, 30, false),
        (2, 3, 0, 5, false),
    ] {
        let a: Vec<f32> = r.vec(batch * m * k);
        let b: Vec<f32> = r.vec(k * n);
        let bias: Vec<f32> = r.vec(n);
        let ao: Vec<usize> = (0..batch).map(|i| i * m * k).collect();
        // b stored [n, k] and read transposed, or stored [k, n]
        let (bs, brs, bcs) = match b_by_columns {
            true => ((0..n * k).map(|x| b[(x % k) * n + x / k]).collect(), 1, k),
            false => (b.clone(), n, 1),
        };
        let mut got = vec![f32::NAN; batch * m * n];
        batched_matmul_offsets(
            m,
            k,
            n,
            &a,
            &ao,
            k as isize,
            1,
            &bs,
            &vec![0; batch],
            brs as isize,
            bcs as isize,
            &mut got,
            Some(&bias),
        );
        let (a64, b64): (Vec<f64>, Vec<f64>) = (
            a.iter().map(|&x| x as f64).collect(),
            b.iter().map(|&x| x as f64).collect(),
        );
        for i in 0..batch {
            let want: Vec<f32> = naive(m, k, n, &a64[i * m * k..], k, 1, &b64, n, 1)
                .iter()
                .enumerate()
                .map(|(e, v)| (v + bias[e % n] as f64) as f32)
                .collect();
            let what = format!("bias, {batch}x[{m},{k}]x[{k},{n}]");
            assert_close(&got[i * m * n..(i + 1) * m * n], &want, 1e-4, &what);
        }
    }
}
