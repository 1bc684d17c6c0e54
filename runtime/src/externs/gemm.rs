//! Matrix multiplication on the CPU, wrapping the `gemm` crate (AVX2/AVX-512
//! microkernels chosen at run time). Operands may be strided views (a
//! transposed operand costs nothing); outputs are written row-major.

use super::{threads, Elem, SendPtr, PAR_MIN_WORK};
pub use gemm::Parallelism;
use rayon::prelude::*;

/// Multiply-adds above which a single GEMM is split across rayon's threads.
pub const GEMM_PAR_THRESHOLD: usize = 64 * 64 * 64;

/// Elements of a strided `rows x cols` view a slice must hold.
fn span(rows: usize, cols: usize, rs: isize, cs: isize, what: &str) -> usize {
    assert!(
        rs >= 0 && cs >= 0,
        "gemm: {what} strides ({rs},{cs}) must be non-negative"
    );
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs as usize + (cols - 1) * cs as usize + 1
    }
}

/// Whether distinct `(i, j)` of an `m x n` view map to distinct elements
/// (checked for the common row- or column-major-like layouts).
fn no_alias(m: usize, n: usize, rs: isize, cs: isize) -> bool {
    let (mi, ni) = (m as isize, n as isize);
    m <= 1 && (n <= 1 || cs >= 1)
        || n <= 1 && rs >= 1
        || cs >= 1 && rs >= ni * cs
        || rs >= 1 && cs >= mi * rs
}

/// The parallelism to ask of the `gemm` crate for one `m x k x n` product.
pub fn auto_parallelism(m: usize, k: usize, n: usize) -> Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= GEMM_PAR_THRESHOLD && threads() > 1 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// `dst[i*dst_rs + j*dst_cs] (+)= sum_p a[i*a_rs + p*a_cs] * b[p*b_rs + j*b_cs]`.
///
/// # Safety
/// All pointers must be valid for the strided views they describe, and `dst`
/// must not overlap `a` or `b` nor map two `(i, j)` to one element.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_raw<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const T,
    a_rs: isize,
    a_cs: isize,
    b: *const T,
    b_rs: isize,
    b_cs: isize,
    dst: *mut T,
    dst_rs: isize,
    dst_cs: isize,
    accumulate: bool,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *dst.offset(i as isize * dst_rs + j as isize * dst_cs) = T::ZERO;
                }
            }
        }
        return;
    }
    // gemm computes dst := alpha*dst + beta*lhs*rhs (alpha read only if read_dst).
    gemm::gemm(
        m,
        n,
        k,
        dst,
        dst_cs,
        dst_rs,
        accumulate,
        a,
        a_cs,
        a_rs,
        b,
        b_cs,
        b_rs,
        T::ONE,
        T::ONE,
        false,
        false,
        false,
        par,
    );
}

/// General strided GEMM: `out (+)= A @ B` with `A` an `m x k` view of `a`,
/// `B` a `k x n` view of `b` and `out` an `m x n` view (all strides in elements,
/// non-negative). `accumulate` adds to `out` instead of overwriting it.
/// Big products are split across rayon's threads.
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    a_rs: isize,
    a_cs: isize,
    b: &[T],
    b_rs: isize,
    b_cs: isize,
    out: &mut [T],
    out_rs: isize,
    out_cs: isize,
    accumulate: bool,
) {
    let par = auto_parallelism(m, k, n);
    gemm_with(
        m, k, n, a, a_rs, a_cs, b, b_rs, b_cs, out, out_rs, out_cs, accumulate, par,
    );
}

/// [`gemm_strided`] with the parallelism chosen by the caller (`Parallelism::None`
/// inside an already-parallel loop).
#[allow(clippy::too_many_arguments)]
pub fn gemm_with<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    a_rs: isize,
    a_cs: isize,
    b: &[T],
    b_rs: isize,
    b_cs: isize,
    out: &mut [T],
    out_rs: isize,
    out_cs: isize,
    accumulate: bool,
    par: Parallelism,
) {
    assert!(
        a.len() >= span(m, k, a_rs, a_cs, "lhs"),
        "gemm: lhs slice too short"
    );
    assert!(
        b.len() >= span(k, n, b_rs, b_cs, "rhs"),
        "gemm: rhs slice too short"
    );
    assert!(
        out.len() >= span(m, n, out_rs, out_cs, "out"),
        "gemm: out slice too short"
    );
    assert!(
        no_alias(m, n, out_rs, out_cs),
        "gemm: out strides ({out_rs},{out_cs}) of a {m}x{n} view alias elements"
    );
    // SAFETY: bounds checked above; `out` is exclusively borrowed.
    unsafe {
        gemm_raw(
            m,
            k,
            n,
            a.as_ptr(),
            a_rs,
            a_cs,
            b.as_ptr(),
            b_rs,
            b_cs,
            out.as_mut_ptr(),
            out_rs,
            out_cs,
            accumulate,
            par,
        )
    }
}

/// `out[m,n] = A @ B` with strided `A` (`m x k`) and `B` (`k x n`); `out` contiguous.
///
/// A transposed operand is just swapped strides: `A^T` of a row-major `[k,m]`
/// array is `a_rs = 1, a_cs = m`.
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    a_rs: isize,
    a_cs: isize,
    b: &[T],
    b_rs: isize,
    b_cs: isize,
    out: &mut [T],
) {
    assert_eq!(
        out.len(),
        m * n,
        "matmul: out has {} elements, expected {m}x{n}",
        out.len()
    );
    gemm_strided(
        m, k, n, a, a_rs, a_cs, b, b_rs, b_cs, out, n as isize, 1, false,
    );
}

/// Offsets of every index of a row-major `batch` shape given per-dim strides
/// (0 for broadcast dims): the operand offsets of a broadcast batched matmul.
pub fn batch_offsets(batch: &[usize], strides: &[usize]) -> Vec<usize> {
    assert_eq!(batch.len(), strides.len(), "batch_offsets: rank mismatch");
    let mut offs = vec![0usize];
    for (&d, &s) in batch.iter().zip(strides) {
        offs = offs
            .iter()
            .flat_map(|&o| (0..d).map(move |i| o + i * s))
            .collect();
    }
    offs
}

/// Batched matmul where item `i` multiplies the views at `a_offsets[i]` and
/// `b_offsets[i]` into `out[i*m*n..][..m*n]` (contiguous `[batch, m, n]`).
/// Handles any broadcast pattern of batch dims (see [`batch_offsets`]).
#[allow(clippy::too_many_arguments)]
pub fn batched_matmul_offsets<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    a_offsets: &[usize],
    a_rs: isize,
    a_cs: isize,
    b: &[T],
    b_offsets: &[usize],
    b_rs: isize,
    b_cs: isize,
    out: &mut [T],
) {
    let batch = a_offsets.len();
    assert_eq!(
        b_offsets.len(),
        batch,
        "batched_matmul: {batch} lhs offsets but {} rhs offsets",
        b_offsets.len()
    );
    assert_eq!(
        out.len(),
        batch * m * n,
        "batched_matmul: out has {} elements, expected {batch}x{m}x{n}",
        out.len()
    );
    let (sa, sb) = (span(m, k, a_rs, a_cs, "lhs"), span(k, n, b_rs, b_cs, "rhs"));
    assert!(
        sa == 0 || a_offsets.iter().all(|&o| o + sa <= a.len()),
        "batched_matmul: lhs offset out of range"
    );
    assert!(
        sb == 0 || b_offsets.iter().all(|&o| o + sb <= b.len()),
        "batched_matmul: rhs offset out of range"
    );
    if m * n == 0 {
        return;
    }
    let work = m * n * k.max(1);
    let dst = SendPtr(out.as_mut_ptr());
    let run = |i: usize, par: Parallelism| {
        // SAFETY: offsets checked above; item i writes only its own m*n block.
        unsafe {
            gemm_raw(
                m,
                k,
                n,
                a.as_ptr().add(a_offsets[i]),
                a_rs,
                a_cs,
                b.as_ptr().add(b_offsets[i]),
                b_rs,
                b_cs,
                dst.get().add(i * m * n),
                n as isize,
                1,
                false,
                par,
            )
        }
    };
    if work >= 8 * GEMM_PAR_THRESHOLD || batch == 1 || threads() == 1 || batch * work < PAR_MIN_WORK
    {
        // Big items (or nothing to split): one product at a time, each threaded if big.
        let par = auto_parallelism(m, k, n);
        (0..batch).for_each(|i| run(i, par));
    } else {
        (0..batch)
            .into_par_iter()
            .for_each(|i| run(i, Parallelism::None));
    }
}

/// Batched matmul with one batch stride per operand (0 broadcasts an operand):
/// `out[i] = A_i @ B_i`, `A_i` at `a[i*a_bs..]`, `B_i` at `b[i*b_bs..]`; `out`
/// contiguous `[batch, m, n]`.
#[allow(clippy::too_many_arguments)]
pub fn batched_matmul<T: Elem>(
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    a_bs: usize,
    a_rs: isize,
    a_cs: isize,
    b: &[T],
    b_bs: usize,
    b_rs: isize,
    b_cs: isize,
    out: &mut [T],
) {
    let ao: Vec<usize> = (0..batch).map(|i| i * a_bs).collect();
    let bo: Vec<usize> = (0..batch).map(|i| i * b_bs).collect();
    batched_matmul_offsets(m, k, n, a, &ao, a_rs, a_cs, b, &bo, b_rs, b_cs, out);
}

/// `F.linear`: `out[M,N] = input[M,K] @ weight[N,K]^T (+ bias[N])`, all
/// contiguous; the weight is read transposed through its strides, not copied.
pub fn linear<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    assert_eq!(
        input.len(),
        m * k,
        "linear: input has {} elements, expected {m}x{k}",
        input.len()
    );
    assert_eq!(
        weight.len(),
        n * k,
        "linear: weight has {} elements, expected {n}x{k}",
        weight.len()
    );
    assert_eq!(
        out.len(),
        m * n,
        "linear: out has {} elements, expected {m}x{n}",
        out.len()
    );
    let accumulate = match bias {
        Some(bv) => {
            assert_eq!(
                bv.len(),
                n,
                "linear: bias has {} elements, expected {n}",
                bv.len()
            );
            if n > 0 {
                out.chunks_exact_mut(n)
                    .for_each(|row| row.copy_from_slice(bv));
            }
            true
        }
        None => false,
    };
    gemm_strided(
        m, k, n, input, k as isize, 1, weight, 1, k as isize, out, n as isize, 1, accumulate,
    );
}

/// A 16-bit float stored narrow and computed in f32.
pub trait HalfElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even.
    fn from_f32(v: f32) -> Self;
}

impl HalfElem for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

impl HalfElem for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// Widens a strided `rows x cols` view to a contiguous f32 array.
fn widen<H: HalfElem>(
    rows: usize,
    cols: usize,
    x: &[H],
    rs: isize,
    cs: isize,
    what: &str,
) -> Vec<f32> {
    assert!(
        x.len() >= span(rows, cols, rs, cs, what),
        "matmul_half: {what} slice too short"
    );
    let (rs, cs) = (rs as usize, cs as usize);
    let mut v = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        if cs == 1 {
            v.extend(x[i * rs..i * rs + cols].iter().map(|h| h.to_f32()));
        } else {
            v.extend((0..cols).map(|j| x[i * rs + j * cs].to_f32()));
        }
    }
    v
}

/// bf16/f16 matmul: widens both operands to f32, multiplies with f32
/// accumulation, and rounds the result back to nearest-even.
#[allow(clippy::too_many_arguments)]
pub fn matmul_half<H: HalfElem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[H],
    a_rs: isize,
    a_cs: isize,
    b: &[H],
    b_rs: isize,
    b_cs: isize,
    out: &mut [H],
) {
    assert_eq!(
        out.len(),
        m * n,
        "matmul_half: out has {} elements, expected {m}x{n}",
        out.len()
    );
    let af = widen(m, k, a, a_rs, a_cs, "lhs");
    let bf = widen(k, n, b, b_rs, b_cs, "rhs");
    let mut of = vec![0f32; m * n];
    matmul(m, k, n, &af, k as isize, 1, &bf, n as isize, 1, &mut of);
    for (o, v) in out.iter_mut().zip(&of) {
        *o = H::from_f32(*v);
    }
}

#[cfg(test)]
mod tests {
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
            m, k, n, &a, &ao, k as isize, 1, &b, &bo, n as isize, 1, &mut got,
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
                want[i * n + j] =
                    bias[j] + (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>();
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
        for _ in 0..12 {
            let t = std::time::Instant::now();
            matmul(n, n, n, &a, n as isize, 1, &b, n as isize, 1, &mut c);
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let f = 2.0 * (n * n * n) as f64;
        println!(
            "matmul 1024^3 f32 ({} threads): median {:.2} ms = {:.1} GFLOP/s, best {:.1} GFLOP/s",
            threads(),
            times[6] * 1e3,
            f / times[6] / 1e9,
            f / times[0] / 1e9
        );
    }
}
