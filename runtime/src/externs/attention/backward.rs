//! The fused attention's backward, as FlashAttention computes it: the
//! probabilities are recomputed tile by tile from the saved logsumexp
//! (`p = exp(s - lse)`), never stored. Two passes, each embarrassingly
//! parallel: the query gradient per (head, block of query rows), then the
//! key and value gradients per (key/value head, block of keys), which
//! gathers every query head of its GQA group.
//!
//! With `D_i = dO_i . O_i`: `dS_ij = p_ij (dO_i . v_j - D_i)`,
//! `dq_i = scale sum_j dS_ij k_j`, `dk_j = scale sum_i dS_ij q_i`,
//! `dv_j = sum_i p_ij dO_i`. A row with no visible key (logsumexp `-inf`)
//! gave zeros and passes no gradient, as PyTorch's does.

use super::block::{key_end, score};
use super::{axpy, dot, isa_dispatch, AttnCall, AttnElem, MaskRef, BK, BQ};
use crate::externs::cpu_isa::{self, Isa};
use rayon::prelude::*;

/// The tensors backward reads, all contiguous (see [`AttnCall`]).
#[derive(Clone, Copy)]
struct Saved<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: &'a MaskRef<'a, T>,
    lse: &'a [T],
    gout: &'a [T],
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
    let saved = Saved {
        q,
        k,
        v,
        mask,
        lse,
        gout,
    };
    let par =
        nh * d.l * d.s * (d.e + d.ev) >= super::super::PAR_MIN_WORK && super::super::threads() > 1;
    // D_i = dO_i . O_i, once per row (O(L) memory)
    let delta: Vec<T> = (0..nh * d.l)
        .map(|r| dot(&gout[r * d.ev..][..d.ev], &out[r * d.ev..][..d.ev]))
        .collect();
    let mut tasks = vec![];
    for (head, dqh) in dq[..nh * d.l * d.e]
        .chunks_mut((d.l * d.e).max(1))
        .enumerate()
    {
        for (qb, blk) in dqh.chunks_mut((BQ * d.e).max(1)).enumerate() {
            tasks.push((head, qb * BQ, blk));
        }
    }
    let dq_task = |(head, i0, blk): (usize, usize, &mut [T])| {
        run_dq(isa, call, &saved, &delta, head, i0, blk);
    };
    if par {
        tasks.into_par_iter().for_each(dq_task);
    } else {
        tasks.into_iter().for_each(dq_task);
    }
    let mut tasks = vec![];
    let kv_heads = dk[..nhk * d.s * d.e]
        .chunks_mut((d.s * d.e).max(1))
        .zip(dv[..nhk * d.s * d.ev].chunks_mut((d.s * d.ev).max(1)));
    for (kvh, (dkh, dvh)) in kv_heads.enumerate() {
        let blocks = dkh
            .chunks_mut((BK * d.e).max(1))
            .zip(dvh.chunks_mut((BK * d.ev).max(1)));
        for (kb, (a, b)) in blocks.enumerate() {
            tasks.push((kvh, kb * BK, a, b));
        }
    }
    let dkv_task = |(kvh, j0, a, b): (usize, usize, &mut [T], &mut [T])| {
        run_dkv(isa, call, &saved, &delta, kvh, j0, a, b);
    };
    if par {
        tasks.into_par_iter().for_each(dkv_task);
    } else {
        tasks.into_iter().for_each(dkv_task);
    }
}

isa_dispatch! {
    fn run_dq => dq_body(
        call: &AttnCall, s: &Saved<'_, T>, delta: &[T], head: usize, i0: usize, dq: &mut [T],
    )
}

isa_dispatch! {
    #[allow(clippy::too_many_arguments)]
    fn run_dkv => dkv_body(
        call: &AttnCall, s: &Saved<'_, T>, delta: &[T], kvh: usize, j0: usize, dk: &mut [T], dv: &mut [T],
    )
}

/// Fills `tile[c]` with `p = exp(score(i, j0 + c) - lse_i)` for `c < jn`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn probs<T: AttnElem>(
    isa: Isa,
    call: &AttnCall,
    s: &Saved<'_, T>,
    (n, h, i): (usize, usize, usize),
    (j0, jn): (usize, usize),
    lse: T,
    tile: &mut [T],
) {
    let d = call.dims;
    let kv = n * d.hk + h / (d.h / d.hk);
    let qi = &s.q[((n * d.h + h) * d.l + i) * d.e..][..d.e];
    for (c, t) in tile[..jn].iter_mut().enumerate() {
        let kj = &s.k[(kv * d.s + j0 + c) * d.e..][..d.e];
        *t = score(call, [n, h], i, j0 + c, qi, kj, s.mask) - lse;
    }
    T::exp_tile(isa, &mut tile[..jn]);
}

#[inline(always)]
fn dq_body<T: AttnElem>(
    isa: Isa,
    call: &AttnCall,
    s: &Saved<'_, T>,
    delta: &[T],
    head: usize,
    i0: usize,
    dq: &mut [T],
) {
    let d = call.dims;
    let (n, h) = (head / d.h, head % d.h);
    let kv = n * d.hk + h / (d.h / d.hk);
    let scale = T::from_f64(call.scale);
    let mut tile = [T::ZERO; BK];
    dq.iter_mut().for_each(|x| *x = T::ZERO);
    for (r, dqi) in dq.chunks_mut(d.e.max(1)).enumerate() {
        let i = i0 + r;
        let row = head * d.l + i;
        let lse = s.lse[row];
        if lse == T::NEG_INFINITY {
            continue;
        }
        let gi = &s.gout[row * d.ev..][..d.ev];
        let keys = key_end(call, i);
        for j0 in (0..keys).step_by(BK) {
            let jn = BK.min(keys - j0);
            probs(isa, call, s, (n, h, i), (j0, jn), lse, &mut tile);
            for (c, &p) in tile[..jn].iter().enumerate() {
                let j = kv * d.s + j0 + c;
                let ds = p * (dot(gi, &s.v[j * d.ev..][..d.ev]) - delta[row]);
                axpy(dqi, ds * scale, &s.k[j * d.e..][..d.e]);
            }
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dkv_body<T: AttnElem>(
    isa: Isa,
    call: &AttnCall,
    s: &Saved<'_, T>,
    delta: &[T],
    kvh: usize,
    j0: usize,
    dk: &mut [T],
    dv: &mut [T],
) {
    let d = call.dims;
    let (n, g) = (kvh / d.hk, kvh % d.hk);
    let group = d.h / d.hk;
    let jn = dk.len() / d.e.max(1);
    let scale = T::from_f64(call.scale);
    let mut tile = [T::ZERO; BK];
    dk.iter_mut().for_each(|x| *x = T::ZERO);
    dv.iter_mut().for_each(|x| *x = T::ZERO);
    // causal: rows before j0 see none of these keys
    let first = if call.is_causal { j0 } else { 0 };
    for h in g * group..(g + 1) * group {
        let head = n * d.h + h;
        for i in first..d.l {
            let row = head * d.l + i;
            let lse = s.lse[row];
            if lse == T::NEG_INFINITY {
                continue;
            }
            let cols = key_end(call, i).saturating_sub(j0).min(jn);
            probs(isa, call, s, (n, h, i), (j0, cols), lse, &mut tile);
            let gi = &s.gout[row * d.ev..][..d.ev];
            let qi = &s.q[row * d.e..][..d.e];
            for (c, &p) in tile[..cols].iter().enumerate() {
                let j = kvh * d.s + j0 + c;
                let ds = p * (dot(gi, &s.v[j * d.ev..][..d.ev]) - delta[row]);
                axpy(&mut dv[c * d.ev..][..d.ev], p, gi);
                axpy(&mut dk[c * d.e..][..d.e], ds * scale, qi);
            }
        }
    }
}
