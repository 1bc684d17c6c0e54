//! One forward worker: a block of query rows of one head against every key,
//! tile by tile, with an online softmax.

use super::{axpy, dot, isa_dispatch, AttnCall, AttnElem, MaskRef, BK, BQ};
use crate::externs::cpu_isa::Isa;

/// Rows `i0 .. i0 + rows` of head `(n, h)`.
pub(crate) struct QueryBlock<'a> {
    pub call: &'a AttnCall,
    pub n: usize,
    pub h: usize,
    pub i0: usize,
    pub rows: usize,
}

impl QueryBlock<'_> {
    /// The key/value head this query head reads.
    pub(crate) fn kv_head(&self) -> usize {
        let d = self.call.dims;
        self.n * d.hk + self.h / (d.h / d.hk)
    }
}

/// The keys row `i` may see: all of them, or `0..=i` when causal.
#[inline(always)]
pub(crate) fn key_end(call: &AttnCall, i: usize) -> usize {
    if call.is_causal {
        (i + 1).min(call.dims.s)
    } else {
        call.dims.s
    }
}

/// Score `(i, j)`: `q_i . k_j * scale`, masked (`-inf` where it may not
/// attend, the float mask added).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn score<T: AttnElem>(
    call: &AttnCall,
    nh: [usize; 2],
    i: usize,
    j: usize,
    qi: &[T],
    kj: &[T],
    mask: &MaskRef<'_, T>,
) -> T {
    if call.is_causal && j > i {
        return T::NEG_INFINITY;
    }
    mask.apply(nh, i, j, dot(qi, kj) * T::from_f64(call.scale))
}

isa_dispatch! {
    /// Fills `o` (`rows x Ev`) and `ls` (`rows`) for one query block.
    pub(crate) fn run_forward => forward_body(
        b: &QueryBlock<'_>, q: &[T], k: &[T], v: &[T], mask: &MaskRef<'_, T>, o: &mut [T], ls: &mut [T],
    )
}

/// The running state of one query row.
#[derive(Clone, Copy)]
struct Row<T> {
    max: T,
    sum: T,
    nan: bool,
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_body<T: AttnElem>(
    isa: Isa,
    b: &QueryBlock<'_>,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: &MaskRef<'_, T>,
    o: &mut [T],
    ls: &mut [T],
) {
    let d = b.call.dims;
    let (e, ev) = (d.e, d.ev);
    let kv = b.kv_head();
    let (kh, vh) = (
        &k[kv * d.s * e..][..d.s * e],
        &v[kv * d.s * ev..][..d.s * ev],
    );
    let qh = &q[(b.n * d.h + b.h) * d.l * e..][..d.l * e];
    let nh = [b.n, b.h];
    let mut rows = [Row {
        max: T::NEG_INFINITY,
        sum: T::ZERO,
        nan: false,
    }; BQ];
    let mut tile = [T::ZERO; BQ * BK];
    let mut alpha = [T::ONE; BQ];
    o.iter_mut().for_each(|x| *x = T::ZERO);
    let last = b.i0 + b.rows - 1;
    let keys = key_end(b.call, last);
    for j0 in (0..keys).step_by(BK) {
        let jn = BK.min(keys - j0);
        for r in 0..b.rows {
            let i = b.i0 + r;
            let qi = &qh[i * e..][..e];
            let t = &mut tile[r * BK..][..jn];
            for (c, s) in t.iter_mut().enumerate() {
                let j = j0 + c;
                *s = score(b.call, nh, i, j, qi, &kh[j * e..][..e], mask);
            }
            // the tile's max: -inf and NaN never raise it (NaN is flagged)
            let mut m = rows[r].max;
            for &s in t.iter() {
                rows[r].nan |= s.is_nan();
                if s > m {
                    m = s;
                }
            }
            if m == T::NEG_INFINITY {
                // nothing visible yet (exp(s - m) would be NaN): the row skips this tile
                continue;
            }
            // rescales what was summed against the old max (0 if none)
            alpha[r] = (rows[r].max - m).exp();
            rows[r].max = m;
            t.iter_mut().for_each(|s| *s = *s - m);
        }
        // one exp per score, the whole tile at once (wide helper for f32)
        T::exp_tile(isa, &mut tile[..b.rows * BK]);
        for r in 0..b.rows {
            if rows[r].max == T::NEG_INFINITY {
                continue;
            }
            let t = &tile[r * BK..][..jn];
            let orow = &mut o[r * ev..][..ev];
            if alpha[r] != T::ONE {
                orow.iter_mut().for_each(|x| *x = *x * alpha[r]);
                rows[r].sum = rows[r].sum * alpha[r];
            }
            let mut sum = T::ZERO;
            for (c, &p) in t.iter().enumerate() {
                sum += p;
                axpy(orow, p, &vh[(j0 + c) * ev..][..ev]);
            }
            rows[r].sum += sum;
        }
    }
    finish(b.call, mask.present(), &rows[..b.rows], o, ls);
}

/// Divides each row by its sum and writes its logsumexp (see the module
/// docs for rows with no visible key and NaN rows).
fn finish<T: AttnElem>(call: &AttnCall, masked: bool, rows: &[Row<T>], o: &mut [T], ls: &mut [T]) {
    let ev = call.dims.ev;
    for (r, row) in rows.iter().enumerate() {
        let orow = &mut o[r * ev..][..ev];
        if row.nan {
            orow.iter_mut().for_each(|x| *x = T::NAN);
            ls[r] = T::NAN;
        } else if row.max == T::NEG_INFINITY {
            let fill = if masked { T::ZERO } else { T::NAN };
            orow.iter_mut().for_each(|x| *x = fill);
            ls[r] = if masked { T::NEG_INFINITY } else { T::NAN };
        } else {
            let inv = T::ONE / row.sum;
            orow.iter_mut().for_each(|x| *x = *x * inv);
            ls[r] = row.max + row.sum.ln();
        }
    }
}
