//! The fused attention's backward, as FlashAttention-2 computes it: the
//! probabilities are recomputed tile by tile from the saved logsumexp
//! (`P = exp(S - lse)`), never stored. A task owns a run of key blocks of
//! one key/value head (so its `dK`, `dV` rows) and walks every query block
//! of the head's GQA group; per tile, with `D_i = dO_i . O_i`:
//!
//! ```text
//! S  = Q_blk K_blk^T         P  = exp(S * scale (+ mask) - lse)
//! dV += P^T dO_blk           dP = dO_blk V_blk^T
//! dS = P * (dP - D) * scale  dQ += dS K_blk     dK += dS^T Q_blk
//! ```
//!
//! all five products GEMMs (see the module docs of `attention`). `dQ` sums
//! over key blocks: when one task covers a head's keys it writes the head's
//! `dQ` directly; when a head's keys are split across tasks (fewer heads
//! than threads) each task sums into its own `dQ` buffer, added up at the
//! end (memory `tasks x L x E`, still linear in L). A row with no visible key
//! (logsumexp `-inf`) gave zeros and passes no gradient, as PyTorch's does.

use super::block::mask_row;
use super::{dot, isa_dispatch, tile_gemm, AttnCall, AttnElem, MaskRef, Mat, BK, BQ};
use crate::externs::cpu_isa::{self, Isa};

/// The tensors backward reads, all contiguous (see [`AttnCall`]).
#[derive(Clone, Copy)]
struct Saved<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: &'a MaskRef<'a, T>,
    lse: &'a [T],
    gout: &'a [T],
    /// `D_i = dO_i . O_i` per row.
    delta: &'a [T],
}

/// One task: keys `j0 .. j0 + dk.len() / E` of key/value head `kvh`.
struct Task<'a, T> {
    kvh: usize,
    j0: usize,
    dk: &'a mut [T],
    dv: &'a mut [T],
    /// The `dQ` rows of the head's query group (`group x L x E`), zeroed.
    dq: DqOut<'a, T>,
}

enum DqOut<'a, T> {
    /// The caller's rows: this task is the only one of its head.
    Direct(&'a mut [T]),
    /// A buffer of this task's own, summed into the caller's afterwards.
    Partial(Vec<T>),
}

/// The query, key and value gradients of [`super::attention_forward`] for
/// the output gradient `gout`, from its saved `out` and `lse`; `dq`, `dk`,
/// `dv` are overwritten.
///
/// # Panics
/// When a slice is shorter than the dims say.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: AttnElem>(
    call: &AttnCall,
    (q, k, v): (&[T], &[T], &[T]),
    mask: &MaskRef<'_, T>,
    (out, lse, gout): (&[T], &[T], &[T]),
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let d = call.dims;
    let (nh, nhk) = (d.n * d.h, d.n * d.hk);
    assert!(q.len() >= nh * d.l * d.e && dq.len() >= nh * d.l * d.e);
    assert!(out.len() >= nh * d.l * d.ev && gout.len() >= nh * d.l * d.ev && lse.len() >= nh * d.l);
    assert!(k.len() >= nhk * d.s * d.e && dk.len() >= nhk * d.s * d.e);
    assert!(v.len() >= nhk * d.s * d.ev && dv.len() >= nhk * d.s * d.ev);
    let isa = cpu_isa::detect();
    let par =
        nh * d.l * d.s * (d.e + d.ev) >= super::super::PAR_MIN_WORK && super::super::threads() > 1;
    // D_i = dO_i . O_i, once per row (O(L) memory)
    let delta: Vec<T> = (0..nh * d.l)
        .map(|r| dot(&gout[r * d.ev..][..d.ev], &out[r * d.ev..][..d.ev]))
        .collect();
    let saved = Saved {
        q,
        k,
        v,
        mask,
        lse,
        gout,
        delta: &delta,
    };
    let group_len = (d.h / d.hk) * d.l * d.e;
    let dq = &mut dq[..nh * d.l * d.e];
    dq.iter_mut().for_each(|x| *x = T::ZERO);
    // a head's keys split into `split` tasks when there are too few heads
    // to keep every thread busy
    let blocks = d.s.div_ceil(BK);
    let split = if par {
        (2 * super::super::threads()).div_ceil(nhk).clamp(1, blocks)
    } else {
        1
    };
    let keys_per_task = blocks.div_ceil(split) * BK;
    let mut tasks = vec![];
    let heads = dk[..nhk * d.s * d.e]
        .chunks_mut((d.s * d.e).max(1))
        .zip(dv[..nhk * d.s * d.ev].chunks_mut((d.s * d.ev).max(1)))
        .zip(dq.chunks_mut(group_len.max(1)));
    for (kvh, ((dkh, dvh), dqg)) in heads.enumerate() {
        let runs = dkh
            .chunks_mut((keys_per_task * d.e).max(1))
            .zip(dvh.chunks_mut((keys_per_task * d.ev).max(1)));
        let mut dqg = Some(dqg);
        let alone = d.s <= keys_per_task;
        for (t, (a, b)) in runs.enumerate() {
            let dq = match (alone, dqg.take()) {
                (true, Some(g)) => DqOut::Direct(g),
                _ => DqOut::Partial(vec![T::ZERO; group_len]),
            };
            tasks.push(Task {
                kvh,
                j0: t * keys_per_task,
                dk: a,
                dv: b,
                dq,
            });
        }
    }
    let run = |t: &mut Task<'_, T>| {
        let dq = match &mut t.dq {
            DqOut::Direct(g) => &mut **g,
            DqOut::Partial(p) => &mut p[..],
        };
        run_dkv(isa, call, &saved, t.kvh, t.j0, t.dk, t.dv, dq);
    };
    if par {
        crate::par::for_each_piece(&mut tasks, 1, || (), |_, _, t| run(&mut t[0]));
    } else {
        tasks.iter_mut().for_each(run);
    }
    let mut by_head: Vec<Vec<Vec<T>>> = (0..nhk).map(|_| vec![]).collect();
    for t in tasks {
        if let DqOut::Partial(p) = t.dq {
            by_head[t.kvh].push(p);
        }
    }
    if split > 1 {
        sum_partials(dq, group_len, &by_head, par);
    }
}

/// Adds each task's own `dQ` buffer into its head group's rows of `dq`.
fn sum_partials<T: AttnElem>(dq: &mut [T], group_len: usize, by_head: &[Vec<Vec<T>>], par: bool) {
    let add = |(g, parts): &mut (&mut [T], &Vec<Vec<T>>)| {
        for p in parts.iter() {
            g.iter_mut().zip(p).for_each(|(x, y)| *x += *y);
        }
    };
    let mut groups: Vec<_> = dq.chunks_mut(group_len.max(1)).zip(by_head).collect();
    if par {
        crate::par::for_each_piece(&mut groups, 1, || (), |_, _, g| add(&mut g[0]));
    } else {
        groups.iter_mut().for_each(add);
    }
}

isa_dispatch! {
    #[allow(clippy::too_many_arguments)]
    fn run_dkv => dkv_body(
        call: &AttnCall, s: &Saved<'_, T>, kvh: usize, j0: usize, dk: &mut [T], dv: &mut [T], dq: &mut [T],
    )
}

/// Scratch tiles of one task: the probabilities and `dP`, then `dS`.
struct Tiles<T> {
    p: Vec<T>,
    ds: Vec<T>,
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dkv_body<T: AttnElem>(
    isa: Isa,
    call: &AttnCall,
    s: &Saved<'_, T>,
    kvh: usize,
    j_start: usize,
    dk: &mut [T],
    dv: &mut [T],
    dq: &mut [T],
) {
    let d = call.dims;
    let (n, g) = (kvh / d.hk, kvh % d.hk);
    let group = d.h / d.hk;
    let keys = dk.len() / d.e.max(1);
    let mut tiles = Tiles {
        p: vec![T::ZERO; BQ * BK],
        ds: vec![T::ZERO; BQ * BK],
    };
    dk.iter_mut().for_each(|x| *x = T::ZERO);
    dv.iter_mut().for_each(|x| *x = T::ZERO);
    for jb in (0..keys).step_by(BK) {
        let (j0, jn) = (j_start + jb, BK.min(keys - jb));
        // causal: rows before j0 see none of these keys
        let first = if call.is_causal { j0 } else { 0 };
        for hh in 0..group {
            let h = g * group + hh;
            for i0 in (first..d.l).step_by(BQ) {
                let blk = TileAt {
                    n,
                    h,
                    kvh,
                    i0,
                    rows: BQ.min(d.l - i0),
                    j0,
                    jn,
                };
                let dq_blk = &mut dq[(hh * d.l + i0) * d.e..];
                let dkv = (&mut dk[jb * d.e..], &mut dv[jb * d.ev..]);
                tile_backward(isa, call, s, &blk, &mut tiles, dq_blk, dkv);
            }
        }
    }
}

/// Where one tile sits: query rows `i0 .. i0 + rows` of head `(n, h)`
/// against keys `j0 .. j0 + jn` of key/value head `kvh`.
struct TileAt {
    n: usize,
    h: usize,
    kvh: usize,
    i0: usize,
    rows: usize,
    j0: usize,
    jn: usize,
}

/// The five products of one tile (see the module docs).
#[inline(always)]
fn tile_backward<T: AttnElem>(
    isa: Isa,
    call: &AttnCall,
    s: &Saved<'_, T>,
    b: &TileAt,
    tiles: &mut Tiles<T>,
    dq: &mut [T],
    (dk, dv): (&mut [T], &mut [T]),
) {
    let d = call.dims;
    let (e, ev) = (d.e, d.ev);
    let row0 = (b.n * d.h + b.h) * d.l + b.i0;
    let qb = &s.q[row0 * e..][..b.rows * e];
    let gb = &s.gout[row0 * ev..][..b.rows * ev];
    let kb = &s.k[(b.kvh * d.s + b.j0) * e..][..b.jn * e];
    let vb = &s.v[(b.kvh * d.s + b.j0) * ev..][..b.jn * ev];
    let (rows, jn) = (b.rows, b.jn);
    tile_gemm(
        (rows, e, jn),
        Mat::rows(qb, e),
        Mat::cols(kb, e),
        &mut tiles.p,
        BK,
        false,
    );
    for r in 0..rows {
        let t = &mut tiles.p[r * BK..][..jn];
        let lse = s.lse[row0 + r];
        if lse == T::NEG_INFINITY {
            // no visible key: zeros forward, no gradient
            t.iter_mut().for_each(|x| *x = T::NEG_INFINITY);
            continue;
        }
        mask_row(call, s.mask, [b.n, b.h], (b.i0 + r, b.j0), t);
        t.iter_mut().for_each(|x| *x = *x - lse);
    }
    T::exp_tile(isa, &mut tiles.p[..rows * BK]);
    // dV += P^T dO
    let p = Mat::rows(&tiles.p, BK);
    let pt = Mat::cols(&tiles.p, BK);
    tile_gemm((jn, rows, ev), pt, Mat::rows(gb, ev), dv, ev, true);
    // dP = dO V^T, then dS = P (dP - D) scale in place
    tile_gemm(
        (rows, ev, jn),
        Mat::rows(gb, ev),
        Mat::cols(vb, ev),
        &mut tiles.ds,
        BK,
        false,
    );
    let scale = T::from_f64(call.scale);
    for r in 0..rows {
        let dl = s.delta[row0 + r];
        let live = s.lse[row0 + r] != T::NEG_INFINITY;
        let pr = &p.data[r * BK..][..jn];
        let ds = &mut tiles.ds[r * BK..][..jn];
        if live {
            ds.iter_mut()
                .zip(pr)
                .for_each(|(x, &p)| *x = p * (*x - dl) * scale);
        } else {
            ds.iter_mut().for_each(|x| *x = T::ZERO);
        }
    }
    // dQ += dS K, dK += dS^T Q
    let ds = &tiles.ds;
    tile_gemm(
        (rows, jn, e),
        Mat::rows(ds, BK),
        Mat::rows(kb, e),
        dq,
        e,
        true,
    );
    tile_gemm(
        (jn, rows, e),
        Mat::cols(ds, BK),
        Mat::rows(qb, e),
        dk,
        e,
        true,
    );
}
