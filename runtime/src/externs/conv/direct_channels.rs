//! A conv with a short reduction (a network's stem: 3 input channels, 3x3)
//! with output channels in the vector lanes (sixteen with AVX-512, eight
//! with AVX2; `channel_vec.rs`).
//!
//! With 27 products per output, an im2col GEMM's reduction is too short to
//! keep its register tile busy, and the direct kernel's 6-channel panels
//! leave lanes idle for 16 output channels. Here each output position is
//! one vector of sixteen output channels: `bias`, then for every input
//! channel and tap the weight vector of those sixteen channels times the
//! input value broadcast. Four positions of a row share each weight load;
//! the row is staged `[position][16]` and transposed into the sixteen
//! output planes in registers. Positions whose taps reach the padding read
//! zeros through a bounds-checked loop (a tap times zero, as im2col's zero
//! patches give). f32 with AVX-512 or AVX2 + FMA; elsewhere the im2col
//! GEMM runs.

use super::channel_vec::{self, unpack, ChannelConv, ChannelVec};
use super::depthwise_channels::Out;
use super::{conv_shapes, scratch, Epilogue, Tile};
use crate::externs::Elem;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Output positions accumulated together.
const COLS: usize = 4;
/// The longest reduction (input channels x taps) this algorithm takes: a
/// stem's 27. At 64 (ResNet-18's 1x1 stride-2 downsample) it ran 0.80 ms
/// against im2col's 0.69, and timing it cost compile() 30-60 ms.
const MAX_REDUCTION: usize = 32;

/// Whether this algorithm computes `g`: one group, a reduction of at most
/// [`MAX_REDUCTION`] products per output.
pub fn applies(g: &ConvGeometry) -> bool {
    g.groups == 1 && g.c_in * g.kernel[0] * g.kernel[1] <= MAX_REDUCTION
}

/// `conv2d` by output-channel vectors (see the module doc).
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
            channel_vec::run::<DirectChannels, T>(g, input, weight, bias, out, epilogue)
        {
            return r;
        }
    }
    super::im2col_gemm(g, input, weight, bias, out, epilogue)
}

/// What the kernel reads and writes for one output row of a channel block.
pub(super) struct Row<'a> {
    g: &'a ConvGeometry,
    /// The sample's input planes.
    x: &'a [f32],
    /// `[k][lane]` weight vectors, then the bias vector.
    w: &'a [f32],
    /// Offsets of the taps from a position's first input (`[k]`).
    off: &'a [isize],
    oy: usize,
    /// Output channels in the block (all `N` but in a last block).
    lanes: usize,
}

/// [`conv2d`]'s f32 body.
struct DirectChannels;

impl ChannelConv for DirectChannels {
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
        let (k, n) = (g.c_in * kh * kw, C::N);
        let blocks = g.c_out.div_ceil(n);
        let shapes = || conv_shapes(g);
        let packed = channel_vec::pack_weights(g, weight, bias, k, n)?;
        let mut off = Vec::with_capacity(k);
        for c in 0..g.c_in {
            for ky in 0..kh {
                for kx in 0..kw {
                    off.push((c * h * w + ky * g.dilation[0] * w + kx * g.dilation[1]) as isize);
                }
            }
        }
        let dst = Out::new(out);
        let plane = oh * ow;
        let row = |ys: &mut Vec<f32>, i: usize| -> Result<()> {
            let (ni, b, oy) = (i / (blocks * oh), i / oh % blocks, i % oh);
            scratch(ys, ow * n, "conv2d", &shapes)?;
            let c0 = b * n;
            let r = Row {
                g,
                x: &input[ni * g.c_in * h * w..][..g.c_in * h * w],
                w: &packed[b * (k + 1) * n..][..(k + 1) * n],
                off: &off,
                oy,
                lanes: (g.c_out - c0).min(n),
            };
            // SAFETY: row oy of planes (ni, c0..c0 + lanes), `plane` apart, is
            // this chunk's alone; the caller checked the ISA.
            unsafe { C::stem_row(&r, ys, dst.at((ni * g.c_out + c0) * plane + oy * ow)) };
            if let Some(e) = epilogue {
                e(Tile {
                    n: ni,
                    c0,
                    channels: r.lanes,
                    p0: oy * ow,
                    cols: ow,
                });
            }
            Ok(())
        };
        crate::par::try_for_each_chunk(g.n * blocks * oh, Vec::new, row).map(drop)
    }
}

/// The first and one-past-last output columns whose taps all fall inside
/// the input (an empty range when none do).
fn interior(g: &ConvGeometry) -> (usize, usize) {
    let (s, p, reach) = (
        g.stride[1],
        g.pad_begin[1],
        (g.kernel[1] - 1) * g.dilation[1],
    );
    let ow = g.out_size[1];
    let lo = p.div_ceil(s).min(ow);
    // ox * s - p + reach <= w - 1
    let hi = (g.in_size[1] + p)
        .checked_sub(reach + 1)
        .map_or(0, |m| m / s + 1);
    (lo, hi.min(ow).max(lo))
}

/// One output row of a channel block: each position's vector into `ys`
/// (`[ox][N]`), then `ys` into the block's output rows at `o` (`oh x ow`
/// apart).
///
/// # Safety
/// `ys` holds `ow x N`; `o` the block's rows; inside an entry point of `C`.
#[inline(always)]
pub(super) unsafe fn row<C: ChannelVec>(r: &Row, ys: &mut [f32], o: *mut f32) {
    let g = r.g;
    let n = C::N;
    let [h, w] = g.in_size;
    let k = r.off.len();
    let bias = C::load(r.w.as_ptr().add(k * n));
    let iy0 = (r.oy * g.stride[0]) as isize - g.pad_begin[0] as isize;
    let rows_inside = iy0 >= 0 && iy0 as usize + (g.kernel[0] - 1) * g.dilation[0] < h;
    let (lo, hi) = if rows_inside { interior(g) } else { (0, 0) };
    let ix0 = |ox: usize| (ox * g.stride[1]) as isize - g.pad_begin[1] as isize;
    // the positions whose taps all fall inside, COLS at a time
    let mut ox = lo;
    while ox + COLS <= hi {
        let mut a = [bias; COLS];
        let base = r.x.as_ptr().offset(iy0 * w as isize + ix0(ox));
        for (i, &off) in r.off.iter().enumerate() {
            let wv = C::load(r.w.as_ptr().add(i * n));
            let p = base.offset(off);
            for (u, a) in a.iter_mut().enumerate() {
                *a = C::fmadd(wv, C::splat(*p.add(u * g.stride[1])), *a);
            }
        }
        for (u, a) in a.iter().enumerate() {
            C::store(ys.as_mut_ptr().add((ox + u) * n), *a);
        }
        ox += COLS;
    }
    // the rest, each tap's input checked (zero outside)
    let [kh, kw] = g.kernel;
    for ox in (0..lo).chain(ox..g.out_size[1]) {
        let mut a = bias;
        let mut i = 0;
        for c in 0..g.c_in {
            for ky in 0..kh {
                let iy = iy0 + (ky * g.dilation[0]) as isize;
                for kx in 0..kw {
                    let ix = ix0(ox) + (kx * g.dilation[1]) as isize;
                    let inside = (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix);
                    let v = if inside {
                        r.x[(c * h + iy as usize) * w + ix as usize]
                    } else {
                        0.0
                    };
                    a = C::fmadd(C::load(r.w.as_ptr().add(i * n)), C::splat(v), a);
                    i += 1;
                }
            }
        }
        C::store(ys.as_mut_ptr().add(ox * n), a);
    }
    let (ow, plane) = (g.out_size[1], g.out_size[0] * g.out_size[1]);
    if r.lanes == n {
        unpack::<C>(ys.as_ptr(), o, ow, plane);
    } else {
        for l in 0..r.lanes {
            for (x, v) in ys.chunks_exact(n).take(ow).enumerate() {
                *o.add(l * plane + x) = v[l];
            }
        }
    }
}
