//! Matrix multiplication on the CPU, wrapping the `gemm` crate (AVX2/AVX-512
//! microkernels chosen at run time). Operands may be strided views (a
//! transposed operand costs nothing); outputs are written row-major.

use super::{threads, Elem, SendPtr, PAR_MIN_WORK};

mod skinny;
mod transposed;
pub use gemm::Parallelism;
pub use skinny::takes as skinny_takes;
pub use transposed::{row_major_copy, wants_row_major_copy};

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
    if super::conv::is_f32::<T>() && a_cs == 1 && b_rs == 1 {
        let p = skinny::Skinny {
            m,
            k,
            n,
            a: a as *const f32,
            a_rs,
            b: b as *const f32,
            b_cs,
            dst: dst as *mut f32,
            dst_rs,
            dst_cs,
            accumulate,
        };
        if skinny::try_gemm(p, !matches!(par, Parallelism::None)) {
            return;
        }
    }
    // gemm computes dst := alpha*dst + beta*lhs*rhs (alpha read only if read_dst).
    let (dst_p, a_p) = (SendPtr(dst), SendPtr(a as *mut T));
    let cols = |j: std::ops::Range<usize>, b: SendPtr<T>, b_rs: isize, b_cs: isize, par| {
        // SAFETY: the caller's contract; columns `j` of `dst` and `b`
        unsafe {
            gemm::gemm(
                m,
                j.len(),
                k,
                dst_p.get().offset(j.start as isize * dst_cs),
                dst_cs,
                dst_rs,
                accumulate,
                a_p.get(),
                a_cs,
                a_rs,
                b.get().offset(j.start as isize * b_cs),
                b_cs,
                b_rs,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                par,
            )
        }
    };
    let run = |b: *const T, b_rs: isize, b_cs: isize| {
        let b = SendPtr(b as *mut T);
        if !column_split(m, n, par) {
            return cols(0..n, b, b_rs, b_cs, par);
        }
        let blocks = n.div_ceil(SPLIT_COLS);
        let chunks = crate::par::chunks(blocks);
        crate::par::for_each_chunk(
            chunks,
            || (),
            |_, c| {
                let r = crate::par::range(blocks, chunks, c);
                // each chunk writes only its own columns of `dst`
                let j = r.start * SPLIT_COLS..(r.end * SPLIT_COLS).min(n);
                cols(j, b, b_rs, b_cs, Parallelism::None)
            },
        );
    };
    if super::conv::is_f32::<T>() && wants_row_major_copy(k, n, b_rs, b_cs) {
        let parallel = !matches!(par, Parallelism::None);
        transposed::with_row_major(b as *const f32, k, n, b_cs, parallel, |copy| {
            run(copy.as_ptr() as *const T, n as isize, 1)
        })
    } else {
        run(b, b_rs, b_cs)
    }
}

/// Columns per block of a [`column_split`] product (a multiple of the
/// microkernels' widths).
const SPLIT_COLS: usize = 64;

/// Rows up to which [`column_split`] applies: on a 2-vCPU Xeon (AVX-512)
/// 64 x 1024 x 1024 went from 98-106 to 233-236 GFLOP/s, 256-row
/// products from 285 to 311 and 188 to 232; at 1024 rows it is even.
const SPLIT_MAX_ROWS: usize = 256;

/// Whether a threaded product of few rows runs as column blocks on the
/// pool, one single-threaded GEMM each, instead of the `gemm` crate's own
/// split (which left a 64-row product at about one thread's speed).
fn column_split(m: usize, n: usize, par: Parallelism) -> bool {
    !matches!(par, Parallelism::None) && m <= SPLIT_MAX_ROWS && n >= 4 * SPLIT_COLS
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
/// `b_offsets[i]` into `out[i*m*n..][..m*n]` (contiguous `[batch, m, n]`),
/// plus `bias` (`n` elements) on every row when given. Handles any
/// broadcast pattern of batch dims (see [`batch_offsets`]). `out` is only
/// written, never read: it may hold anything on entry.
///
/// The bias is stored first and the products accumulate onto it, as
/// PyTorch's `addmm` does for a Linear: no second pass over the output,
/// and no second output alive beside it.
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
    bias: Option<&[T]>,
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
    if let Some(bias) = bias {
        assert_eq!(
            bias.len(),
            n,
            "batched_matmul: bias has {} elements, expected {n}",
            bias.len()
        );
        fill_rows(out, bias);
    }
    let accumulate = bias.is_some();
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
                accumulate,
                par,
            )
        }
    };
    // enough items to balance over the pool go to it whole, one
    // single-threaded product each: ViT-B/16's 96 heads of 197x64x197 ran
    // 95 -> 143 GFLOP/s (and their 197x197x64 126 -> 166) on 2 vCPUs that way
    // instead of threading each product; a few big items are threaded one by one
    let few = batch < 4 * threads();
    let sequential = threads() == 1
        || batch * work < PAR_MIN_WORK
        || few && (batch == 1 || work >= 8 * GEMM_PAR_THRESHOLD);
    if sequential {
        let par = auto_parallelism(m, k, n);
        (0..batch).for_each(|i| run(i, par));
    } else {
        crate::par::for_each_chunk(batch, || (), |_, i| run(i, Parallelism::None));
    }
}

/// Copies `row` over every row of `out` (its length a multiple of the
/// row's), on the pool when there is enough of it.
fn fill_rows<T: Elem>(out: &mut [T], row: &[T]) {
    if row.is_empty() {
        return;
    }
    let fill = |rows: &mut [T]| {
        rows.chunks_mut(row.len())
            .for_each(|d| d.copy_from_slice(row))
    };
    if threads() == 1 || out.len() < PAR_MIN_WORK {
        return fill(out);
    }
    let rows = out.len() / row.len();
    let per_piece = rows.div_ceil(crate::par::chunks(rows)) * row.len();
    crate::par::for_each_piece(out, per_piece, || (), |_, _, piece| fill(piece));
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
    batched_matmul_offsets(m, k, n, a, &ao, a_rs, a_cs, b, &bo, b_rs, b_cs, out, None);
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
mod tests;
