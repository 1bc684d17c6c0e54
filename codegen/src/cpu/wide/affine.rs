//! A normalisation's row pass at the helper's width.
//!
//! layer_norm's (and batch/instance/group norm's, per row) second pass is
//! `out[i] = (x[i] - mean) * rstd`, times a weight row and plus a bias row
//! when affine. The row was just read by the Welford helper, so it is in L1
//! and the f32x4 Cranelift loop doing this was compute-bound: a third of
//! W3's time. Here it runs in registers at 8 or 16 lanes, the rest of the
//! row one lane at a time; the same IEEE subtract, multiplies and add in
//! the same order give the Cranelift code's bits.

use super::lanes::{Lanes, Scalar};

/// One row for the helper (built on the JIT code's stack). `w` and `b` are
/// null when the pass has no weight or bias row.
#[repr(C)]
pub struct AffineRow {
    pub x: *const f32,
    pub w: *const f32,
    pub b: *const f32,
    pub out: *mut f32,
    /// The next row of `x` (null when there is none): fetched into L1
    /// while this one is written ([`super::prefetch::next_row`]).
    pub next: *const f32,
    pub n: u64,
    /// Elements of the whole launch (every row), to choose streaming stores.
    pub launch: u64,
    pub mean: f32,
    pub rstd: f32,
}

/// `out = ((x - mean) * rstd) * w + b` over the row with `L`, the last
/// `n % L::N` elements with one lane.
///
/// # Safety
/// The row's pointers cover `n` f32 each (`out` may be `x`); the CPU has
/// `L`'s ISA.
#[inline(always)]
pub(crate) unsafe fn affine_row<L: Lanes>(r: &AffineRow) {
    let n = r.n as usize;
    let main = n - n % L::N;
    // x, out, the weight and bias rows, and the next row
    let rows = 3 + !r.w.is_null() as usize + !r.b.is_null() as usize;
    super::prefetch::next_row(r.next, n, rows);
    span::<L>(r, 0, main);
    span::<Scalar>(r, main, n);
}

#[inline(always)]
unsafe fn span<L: Lanes>(r: &AffineRow, lo: usize, hi: usize) {
    let (m, s) = (L::splat(r.mean), L::splat(r.rstd));
    // read x, write out: past the caches when that is more than they hold
    let nt = super::streams(2 * 4 * r.launch) && (r.out as usize).is_multiple_of(64);
    let mut i = lo;
    while i < hi {
        let mut v = L::mul(L::sub(L::load(r.x.add(i)), m), s);
        if !r.w.is_null() {
            v = L::mul(v, L::load(r.w.add(i)));
        }
        if !r.b.is_null() {
            v = L::add(v, L::load(r.b.add(i)));
        }
        if nt {
            L::store_nt(r.out.add(i), v);
        } else {
            L::store(r.out.add(i), v);
        }
        i += L::N;
    }
}
