//! Products with at most [`MAX_ROWS`] rows whose right operand has
//! contiguous columns: a Linear layer at a small batch, `x @ w^T` with
//! `w` row-major `[N, K]`.
//!
//! Each output is the dot product of a row of `a` with a column of `b`,
//! both contiguous, so one sweep reads `b` once (the weight: megabytes) and
//! `a` from L1. The `gemm` crate packs `b` into panels first and, for
//! MobileNetV3's classifier (`[8, 576] @ [576, 1024]` and
//! `[8, 1024] @ [1024, 1000]`), took 0.7-4 ms a product where reading the
//! weights takes 0.1-0.2 ms. Two columns share each load of `a`'s rows;
//! AVX-512 or AVX2 + FMA, chosen at run time (elsewhere the `gemm` crate).

use super::super::cpu_isa::{self, Isa};

/// Rows of `a` (and of the output) up to which the dot products are used.
pub const MAX_ROWS: usize = 8;

/// One product for [`try_gemm`]: `dst[i*dst_rs + j*dst_cs] (+)= sum_p
/// a[i*a_rs + p] * b[p + j*b_cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Skinny {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: *const f32,
    pub a_rs: isize,
    pub b: *const f32,
    pub b_cs: isize,
    pub dst: *mut f32,
    pub dst_rs: isize,
    pub dst_cs: isize,
    pub accumulate: bool,
}

// SAFETY: the views are valid for the whole `try_gemm` call (its contract)
// and each thread writes only its own columns of `dst`.
unsafe impl Send for Skinny {}
unsafe impl Sync for Skinny {}

/// Whether [`try_gemm`] runs a product of `m` rows whose `a` has column
/// stride `a_cs` (and `b` contiguous columns): then `b` is read as stored,
/// and a row-major copy of it would only change the summation order.
///
/// ```
/// use kiln_runtime::externs::gemm::skinny_takes;
/// assert!(!skinny_takes(9, 1)); // more rows than the dot products take
/// ```
pub fn takes(m: usize, a_cs: isize) -> bool {
    m > 0 && m <= MAX_ROWS && a_cs == 1 && cpu_isa::detect() != Isa::Scalar
}

/// Runs `p` by dot products when it qualifies ([`takes`], `a`'s rows
/// contiguous); false, nothing written, otherwise. Columns are split across
/// threads when `parallel`; every output is one thread's, so results do
/// not depend on the split.
///
/// # Safety
/// The pointers are valid for the strided views `p` describes and `dst`
/// overlaps neither input nor maps two outputs to one element.
pub(crate) unsafe fn try_gemm(p: Skinny, parallel: bool) -> bool {
    if !takes(p.m, 1) {
        return false;
    }
    let isa = cpu_isa::detect();
    let run = |cols: std::ops::Range<usize>| {
        // SAFETY: the caller's contract; the ISA was detected.
        unsafe {
            macro_rules! by_rows {
                ($f:ident) => {
                    match p.m {
                        1 => $f::<1>(&p, cols),
                        2 => $f::<2>(&p, cols),
                        3 => $f::<3>(&p, cols),
                        4 => $f::<4>(&p, cols),
                        5 => $f::<5>(&p, cols),
                        6 => $f::<6>(&p, cols),
                        7 => $f::<7>(&p, cols),
                        _ => $f::<8>(&p, cols),
                    }
                };
            }
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => by_rows!(columns_avx512),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => by_rows!(columns_avx2),
                _ => unreachable!("no wide ISA: returned above"),
            }
        }
    };
    if parallel {
        let chunks = crate::par::chunks(p.n.div_ceil(2));
        crate::par::for_each_chunk(chunks, || (), |_, c| run(crate::par::range(p.n, chunks, c)));
    } else {
        run(0..p.n);
    }
    true
}

/// The column loop for one ISA and `M` rows (kept in registers): `$lanes`
/// f32 per vector, two columns at a time (an odd last one computed twice),
/// the `k % $lanes` tail in scalar code added after the vector sum.
macro_rules! columns {
    ($name:ident, $feat:literal, $lanes:literal, $vec:ty, $zero:ident, $load:ident,
     $fma:ident, $sum:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const M: usize>(p: &Skinny, cols: std::ops::Range<usize>) {
            use std::arch::x86_64::*;
            let main = p.k - p.k % $lanes;
            let row = |i: usize| p.a.offset(i as isize * p.a_rs);
            let col = |j: usize| p.b.offset(j as isize * p.b_cs);
            let tail = |i: usize, j: usize| {
                (main..p.k).fold(0.0f32, |s, q| s + *row(i).add(q) * *col(j).add(q))
            };
            let store = |i: usize, j: usize, v: f32| {
                let d = p.dst.offset(i as isize * p.dst_rs + j as isize * p.dst_cs);
                *d = if p.accumulate { *d + v } else { v };
            };
            let mut j = cols.start;
            while j < cols.end {
                let two = j + 1 < cols.end;
                let (c0, c1) = (col(j), col(if two { j + 1 } else { j }));
                let mut acc: [[$vec; 2]; M] = [[$zero(); 2]; M];
                let mut q = 0;
                while q < main {
                    let (w0, w1) = ($load(c0.add(q)), $load(c1.add(q)));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let x = $load(row(i).add(q));
                        a[0] = $fma(x, w0, a[0]);
                        a[1] = $fma(x, w1, a[1]);
                    }
                    q += $lanes;
                }
                for (i, a) in acc.iter().enumerate() {
                    store(i, j, $sum(a[0]) + tail(i, j));
                    if two {
                        store(i, j + 1, $sum(a[1]) + tail(i, j + 1));
                    }
                }
                j += 2;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

columns!(
    columns_avx512,
    "avx512f,avx2,fma",
    16,
    __m512,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    _mm512_reduce_add_ps
);
columns!(
    columns_avx2,
    "avx2,fma",
    8,
    __m256,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    sum256
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::externs::testutil::Lcg;

    /// Against f64 dot products: every row count, odd column counts, `k`
    /// with and without a tail, accumulating or not, a strided output.
    #[test]
    fn dot_products_match_f64_sums() {
        if cpu_isa::detect() == Isa::Scalar {
            eprintln!("no AVX2 or AVX-512 here: the gemm crate runs these");
            return;
        }
        let mut r = Lcg(9);
        for m in 1..=MAX_ROWS {
            for (k, n) in [(1, 1), (15, 3), (16, 2), (37, 5), (576, 9)] {
                let a: Vec<f32> = r.vec(m * k);
                let w: Vec<f32> = r.vec(n * k); // [n, k]: b = w^T
                for accumulate in [false, true] {
                    let mut dst: Vec<f32> = r.vec(2 * m * n);
                    let before = dst.clone();
                    let p = Skinny {
                        m,
                        k,
                        n,
                        a: a.as_ptr(),
                        a_rs: k as isize,
                        b: w.as_ptr(),
                        b_cs: k as isize,
                        dst: dst.as_mut_ptr(),
                        dst_rs: 2 * n as isize,
                        dst_cs: 2,
                        accumulate,
                    };
                    // SAFETY: the buffers cover the views described.
                    assert!(unsafe { try_gemm(p, n > 4) });
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k)
                                .map(|q| a[i * k + q] as f64 * w[j * k + q] as f64)
                                .sum();
                            let at = i * 2 * n + 2 * j;
                            let want = dot + if accumulate { before[at] as f64 } else { 0.0 };
                            let got = dst[at] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "m {m} k {k} n {n} acc {accumulate} ({i},{j}): {got} vs {want}"
                            );
                            assert_eq!(dst[at + 1], before[at + 1], "gap written");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn too_many_rows_are_left_to_the_gemm_crate() {
        let (a, b, mut d) = (vec![0f32; 9], vec![0f32; 1], vec![0f32; 9]);
        let p = Skinny {
            m: MAX_ROWS + 1,
            k: 1,
            n: 1,
            a: a.as_ptr(),
            a_rs: 1,
            b: b.as_ptr(),
            b_cs: 1,
            dst: d.as_mut_ptr(),
            dst_rs: 1,
            dst_cs: 1,
            accumulate: false,
        };
        // SAFETY: nothing is read or written when it declines.
        assert!(!unsafe { try_gemm(p, false) });
    }
}
