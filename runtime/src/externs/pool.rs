//! 2-D pooling on the CPU over contiguous `[N*C, H, W]` planes: `max_pool2d`
//! (with PyTorch's flat `h*W + w` indices), `avg_pool2d`, and the adaptive
//! variants. Geometry comes checked from `kiln_ir::op::pool`.
//!
//! NaN handling follows PyTorch: a NaN in a max window wins (the last NaN's
//! index is reported); ties keep the first maximum.

use super::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::pool::{adaptive_range, Pool2dGeometry};

/// Runs `f(plane_index, out_plane, idx_plane)` over every output plane,
/// in parallel when the work is worth it.
fn for_planes<T: Elem>(
    g: &Pool2dGeometry,
    work_per_plane: usize,
    out: &mut [T],
    indices: Option<&mut [i64]>,
    f: impl Fn(usize, &mut [T], Option<&mut [i64]>) + Sync,
) {
    let plane = g.out_size[0] * g.out_size[1];
    if plane == 0 || g.planes() == 0 {
        return;
    }
    let par = threads() > 1 && g.planes() > 1 && work_per_plane * g.planes() >= PAR_MIN_WORK;
    let planes = g.planes();
    let chunks = if par { crate::par::chunks(planes) } else { 1 };
    let (dst, idx) = (
        SendPtr(out.as_mut_ptr()),
        indices.map(|i| SendPtr(i.as_mut_ptr())),
    );
    let long = work_per_plane * planes >= 1 << 20;
    crate::par::pooled(long, || {
        crate::par::for_each_chunk(
            chunks,
            || (),
            |_, c| {
                for p in crate::par::range(planes, chunks, c) {
                    // SAFETY: plane p of `out` (and of `indices`) is written by this chunk alone.
                    let (o, i) = unsafe {
                        let o = std::slice::from_raw_parts_mut(dst.get().add(p * plane), plane);
                        let i = idx
                            .map(|i| std::slice::from_raw_parts_mut(i.get().add(p * plane), plane));
                        (o, i)
                    };
                    f(p, o, i);
                }
            },
        )
    });
}

fn check_lens<T>(op: &str, g: &Pool2dGeometry, input: &[T], out: &[T], indices: Option<&[i64]>) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    assert_eq!(
        input.len(),
        g.planes() * h * w,
        "{op}: input length does not match geometry"
    );
    assert_eq!(
        out.len(),
        g.planes() * oh * ow,
        "{op}: out length does not match geometry"
    );
    if let Some(i) = indices {
        assert_eq!(
            i.len(),
            out.len(),
            "{op}: indices length does not match geometry"
        );
    }
}

/// The input range `first..end` (step `d`) of output position `o`'s window
/// along a dim of `n` inputs: the window's taps clipped to the input.
#[inline]
fn window(o: usize, stride: usize, pad: usize, k: usize, d: usize, n: usize) -> (usize, usize) {
    let start = (o * stride) as isize - pad as isize;
    let end = ((start + ((k - 1) * d) as isize + 1).max(0) as usize).min(n);
    let first = first_inside(start, d);
    (first, end.max(first))
}

/// The max of `x[rows][cols]` (a plane `w` wide) and its flat index; a NaN
/// wins (the last one), ties keep the first maximum. Branch-free updates:
/// with random data `v > best` is a coin flip the branch predictor loses.
#[inline]
fn window_max<T: Elem>(x: &[T], w: usize, rows: Span, cols: Span) -> (T, usize) {
    let first = rows.0 * w + cols.0;
    taps(w, rows, cols).fold((T::NEG_INFINITY, first), |(best, at), i| {
        let v = x[i];
        let take = (v > best) | v.is_nan();
        (if take { v } else { best }, if take { i } else { at })
    })
}

/// The flat in-plane indices of a window's taps, row by row.
#[inline]
fn taps(w: usize, (r0, r1, dr): Span, (c0, c1, dc): Span) -> impl Iterator<Item = usize> {
    (r0..r1)
        .step_by(dr)
        .flat_map(move |ih| (c0..c1).step_by(dc).map(move |iw| ih * w + iw))
}

/// A window's taps along one dim: `first..end` by `step`.
type Span = (usize, usize, usize);

/// First index `>= start` reachable from a possibly negative `start` by steps of `d`.
#[inline]
fn first_inside(start: isize, d: usize) -> usize {
    if start >= 0 {
        start as usize
    } else {
        let d = d as isize;
        (start + ((-start + d - 1) / d) * d) as usize
    }
}

/// `max_pool2d`: writes window maxima to `out` and, if given, their flat
/// in-plane indices (`h*W + w`) to `indices`: a NaN wins (the last one),
/// ties keep the first maximum, and the value written is that tap's (so of
/// equal `-0.0` and `0.0`, the first). The maxima come from the separable
/// [`max_pool2d_values`], then each index from a scan of its window for
/// that value, which stops at the first match, instead of a scan keeping a
/// running maximum and its index: ResNet-18's compile() (whose trace runs
/// its one 3x3 pool with indices), conv choices on disk, 396-449 -> 377-400
/// ms (4 alternating pairs, Xeon model 207).
pub fn max_pool2d<T: Elem>(
    g: &Pool2dGeometry,
    input: &[T],
    out: &mut [T],
    indices: Option<&mut [i64]>,
) {
    check_lens("max_pool2d", g, input, out, indices.as_deref());
    max_pool2d_values(g, input, out);
    let Some(indices) = indices else {
        return;
    };
    let [h, w] = g.in_size;
    let ([oh, ow], p) = (g.out_size, g.params);
    let cols: Vec<(usize, usize)> = (0..ow)
        .map(|c| window(c, p.stride[1], p.padding[1], p.kernel[1], p.dilation[1], w))
        .collect();
    let f = |pi: usize, o: &mut [T], idx: Option<&mut [i64]>| {
        let x = &input[pi * h * w..(pi + 1) * h * w];
        let ix = idx.expect("max_pool2d: indices are given");
        for r in 0..oh {
            let (r0, r1) = window(r, p.stride[0], p.padding[0], p.kernel[0], p.dilation[0], h);
            for (c, &(c0, c1)) in cols.iter().enumerate() {
                let k = r * ow + c;
                let spans = ((r0, r1, p.dilation[0]), (c0, c1, p.dilation[1]));
                match window_argmax(x, w, spans.0, spans.1, o[k]) {
                    Some(at) => {
                        ix[k] = at as i64;
                        o[k] = x[at];
                    }
                    // no taps: the value stays -inf, the index the first tap's
                    None => ix[k] = (r0 * w + c0) as i64,
                }
            }
        }
    };
    for_planes(
        g,
        p.kernel[0] * p.kernel[1] * oh * ow,
        out,
        Some(indices),
        f,
    );
}

/// Where [`window_max`] finds `v`, the maximum of the window's taps: the
/// first tap equal to `v` (the first maximum; `-0.0` equals `0.0`), or with
/// `v` NaN the last NaN tap. `None` for a window without taps.
#[inline]
fn window_argmax<T: Elem>(x: &[T], w: usize, rows: Span, cols: Span, v: T) -> Option<usize> {
    let mut taps = taps(w, rows, cols);
    if v.is_nan() {
        taps.filter(|&i| x[i].is_nan()).last()
    } else {
        taps.find(|&i| x[i] == v)
    }
}

/// `max_pool2d` values only (`F.max_pool2d` without `return_indices`, when
/// no backward needs the indices): the window maximum of every output, a
/// NaN winning. Separable, so it vectorises: per output row, the maximum
/// over the window's input rows of each column (contiguous, one vector op
/// per element), written between `-inf` borders as wide as the padding,
/// then per window column `j` the maximum of the outputs and that row's
/// elements `c * stride + j * dilation` (strides 1 and 2 vectorise too). The
/// value is [`max_pool2d`]'s except that, between equal `-0.0` and `0.0`,
/// the one kept may differ.
pub fn max_pool2d_values<T: Elem>(g: &Pool2dGeometry, input: &[T], out: &mut [T]) {
    check_lens("max_pool2d", g, input, out, None);
    let [h, w] = g.in_size;
    let ow = g.out_size[1];
    let p = g.params;
    let (s, d, pad) = (p.stride[1], p.dilation[1], p.padding[1]);
    // every window's columns (ceil_mode's last one too) inside the row
    let row_len = (pad + w).max((p.kernel[1] - 1) * d + ow * s);
    let f = |pi: usize, o: &mut [T], _: Option<&mut [i64]>| {
        let x = &input[pi * h * w..(pi + 1) * h * w];
        let mut row = vec![T::NEG_INFINITY; row_len];
        for (r, orow) in o.chunks_exact_mut(ow).enumerate() {
            let (r0, r1) = window(r, p.stride[0], p.padding[0], p.kernel[0], p.dilation[0], h);
            let colmax = &mut row[pad..pad + w];
            colmax.fill(T::NEG_INFINITY);
            for ih in (r0..r1).step_by(p.dilation[0]) {
                for (m, &v) in colmax.iter_mut().zip(&x[ih * w..(ih + 1) * w]) {
                    *m = nan_max(*m, v);
                }
            }
            orow.fill(T::NEG_INFINITY);
            for j in 0..p.kernel[1] {
                strided_max(orow, &row[j * d..], s);
            }
        }
    };
    for_planes(
        g,
        (p.kernel[0] + p.kernel[1]) * g.in_size[1] * g.out_size[0],
        out,
        None,
        f,
    );
}

/// `out[c] = nan_max(out[c], src[c * s])`, written so strides 1 and 2
/// vectorise (a scalar loop over each window had taken 4.5% of ResNet-18's
/// compiled samples, for its one 3x3 stride-2 max pool).
#[inline(always)]
fn strided_max<T: Elem>(out: &mut [T], src: &[T], s: usize) {
    match s {
        1 => out
            .iter_mut()
            .zip(src)
            .for_each(|(o, &v)| *o = nan_max(*o, v)),
        2 => out
            .iter_mut()
            .zip(src.chunks_exact(2))
            .for_each(|(o, v)| *o = nan_max(*o, v[0])),
        _ => out
            .iter_mut()
            .zip(src.iter().step_by(s))
            .for_each(|(o, &v)| *o = nan_max(*o, v)),
    }
}

/// `v` if it beats `best` (greater, or NaN), else `best`: [`window_max`]'s
/// rule, select-only so a loop of it vectorises.
#[inline(always)]
fn nan_max<T: Elem>(best: T, v: T) -> T {
    if (v > best) | v.is_nan() {
        v
    } else {
        best
    }
}

/// `avg_pool2d` with PyTorch's divisor rules: the window is clipped to the
/// padded input for `count_include_pad`, to the input otherwise;
/// `divisor_override` (non-zero, checked by `kiln_ir::op::pool`) replaces both.
pub fn avg_pool2d<T: Elem>(
    g: &Pool2dGeometry,
    input: &[T],
    out: &mut [T],
    count_include_pad: bool,
    divisor_override: Option<i64>,
) {
    check_lens("avg_pool2d", g, input, out, None);
    let [h, w] = g.in_size;
    let ow = g.out_size[1];
    let p = g.params;
    let f = |pi: usize, o: &mut [T], _: Option<&mut [i64]>| {
        let x = &input[pi * h * w..(pi + 1) * h * w];
        for (k, ov) in o.iter_mut().enumerate() {
            let (r, c) = (k / ow, k % ow);
            let hs = (r * p.stride[0]) as isize - p.padding[0] as isize;
            let ws = (c * p.stride[1]) as isize - p.padding[1] as isize;
            let he = (hs + p.kernel[0] as isize).min((h + p.padding[0]) as isize);
            let we = (ws + p.kernel[1] as isize).min((w + p.padding[1]) as isize);
            let pool_size = (he - hs) * (we - ws);
            let (hs, ws) = (hs.max(0) as usize, ws.max(0) as usize);
            let (he, we) = ((he.max(0) as usize).min(h), (we.max(0) as usize).min(w));
            if hs >= he || ws >= we {
                *ov = T::ZERO;
                continue;
            }
            let mut sum = T::ZERO;
            for ih in hs..he {
                for v in &x[ih * w + ws..ih * w + we] {
                    sum += *v;
                }
            }
            let div = match divisor_override {
                Some(d) => d as f64,
                None if count_include_pad => pool_size as f64,
                None => ((he - hs) * (we - ws)) as f64,
            };
            *ov = sum / T::from_f64(div);
        }
    };
    for_planes(
        g,
        p.kernel[0] * p.kernel[1] * g.out_size[0] * ow,
        out,
        None,
        f,
    );
}

/// `adaptive_avg_pool2d`: cell `(i, j)` averages rows
/// `floor(i*H/OH)..ceil((i+1)*H/OH)` and the same for columns.
pub fn adaptive_avg_pool2d<T: Elem>(g: &Pool2dGeometry, input: &[T], out: &mut [T]) {
    check_lens("adaptive_avg_pool2d", g, input, out, None);
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let f = |pi: usize, o: &mut [T], _: Option<&mut [i64]>| {
        let x = &input[pi * h * w..(pi + 1) * h * w];
        for (k, ov) in o.iter_mut().enumerate() {
            let (hs, he) = adaptive_range(k / ow, h, oh);
            let (ws, we) = adaptive_range(k % ow, w, ow);
            let sum = window_sum(x, w, (hs, he), (ws, we));
            *ov = sum / T::from_f64(((he - hs) * (we - ws)) as f64);
        }
    };
    for_planes(g, h * w, out, None, f);
}

/// The sum of rows `hs..he`, columns `ws..we` of a plane `w` wide. A global
/// pool's window is the whole plane (contiguous, summed as one run): eight
/// running sums, so the adds do not wait on each other (one sum ran a 4-cycle
/// add per element, 4 µs per 56x56 plane), combined pairwise at the end.
fn window_sum<T: Elem>(x: &[T], w: usize, (hs, he): (usize, usize), (ws, we): (usize, usize)) -> T {
    let mut acc = [T::ZERO; 8];
    let mut add_run = |run: &[T]| {
        let mut chunks = run.chunks_exact(8);
        for c in &mut chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
            *a += v;
        }
    };
    if ws == 0 && we == w {
        add_run(&x[hs * w..he * w]);
    } else {
        for ih in hs..he {
            add_run(&x[ih * w + ws..ih * w + we]);
        }
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
}

/// `adaptive_max_pool2d` with flat in-plane indices, same windows as
/// [`adaptive_avg_pool2d`].
pub fn adaptive_max_pool2d<T: Elem>(
    g: &Pool2dGeometry,
    input: &[T],
    out: &mut [T],
    indices: Option<&mut [i64]>,
) {
    check_lens("adaptive_max_pool2d", g, input, out, indices.as_deref());
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let f = |pi: usize, o: &mut [T], mut idx: Option<&mut [i64]>| {
        let x = &input[pi * h * w..(pi + 1) * h * w];
        for (k, ov) in o.iter_mut().enumerate() {
            let (hs, he) = adaptive_range(k / ow, h, oh);
            let (ws, we) = adaptive_range(k % ow, w, ow);
            let (v, at) = window_max(x, w, (hs, he, 1), (ws, we, 1));
            *ov = v;
            if let Some(ix) = idx.as_deref_mut() {
                ix[k] = at as i64;
            }
        }
    };
    for_planes(g, h * w, out, indices, f);
}

#[cfg(test)]
mod tests;
