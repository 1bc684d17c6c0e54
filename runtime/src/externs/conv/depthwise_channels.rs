//! Depthwise convolution with channels in the vector lanes.
//!
//! `depthwise.rs` runs one (sample, channel) plane at a time: the plane's
//! outputs share a vector, so a small plane fills few lanes — a 7x7 output
//! with 5x5 taps padded to rows of 11 computes 128 columns for 49 outputs,
//! besides copying the plane into its padded form and back for 1225
//! multiply-adds. Here the channels of one sample share a vector (sixteen
//! with AVX-512, eight with AVX2, `channel_vec.rs`): their planes are
//! copied once into a zero-padded `[y][x][lane]` block, every output
//! position is one vector of channels, and [`COLS`] neighbouring positions
//! accumulate together, sharing each tap's weight vector. Every lane is
//! useful whatever the plane's size, at the price of transposing the planes
//! in and out (in registers), so it pays on small planes (MobileNetV3's
//! 14x14 and 7x7 layers); the conv algorithm timing chooses.
//!
//! Each output is `bias`, then every tap in row-major order through a fused
//! multiply-add, as `depthwise.rs` adds them: the same bits. f32 with
//! AVX-512 or AVX2 + FMA; elsewhere this algorithm runs `depthwise.rs`.

use super::channel_vec::{self, unpack, ChannelConv, ChannelVec};
use super::{conv_shapes, scratch, Epilogue, Tile};
use crate::externs::Elem;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

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
    if applies(g) {
        if let Some(r) =
            channel_vec::run::<DepthwiseChannels, T>(g, input, weight, bias, out, epilogue)
        {
            return r;
        }
    }
    super::depthwise::conv2d(g, input, weight, bias, out, epilogue)
}

/// The sizes a block of channels works with.
#[derive(Clone, Copy)]
pub(super) struct Shape {
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

/// One block: `lanes` channels of one sample.
pub(super) struct Block<'a> {
    s: Shape,
    /// The channels' input planes.
    x: &'a [f32],
    lanes: usize,
    in_size: [usize; 2],
    pad: [usize; 2],
    /// `[tap][lane]` weights, then the bias `[lane]`.
    w: &'a [f32],
}

/// Per-thread scratch: the padded input block and the output block.
type Scratch = (Vec<f32>, Vec<f32>);

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
}

/// [`conv2d`]'s f32 body.
struct DepthwiseChannels;

impl ChannelConv for DepthwiseChannels {
    fn conv2d_f32<C: ChannelVec>(
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
        let n = C::N;
        let c = g.c_out;
        let blocks = c.div_ceil(n);
        let plane = oh * ow;
        let shapes = || conv_shapes(g);
        let taps = kh * kw;
        let packed = channel_vec::pack_weights(g, weight, bias, taps, n)?;
        let dst = Out::new(out);
        let block = |(xs, ys): &mut Scratch, i: usize| -> Result<()> {
            let (ni, c0) = (i / blocks, i % blocks * n);
            let lanes = (c - c0).min(n);
            // zeroed when allocated: the padding stays zero, only the data moves
            // (lanes past the last channel keep stale values, and are dropped)
            scratch(xs, s.hp * s.wp * n, "conv2d", &shapes)?;
            scratch(ys, plane * n, "conv2d", &shapes)?;
            let b = Block {
                s,
                x: &input[(ni * c + c0) * h * w..][..lanes * h * w],
                lanes,
                in_size: [h, w],
                pad: g.pad_begin,
                w: &packed[c0 * (taps + 1)..][..(taps + 1) * n],
            };
            // SAFETY: the (ni, c0..c0 + lanes) planes are this chunk's alone;
            // the caller checked the ISA.
            unsafe { C::depthwise_block(&b, xs, ys, dst.at((ni * c + c0) * plane)) };
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
        let init = || (Vec::new(), Vec::new());
        crate::par::try_for_each_chunk(g.n * blocks, init, block).map(drop)
    }
}

/// One block: its planes into the padded block `xs` (`[y][x][N]`), the
/// taps accumulated into `ys` (`[p][N]`), `ys` into the output planes at
/// `o` (`oh x ow` apart).
///
/// # Safety
/// `xs` and `ys` hold the block's `hp x wp x N` and `oh x ow x N`; `o` the
/// block's output planes; inside an entry point of `C`.
#[inline(always)]
pub(super) unsafe fn block<C: ChannelVec>(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32) {
    let (s, n) = (&b.s, C::N);
    let plane = s.oh * s.ow;
    if b.lanes == n {
        pack::<C>(b, xs);
    } else {
        pack_lanes(b, n, xs);
    }
    accumulate::<C>(s, xs.as_ptr(), b.w.as_ptr(), ys.as_mut_ptr());
    if b.lanes == n {
        unpack::<C>(ys.as_ptr(), o, plane, plane);
    } else {
        for l in 0..b.lanes {
            for p in 0..plane {
                *o.add(l * plane + p) = ys[p * n + l];
            }
        }
    }
}

/// The block's planes into `xs` one value at a time (a last, partial block).
fn pack_lanes(b: &Block, n: usize, xs: &mut [f32]) {
    let ([h, w], [pt, pl], s) = (b.in_size, b.pad, &b.s);
    for (l, plane) in b.x.chunks_exact(h * w).take(b.lanes).enumerate() {
        for (y, row) in plane
            .chunks_exact(w)
            .enumerate()
            .take(s.hp.saturating_sub(pt))
        {
            let to = &mut xs[(y + pt) * s.wp * n..][..s.wp * n];
            for (xi, &v) in row.iter().enumerate().take(s.wp.saturating_sub(pl)) {
                to[(xi + pl) * n + l] = v;
            }
        }
    }
}

/// The block's `N` planes into `xs`, `N` positions of the flattened planes
/// at a time, transposed in registers into channel vectors.
#[inline(always)]
unsafe fn pack<C: ChannelVec>(b: &Block, xs: &mut [f32]) {
    let ([h, w], [pt, pl], s, n) = (b.in_size, b.pad, &b.s, C::N);
    let (hw, x) = (h * w, b.x.as_ptr());
    let mut r = [C::splat(0.0); 16];
    let (mut p, mut y, mut xi) = (0, 0, 0);
    while p + n <= hw {
        for (l, r) in r.iter_mut().enumerate().take(n) {
            *r = C::load(x.add(l * hw + p));
        }
        C::transpose(&mut r);
        for r in r.iter().take(n) {
            let (py, px) = (y + pt, xi + pl);
            if py < s.hp && px < s.wp {
                C::store(xs.as_mut_ptr().add((py * s.wp + px) * n), *r);
            }
            xi += 1;
            if xi == w {
                (xi, y) = (0, y + 1);
            }
        }
        p += n;
    }
    for q in p..hw {
        let (py, px) = (q / w + pt, q % w + pl);
        if py < s.hp && px < s.wp {
            for l in 0..n {
                xs[(py * s.wp + px) * n + l] = *x.add(l * hw + q);
            }
        }
    }
}

/// `ys[p][lane] = bias[lane] + sum_tap w[tap][lane] * xs[at(p, tap)][lane]`
/// for every output position `p`, [`COLS`] positions of a row at a time.
///
/// # Safety
/// `xs` covers `hp x wp x N`, `w` the taps and the bias, `ys` `oh x ow x
/// N`; inside an entry point of `C`.
#[inline(always)]
unsafe fn accumulate<C: ChannelVec>(s: &Shape, xs: *const f32, w: *const f32, ys: *mut f32) {
    let n = C::N;
    let [sh, sw] = s.stride;
    let [dh, dw] = s.dilation;
    let bias = C::load(w.add(s.kh * s.kw * n));
    for oy in 0..s.oh {
        // rows of 3 or 5 taps at stride 1 or 2 in register blocks, the rest
        // (and other shapes) COLS positions at a time
        let mut ox = match (s.kw, sw, dw) {
            (3, 1, 1) => row_blocks::<C, 3, 1>(s, oy, xs, w, ys),
            (5, 1, 1) => row_blocks::<C, 5, 1>(s, oy, xs, w, ys),
            (3, 2, 1) => row_blocks::<C, 3, 2>(s, oy, xs, w, ys),
            (5, 2, 1) => row_blocks::<C, 5, 2>(s, oy, xs, w, ys),
            _ => 0,
        };
        while ox < s.ow {
            let m = (s.ow - ox).min(COLS);
            let mut a = [bias; COLS];
            for ky in 0..s.kh {
                let row = xs.add((oy * sh + ky * dh) * s.wp * n);
                for kx in 0..s.kw {
                    let wv = C::load(w.add((ky * s.kw + kx) * n));
                    let p = row.add((ox * sw + kx * dw) * n);
                    if m == COLS {
                        for (u, a) in a.iter_mut().enumerate() {
                            *a = C::fmadd(wv, C::load(p.add(u * sw * n)), *a);
                        }
                    } else {
                        for (u, a) in a.iter_mut().enumerate().take(m) {
                            *a = C::fmadd(wv, C::load(p.add(u * sw * n)), *a);
                        }
                    }
                }
            }
            for (u, a) in a.iter().enumerate().take(m) {
                C::store(ys.add((oy * s.ow + ox + u) * n), *a);
            }
            ox += m;
        }
    }
}

/// Row `oy` of [`accumulate`] in blocks of 8, then 4, output positions for
/// `KW` taps per kernel row at column stride `SW` (no dilation); returns
/// where the blocks stopped.
#[inline(always)]
unsafe fn row_blocks<C: ChannelVec, const KW: usize, const SW: usize>(
    s: &Shape,
    oy: usize,
    xs: *const f32,
    w: *const f32,
    ys: *mut f32,
) -> usize {
    let mut ox = 0;
    while ox + 8 <= s.ow {
        row_block::<C, KW, SW, 8>(s, oy, ox, xs, w, ys);
        ox += 8;
    }
    while ox + 4 <= s.ow {
        row_block::<C, KW, SW, 4>(s, oy, ox, xs, w, ys);
        ox += 4;
    }
    ox
}

/// Output positions `ox..ox + R` of row `oy`: per kernel row, its `KW`
/// weights stay in registers and each input column the block reads is
/// loaded once and multiplied into every output it reaches (the COLS loop
/// loads an input per multiply-add, and loads bounded it). The columns go
/// in groups of `SW`: column `SW * j + p` is tap `SW * m + p` of output
/// `j - m`, so each output still adds bias, then its taps in row-major
/// order: the same bits. (Walking single columns instead, the stride-2
/// blocks measured slower than COLS: the loop was not unrolled.)
#[inline(always)]
unsafe fn row_block<C: ChannelVec, const KW: usize, const SW: usize, const R: usize>(
    s: &Shape,
    oy: usize,
    ox: usize,
    xs: *const f32,
    w: *const f32,
    ys: *mut f32,
) {
    let n = C::N;
    let bias = C::load(w.add(s.kh * KW * n));
    let mut a = [bias; R];
    // one past the last column the block reads
    let reach = SW * (R - 1) + KW;
    for ky in 0..s.kh {
        let row = xs.add(((oy * s.stride[0] + ky * s.dilation[0]) * s.wp + SW * ox) * n);
        let mut wv = [bias; KW];
        for (kx, wv) in wv.iter_mut().enumerate() {
            *wv = C::load(w.add((ky * KW + kx) * n));
        }
        for j in 0..R + (KW - 1) / SW {
            let mut x = [bias; SW];
            for (p, x) in x.iter_mut().enumerate() {
                if SW * j + p < reach {
                    *x = C::load(row.add((SW * j + p) * n));
                }
            }
            for m in 0..KW.div_ceil(SW) {
                if j >= m && j - m < R {
                    for (p, x) in x.iter().enumerate() {
                        if SW * m + p < KW {
                            a[j - m] = C::fmadd(wv[SW * m + p], *x, a[j - m]);
                        }
                    }
                }
            }
        }
    }
    for (u, a) in a.iter().enumerate() {
        C::store(ys.add((oy * s.ow + ox + u) * n), *a);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::channel_vec::{Avx2, Avx512};
    use super::*;
    use crate::externs::cpu_isa::{self, Isa};
    use crate::externs::testutil::Lcg;
    use kiln_ir::op::conv::{conv_geometry, ConvParams, Padding};

    /// Each ISA's body gives the plane kernel's bits, whichever ISA the
    /// process detected (`KILN_CPU_ISA` picks one for the algorithm tests).
    #[test]
    fn every_isa_gives_the_plane_kernels_bits() {
        let p = |stride, pad: Vec<usize>, dilation, groups| ConvParams {
            stride: vec![stride],
            padding: Padding::Explicit(pad),
            dilation: vec![dilation],
            groups,
        };
        // rows of 7, 14 and 28 outputs at strides 1 and 2: blocks of 8
        // and 4, then the COLS rest
        let cases = [
            ([2, 20, 7, 7], [20, 1, 5, 5], p(1, vec![2], 1, 20)),
            ([1, 33, 14, 13], [33, 1, 5, 5], p(2, vec![2, 1], 1, 33)),
            ([3, 17, 9, 10], [17, 1, 3, 3], p(1, vec![2], 2, 17)),
            ([1, 18, 14, 14], [18, 1, 3, 3], p(1, vec![1], 1, 18)),
            ([1, 16, 28, 28], [16, 1, 3, 3], p(2, vec![1], 1, 16)),
            ([2, 16, 13, 28], [16, 1, 5, 5], p(1, vec![2], 1, 16)),
            ([1, 19, 27, 29], [19, 1, 5, 5], p(2, vec![2], 1, 19)),
        ];
        for (x, w, params) in cases {
            let g = conv_geometry("conv2d", &x, &w, Some(&[w[0]]), &params).unwrap();
            let mut r = Lcg(7);
            let input: Vec<f32> = r.vec(x.iter().product());
            let weight: Vec<f32> = r.vec(w.iter().product());
            let bias: Vec<f32> = r.vec(w[0]);
            let len = g.n * g.c_out * g.out_size[0] * g.out_size[1];
            let mut want = vec![f32::NAN; len];
            super::super::depthwise::conv2d(&g, &input, &weight, Some(&bias), &mut want, None)
                .unwrap();
            let mut bodies: Vec<(
                &str,
                fn(
                    &ConvGeometry,
                    &[f32],
                    &[f32],
                    Option<&[f32]>,
                    &mut [f32],
                    Option<Epilogue>,
                ) -> Result<()>,
            )> = vec![];
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                bodies.push(("avx2", DepthwiseChannels::conv2d_f32::<Avx2>));
            }
            if cpu_isa::detect() == Isa::Avx512 {
                bodies.push(("avx512", DepthwiseChannels::conv2d_f32::<Avx512>));
            }
            for (name, body) in bodies {
                let mut got = vec![f32::NAN; len];
                body(&g, &input, &weight, Some(&bias), &mut got, None).unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} {g:?}: differs from depthwise-direct");
            }
        }
    }
}
