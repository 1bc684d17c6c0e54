//! One forward worker: a block of query rows of one head against every key,
//! tile by tile, with an online softmax. Both products of a tile are GEMMs
//! on the `gemm` crate's register-tiled microkernels: `S = Q_blk K_blk^T`
//! (`BQ x BK`) and `O_blk += P V_blk`; only the softmax between them (scale,
//! mask, running max, one exp per score) is written here.

use super::{isa_dispatch, tile_gemm, AttnCall, AttnElem, MaskRef, Mat, BK, BQ};
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

/// Turns the raw dot products `t[c] = q_i . k_{j0+c}` of row `i` into
/// masked scores: times the scale, the mask applied, `-inf` past the causal
/// edge.
#[inline(always)]
pub(crate) fn mask_row<T: AttnElem>(
    call: &AttnCall,
    mask: &MaskRef<'_, T>,
    nh: [usize; 2],
    (i, j0): (usize, usize),
    t: &mut [T],
) {
    let scale = T::from_f64(call.scale);
    t.iter_mut().for_each(|s| *s = *s * scale);
    if mask.present() {
        for (c, s) in t.iter_mut().enumerate() {
            *s = mask.apply(nh, i, j0 + c, *s);
        }
    }
    let visible = key_end(call, i).saturating_sub(j0).min(t.len());
    t[visible..].iter_mut().for_each(|s| *s = T::NEG_INFINITY);
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

/// Folds one row of masked scores into its running state: `t` becomes
/// `t - max` (to be exponentiated) and the factor that rescales what was
/// summed against the old max is returned; `None` when the row has seen no
/// visible key yet (its tile stays `-inf`, so it adds nothing).
#[inline(always)]
fn fold_row<T: AttnElem>(row: &mut Row<T>, t: &mut [T]) -> Option<T> {
    // the tile's max: -inf and NaN never raise it (NaN is flagged)
    let mut m = row.max;
    let mut nan = false;
    for &s in t.iter() {
        nan |= s.is_nan();
        m = if s > m { s } else { m };
    }
    row.nan |= nan;
    if m == T::NEG_INFINITY {
        return None;
    }
    let alpha = (row.max - m).exp();
    row.max = m;
    t.iter_mut().for_each(|s| *s = *s - m);
    Some(alpha)
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
    let qb = &q[((b.n * d.h + b.h) * d.l + b.i0) * e..][..b.rows * e];
    let nh = [b.n, b.h];
    let mut rows = [Row {
        max: T::NEG_INFINITY,
        sum: T::ZERO,
        nan: false,
    }; BQ];
    let mut tile = vec![T::ZERO; BQ * BK];
    let mut live = [false; BQ];
    o.iter_mut().for_each(|x| *x = T::ZERO);
    let keys = key_end(b.call, b.i0 + b.rows - 1);
    for j0 in (0..keys).step_by(BK) {
        let jn = BK.min(keys - j0);
        // S = Q_blk K_blk^T: K's rows read as columns
        tile_gemm(
            (b.rows, e, jn),
            Mat::rows(qb, e),
            Mat::cols(&kh[j0 * e..], e),
            &mut tile,
            BK,
            false,
        );
        let mut alpha = [T::ONE; BQ];
        for r in 0..b.rows {
            let t = &mut tile[r * BK..][..jn];
            mask_row(b.call, mask, nh, (b.i0 + r, j0), t);
            live[r] = match fold_row(&mut rows[r], t) {
                Some(a) => {
                    alpha[r] = a;
                    true
                }
                None => false,
            };
        }
        // one exp per score, the whole tile at once (wide helper for f32)
        T::exp_tile(isa, &mut tile[..b.rows * BK]);
        for r in (0..b.rows).filter(|&r| live[r]) {
            let t = &tile[r * BK..][..jn];
            if alpha[r] != T::ONE {
                o[r * ev..][..ev]
                    .iter_mut()
                    .for_each(|x| *x = *x * alpha[r]);
                rows[r].sum = rows[r].sum * alpha[r];
            }
            rows[r].sum += t.iter().fold(T::ZERO, |a, &p| a + p);
        }
        // O_blk += P V_blk (a row that saw no key has P = exp(-inf) = 0)
        tile_gemm(
            (b.rows, jn, ev),
            Mat::rows(&tile, BK),
            Mat::rows(&vh[j0 * ev..], ev),
            o,
            ev,
            true,
        );
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
