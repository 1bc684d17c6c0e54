//! Right operands stored transposed — `x @ w^T` with `w` row-major `[N, K]`,
//! every Linear layer's forward — copied row-major before the `gemm` crate
//! sees them.
//!
//! The `gemm` crate packs such a `b` slowly: W6's `[256, 1024] @ w^T` ran at
//! 117 GFLOP/s against 219 for the same product with `w` row-major, and a
//! batch of 64 at 48 against 214 (Zen 5, 2 threads). An 8x8 register
//! transpose writes the row-major copy (a 4 MiB weight in about 0.2 ms on
//! 2 threads, twice a copy's time), after which the crate takes its fast
//! path: 193-198 and 144-155 GFLOP/s for those two.

use super::super::cpu_isa::{self, Isa};
use super::SendPtr;
use std::cell::RefCell;

/// Elements of `b` from which the copy pays (below it the packing is cheap).
pub const MIN_ELEMS: usize = 64 * 1024;

/// Copies kept per thread for reuse up to this many elements (16 MiB); a
/// bigger one is allocated per call, so a huge weight is not held on to.
const KEPT_ELEMS: usize = 4 << 20;

/// Whether `b` (`k x n`, strides `b_rs, b_cs`) is stored transposed and big
/// enough for a row-major copy to pay.
///
/// ```
/// use kiln_runtime::externs::gemm::wants_row_major_copy;
/// assert!(wants_row_major_copy(1024, 1024, 1, 1024)); // w^T of a [1024, 1024] weight
/// assert!(!wants_row_major_copy(1024, 1024, 1024, 1)); // already row-major
/// ```
pub fn wants_row_major_copy(k: usize, n: usize, b_rs: isize, b_cs: isize) -> bool {
    b_rs == 1 && b_cs >= k as isize && n > 1 && k.saturating_mul(n) >= MIN_ELEMS
}

thread_local! {
    static KEPT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with a row-major (`k x n`, row stride `n`) copy of `b`, where
/// `b[p + j*b_cs]` is element `(p, j)`; rows are split across threads when
/// `parallel`.
///
/// # Safety
/// `b` is valid for the `k x n` view with row stride 1 and column stride `b_cs`.
pub(crate) unsafe fn with_row_major<R>(
    b: *const f32,
    k: usize,
    n: usize,
    b_cs: isize,
    parallel: bool,
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    // The copy starts on a cache line, as the gemm crate's own buffers do.
    let fill = |buf: &mut Vec<f32>| -> std::ops::Range<usize> {
        buf.clear();
        buf.reserve(k * n + LINE);
        let start = buf.as_ptr().align_offset(LINE * 4).min(LINE);
        buf.resize(start, 0.0);
        // SAFETY: `transpose` writes all `k * n` elements after `start`
        // before they are read.
        unsafe {
            transpose(b, b_cs, k, n, buf.as_mut_ptr().add(start), parallel);
            buf.set_len(start + k * n);
        }
        start..start + k * n
    };
    if k * n > KEPT_ELEMS {
        let mut buf = Vec::new();
        let copy = fill(&mut buf);
        return f(&buf[copy]);
    }
    // Taken out of the thread-local while `f` runs, so a nested product on
    // this thread (there is none today) would allocate rather than alias it.
    let mut buf = KEPT.with(|kept| std::mem::take(&mut *kept.borrow_mut()));
    let copy = fill(&mut buf);
    let out = f(&buf[copy]);
    KEPT.with(|kept| *kept.borrow_mut() = buf);
    out
}

/// A row-major (`k x n`) copy of `b`, where `b[p + j*b_cs]` is element
/// `(p, j)`: the form a Linear's weight `w^T` is kept in between calls
/// (`externs::packed::packed_on_reuse`). Rows are split across threads.
///
/// ```
/// use kiln_runtime::externs::gemm::row_major_copy;
/// // w = [[1, 2, 3], [4, 5, 6]] row-major; w^T is 3 x 2 with b_cs = 3
/// assert_eq!(row_major_copy(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, 3), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// ```
pub fn row_major_copy(b: &[f32], k: usize, n: usize, b_cs: usize) -> Vec<f32> {
    if k == 0 || n == 0 {
        return Vec::new();
    }
    assert!(
        b_cs >= k && b.len() > (n - 1) * b_cs + (k - 1),
        "row_major_copy: {} elements cannot hold a {k}x{n} view with column stride {b_cs}",
        b.len()
    );
    let mut out = Vec::with_capacity(k * n);
    let parallel = k * n >= MIN_ELEMS && super::threads() > 1;
    // SAFETY: the view was checked to lie in `b`; `transpose` writes all
    // `k * n` elements of `out` before the length covers them.
    unsafe {
        transpose(b.as_ptr(), b_cs as isize, k, n, out.as_mut_ptr(), parallel);
        out.set_len(k * n);
    }
    out
}

/// f32 in a 64-byte cache line.
const LINE: usize = 16;

/// `dst[p*n + j] = src[j*src_rs + p]` for `p < k`, `j < n` (the row-major copy).
///
/// # Safety
/// `src` valid for `n` rows of `k` at row stride `src_rs`; `dst` for `k * n`
/// writes, overlapping nothing in `src`.
unsafe fn transpose(
    src: *const f32,
    src_rs: isize,
    k: usize,
    n: usize,
    dst: *mut f32,
    parallel: bool,
) {
    let isa = cpu_isa::detect();
    let (src, dst) = (SendPtr(src as *mut f32), SendPtr(dst));
    let rows = |r: std::ops::Range<usize>| {
        // SAFETY: the caller's contract; the rows `r` of `dst` are this call's alone.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 | Isa::Avx2 => rows_avx2(src.get(), src_rs, r, n, dst.get()),
                _ => rows_scalar(src.get(), src_rs, r, n, dst.get()),
            }
        }
    };
    let blocks = k.div_ceil(8);
    if parallel && blocks > 1 {
        let chunks = crate::par::chunks(blocks);
        crate::par::for_each_chunk(
            chunks,
            || (),
            |_, c| {
                let b = crate::par::range(blocks, chunks, c);
                rows(b.start * 8..(b.end * 8).min(k))
            },
        );
    } else {
        rows(0..k);
    }
}

/// Rows `r` of the transpose, element by element.
unsafe fn rows_scalar(
    src: *const f32,
    src_rs: isize,
    r: std::ops::Range<usize>,
    n: usize,
    dst: *mut f32,
) {
    for j in 0..n {
        let s = src.offset(j as isize * src_rs);
        for p in r.clone() {
            *dst.add(p * n + j) = *s.add(p);
        }
    }
}

/// Rows `r` of the transpose in 8x8 blocks (eight loads, a register
/// transpose, eight stores), [`TILE`]-square tiles of them at a time: with a
/// weight's power-of-two row stride every row is its own page and every
/// line in one cache set, so a tile keeps the pages and lines in use few
/// (32: 1.6x faster than whole strips, 64 and 128 slower). The edges go
/// element by element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2(
    src: *const f32,
    src_rs: isize,
    r: std::ops::Range<usize>,
    n: usize,
    dst: *mut f32,
) {
    let (p_end, j_end) = (r.start + (r.end - r.start) / 8 * 8, n / 8 * 8);
    let at = |j: usize, p: usize| src.offset(j as isize * src_rs).add(p);
    for pt in (r.start..p_end).step_by(TILE) {
        for jt in (0..j_end).step_by(TILE) {
            for j in (jt..(jt + TILE).min(j_end)).step_by(8) {
                for p in (pt..(pt + TILE).min(p_end)).step_by(8) {
                    block_avx2(at(j, p), src_rs, dst.add(p * n + j), n);
                }
            }
        }
    }
    for j in j_end..n {
        for p in r.start..p_end {
            *dst.add(p * n + j) = *at(j, p);
        }
    }
    rows_scalar(src, src_rs, p_end..r.end, n, dst);
}

/// Side of the square tiles [`rows_avx2`] walks, in elements.
const TILE: usize = 32;

/// `dst[i*ld + l] = src[l*src_rs + i]` for one 8x8 block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_avx2(src: *const f32, src_rs: isize, dst: *mut f32, ld: usize) {
    use std::arch::x86_64::*;
    let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.offset(i as isize * src_rs)));
    // pairs, then quads, then halves: rows of the block become columns
    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let out = [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ];
    for (i, o) in out.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * ld), o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_matches_the_definition_on_ragged_shapes() {
        for &(k, n, pad) in &[
            (1, 1, 0),
            (8, 8, 0),
            (13, 29, 3),
            (64, 17, 1),
            (33, 40, 0),
            (136, 200, 5),
        ] {
            let rs = k + pad;
            let src: Vec<f32> = (0..n * rs).map(|i| i as f32).collect();
            for parallel in [false, true] {
                let mut dst = vec![f32::NAN; k * n];
                unsafe { transpose(src.as_ptr(), rs as isize, k, n, dst.as_mut_ptr(), parallel) };
                for p in 0..k {
                    for j in 0..n {
                        assert_eq!(dst[p * n + j], src[j * rs + p], "k={k} n={n} ({p},{j})");
                    }
                }
            }
        }
    }
}
