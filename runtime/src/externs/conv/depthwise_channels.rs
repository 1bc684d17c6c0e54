//! Depthwise convolution with channels in the vector lanes.
//!
//! `depthwise.rs` runs one (sample, channel) plane at a time: the plane's
//! outputs share a vector, so a small plane fills few lanes — a 7x7 output
//! with 5x5 taps padded to rows of 11 computes 128 columns for 49 outputs,
//! besides copying the plane into its padded form and back for 1225
//! multiply-adds. Here sixteen channels of one sample share a vector: their
//! planes are copied once into a zero-padded `[y][x][16]` block, every
//! output position is one vector of sixteen channels, and [`COLS`]
//! neighbouring positions accumulate together, sharing each tap's weight
//! vector. Every lane is useful whatever the plane's size, at the price of
//! transposing the planes in and out, so it pays on small planes
//! (MobileNetV3's 14x14 and 7x7 layers); the conv algorithm timing chooses.
//!
//! Each output is `bias`, then every tap in row-major order through a fused
//! multiply-add, as `depthwise.rs` adds them: the same bits. f32 on
//! AVX-512 only; elsewhere this algorithm runs `depthwise.rs`.

use super::{as_f32, as_f32_mut, conv_shapes, is_f32, scratch, Epilogue, Tile};
use crate::externs::cpu_isa::{self, Isa};
use crate::externs::Elem;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Channels per vector (AVX-512 f32).
const LANES: usize = 16;
/// Output positions along a row accumulated together.
const COLS: usize = 4;

/// Whether this algorithm computes `g`: one input channel per group and
/// one output channel per group (no channel multiplier).
pub fn applies(g: &ConvGeometry) -> bool {
    g.c_in_per_group() == 1 && g.c_out_per_group() == 1
}

/// `conv2d` for a depthwise `g` (see the module doc).
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    if is_f32::<T>() && cpu_isa::detect() == Isa::Avx512 && applies(g) {
        // SAFETY: T is f32 (checked above).
        let (x, w, b) = unsafe { (as_f32(input), as_f32(weight), bias.map(|b| as_f32(b))) };
        return conv2d_f32(g, x, w, b, unsafe { as_f32_mut(out) }, epilogue);
    }
    super::depthwise::conv2d(g, input, weight, bias, out, epilogue)
}

/// The sizes one block of sixteen channels works with.
#[derive(Clone, Copy)]
struct Shape {
    /// Padded input rows and columns the taps reach.
    hp: usize,
    wp: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
}

/// Per-thread scratch: the padded input block, the output block, the
/// block's weights `[tap][16]` and bias `[16]`.
type Scratch = (Vec<f32>, Vec<f32>, Vec<f32>);

/// An output buffer shared by parallel chunks that each write their own
/// elements.
pub(super) struct Out(*mut f32);
// SAFETY: every user writes disjoint elements from each chunk.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    pub(super) fn new(out: &mut [f32]) -> Out {
        Out(out.as_mut_ptr())
    }

    /// The address of element `at`.
    ///
    /// # Safety
    /// In bounds, and writes through it overlap no other live reference.
    pub(super) unsafe fn at(&self, at: usize) -> *mut f32 {
        self.0.add(at)
    }

    /// `len` outputs from `at`.
    ///
    /// # Safety
    /// As [`Out::at`].
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn piece(&self, at: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(at), len)
    }
}

fn conv2d_f32(
    g: &ConvGeometry,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let (stride, dilation) = (g.stride, g.dilation);
    let s = Shape {
        hp: (oh - 1) * stride[0] + (kh - 1) * dilation[0] + 1,
        wp: (ow - 1) * stride[1] + (kw - 1) * dilation[1] + 1,
        oh,
        ow,
        kh,
        kw,
        stride,
        dilation,
    };
    let [pt, pl] = g.pad_begin;
    let c = g.c_out;
    let blocks = c.div_ceil(LANES);
    let plane = oh * ow;
    let shapes = || conv_shapes(g);
    let dst = Out::new(out);
    let block = |(xs, ys, wv): &mut Scratch, i: usize| -> Result<()> {
        let (ni, c0) = (i / blocks, i % blocks * LANES);
        let lanes = (c - c0).min(LANES);
        // zeroed when allocated: the padding stays zero, only the data moves
        // (lanes past the last channel keep stale values, and are dropped)
        scratch(xs, s.hp * s.wp * LANES, "conv2d", &shapes)?;
        scratch(ys, plane * LANES, "conv2d", &shapes)?;
        scratch(wv, (kh * kw + 1) * LANES, "conv2d", &shapes)?;
        let x = &input[(ni * c + c0) * h * w..][..lanes * h * w];
        if lanes == LANES {
            // SAFETY: x holds 16 planes; xs the padded block; AVX-512 (above).
            unsafe { pack_avx512(x, [h, w], [pt, pl], &s, xs) };
        } else {
            pack_portable(x, lanes, [h, w], [pt, pl], &s, xs);
        }
        for l in 0..lanes {
            for k in 0..kh * kw {
                wv[k * LANES + l] = weight[(c0 + l) * kh * kw + k];
            }
            wv[kh * kw * LANES + l] = bias.map_or(0.0, |b| b[c0 + l]);
        }
        // SAFETY: xs holds hp x wp x 16 values, the farthest tap's row and
        // column inside; ys holds every output; the CPU has AVX-512.
        unsafe { accumulate_avx512(&s, xs.as_ptr(), wv.as_ptr(), ys.as_mut_ptr()) };
        // SAFETY: the (ni, c0..c0 + lanes) planes are this chunk's alone.
        let o = unsafe { dst.piece((ni * c + c0) * plane, lanes * plane) };
        if lanes == LANES {
            // SAFETY: ys holds plane x 16 values, o 16 planes; AVX-512.
            unsafe { unpack_avx512(ys.as_ptr(), o.as_mut_ptr(), plane, plane) };
        } else {
            for (l, o) in o.chunks_exact_mut(plane).enumerate() {
                for (p, o) in o.iter_mut().enumerate() {
                    *o = ys[p * LANES + l];
                }
            }
        }
        if let Some(e) = epilogue {
            e(Tile {
                n: ni,
                c0,
                channels: lanes,
                p0: 0,
                cols: plane,
            });
        }
        Ok(())
    };
    let init = || (Vec::new(), Vec::new(), Vec::new());
    crate::par::try_for_each_chunk(g.n * blocks, init, block).map(drop)
}

/// Copies `lanes` planes of `x` (`h x w` each) into the padded block `xs`
/// (`[y + pt][x + pl][lane]`), one value at a time.
fn pack_portable(
    x: &[f32],
    lanes: usize,
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    s: &Shape,
    xs: &mut [f32],
) {
    for (l, plane) in x.chunks_exact(h * w).take(lanes).enumerate() {
        for (y, row) in plane
            .chunks_exact(w)
            .enumerate()
            .take(s.hp.saturating_sub(pt))
        {
            let to = &mut xs[(y + pt) * s.wp * LANES..][..s.wp * LANES];
            for (xi, &v) in row.iter().enumerate().take(s.wp.saturating_sub(pl)) {
                to[(xi + pl) * LANES + l] = v;
            }
        }
    }
}

/// [`pack_portable`] of sixteen planes: sixteen positions of the flattened
/// planes at a time, transposed in registers into sixteen channel vectors.
///
/// # Safety
/// `x` holds 16 planes of `h x w`; `xs` the padded block; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_avx512(
    x: &[f32],
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    s: &Shape,
    xs: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hw = h * w;
    let mut r = [_mm512_setzero_ps(); LANES];
    let (mut p, mut y, mut xi) = (0, 0, 0);
    while p + LANES <= hw {
        for (l, r) in r.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(x.as_ptr().add(l * hw + p));
        }
        transpose16(&mut r);
        for r in &r {
            let (py, px) = (y + pt, xi + pl);
            if py < s.hp && px < s.wp {
                _mm512_storeu_ps(xs.as_mut_ptr().add((py * s.wp + px) * LANES), *r);
            }
            xi += 1;
            if xi == w {
                (xi, y) = (0, y + 1);
            }
        }
        p += LANES;
    }
    for q in p..hw {
        let (py, px) = (q / w + pt, q % w + pl);
        if py < s.hp && px < s.wp {
            for l in 0..LANES {
                xs[(py * s.wp + px) * LANES + l] = x[l * hw + q];
            }
        }
    }
}

/// The output block `ys` (`[p][16]`, `count` positions) into sixteen
/// output rows `o + l * stride`, sixteen positions at a time through a
/// register transpose.
///
/// # Safety
/// `ys` holds `count x 16` values; each of the sixteen rows `count`
/// writable values; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn unpack_avx512(ys: *const f32, o: *mut f32, count: usize, stride: usize) {
    use std::arch::x86_64::*;
    let mut r = [_mm512_setzero_ps(); LANES];
    let mut p = 0;
    while p + LANES <= count {
        for (j, r) in r.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(ys.add((p + j) * LANES));
        }
        transpose16(&mut r);
        for (l, r) in r.iter().enumerate() {
            _mm512_storeu_ps(o.add(l * stride + p), *r);
        }
        p += LANES;
    }
    for q in p..count {
        for l in 0..LANES {
            *o.add(l * stride + q) = *ys.add(q * LANES + l);
        }
    }
}

/// Transposes the 16 x 16 matrix whose rows are `r`, in four rounds of
/// interleaves (32-bit, 64-bit, then 128-bit lanes twice).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; LANES]) {
    use std::arch::x86_64::*;
    let mut t = *r;
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (pd, ps) = (_mm512_castps_pd, _mm512_castpd_ps);
    let mut u = t;
    for i in 0..4 {
        let (a, b, c, d) = (
            pd(t[4 * i]),
            pd(t[4 * i + 1]),
            pd(t[4 * i + 2]),
            pd(t[4 * i + 3]),
        );
        u[4 * i] = ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = ps(_mm512_unpackhi_pd(b, d));
    }
    let mut v = u;
    for i in 0..2 {
        for j in 0..4 {
            v[8 * i + j] = _mm512_shuffle_f32x4::<0x88>(u[8 * i + j], u[8 * i + j + 4]);
            v[8 * i + j + 4] = _mm512_shuffle_f32x4::<0xdd>(u[8 * i + j], u[8 * i + j + 4]);
        }
    }
    for j in 0..8 {
        r[j] = _mm512_shuffle_f32x4::<0x88>(v[j], v[j + 8]);
        r[j + 8] = _mm512_shuffle_f32x4::<0xdd>(v[j], v[j + 8]);
    }
}

/// `ys[p][lane] = bias[lane] + sum_tap w[tap][lane] * xs[at(p, tap)][lane]`
/// for every output position `p`, [`COLS`] positions of a row at a time.
///
/// # Safety
/// As the caller says: `xs` covers `hp x wp x 16`, `w` the taps and the
/// bias, `ys` `oh x ow x 16`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_avx512(s: &Shape, xs: *const f32, w: *const f32, ys: *mut f32) {
    use std::arch::x86_64::*;
    let [sh, sw] = s.stride;
    let [dh, dw] = s.dilation;
    let bias = _mm512_loadu_ps(w.add(s.kh * s.kw * LANES));
    for oy in 0..s.oh {
        let mut ox = 0;
        while ox < s.ow {
            let n = (s.ow - ox).min(COLS);
            let mut a = [bias; COLS];
            for ky in 0..s.kh {
                let row = xs.add((oy * sh + ky * dh) * s.wp * LANES);
                for kx in 0..s.kw {
                    let wv = _mm512_loadu_ps(w.add((ky * s.kw + kx) * LANES));
                    let p = row.add((ox * sw + kx * dw) * LANES);
                    if n == COLS {
                        for (u, a) in a.iter_mut().enumerate() {
                            let x = _mm512_loadu_ps(p.add(u * sw * LANES));
                            *a = _mm512_fmadd_ps(wv, x, *a);
                        }
                    } else {
                        for (u, a) in a.iter_mut().enumerate().take(n) {
                            let x = _mm512_loadu_ps(p.add(u * sw * LANES));
                            *a = _mm512_fmadd_ps(wv, x, *a);
                        }
                    }
                }
            }
            for (u, a) in a.iter().enumerate().take(n) {
                _mm512_storeu_ps(ys.add((oy * s.ow + ox + u) * LANES), *a);
            }
            ox += n;
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn accumulate_avx512(_: &Shape, _: *const f32, _: *const f32, _: *mut f32) {
    unreachable!("AVX-512 is only detected on x86-64")
}
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_avx512(_: &[f32], _: [usize; 2], _: [usize; 2], _: &Shape, _: &mut [f32]) {
    unreachable!("AVX-512 is only detected on x86-64")
}
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn unpack_avx512(_: *const f32, _: *mut f32, _: usize, _: usize) {
    unreachable!("AVX-512 is only detected on x86-64")
}
