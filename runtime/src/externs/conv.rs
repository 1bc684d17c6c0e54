//! Convolution on the CPU: `conv2d` (and `conv1d` as `H = 1`) by im2col +
//! GEMM per group on L2-sized tiles of output positions, by Winograd
//! F(2x2, 3x3) (`winograd.rs`), by register tiles read straight off a
//! padded copy of the input (`direct.rs`), or for depthwise convolutions by
//! register accumulators over the same copy (`depthwise.rs`); `select.rs`
//! picks one per shape (timing them when benchmarking is on) and `externs/packed.rs`
//! keeps transformed weights per parameter version (`conv_transpose2d` is in
//! `conv_transpose.rs`).
//!
//! Geometry (stride, asymmetric padding, dilation, groups) comes checked from
//! `kiln_ir::op::conv::{conv_geometry, conv_transpose_geometry}`.

use super::gemm::{auto_parallelism, gemm_raw, Parallelism};
use super::{cpu_isa, threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::{Error, Result};

pub use super::conv_transpose::conv_transpose2d;
use super::packed::WeightKey;
use select::ConvAlgo;

pub use call::conv2d_call;

pub mod batched;
mod call;
mod channel_vec;
pub mod depthwise;
pub mod depthwise_channels;
pub mod direct;
pub mod direct_channels;
pub mod microkernel;
pub mod patch_map;
pub mod select;
pub mod wide;
pub mod winograd;

/// Bytes of one im2col / col2im tile: small enough to stay in L2 next to the
/// packed weights, big enough that the GEMM runs at full speed.
const TILE_BYTES: usize = 256 * 1024;

/// Columns per tile for a `rows`-row column buffer of `T` (a multiple of 16).
pub(super) fn tile_cols<T>(rows: usize, total: usize) -> usize {
    let t = (TILE_BYTES / (rows.max(1) * std::mem::size_of::<T>())).max(16) / 16 * 16;
    t.min(total).max(1)
}

/// Rows of a conv's column matrix (its GEMM's `k`): `C_in/g * kH * kW`.
pub(super) fn kk(g: &ConvGeometry) -> usize {
    g.c_in_per_group() * g.kernel[0] * g.kernel[1]
}

/// Output positions of one sample's plane: `OH * OW`.
pub(super) fn positions(g: &ConvGeometry) -> usize {
    g.out_size[0] * g.out_size[1]
}

/// Output positions `o` in `[0, out)` whose input position `o*s + off` lies in
/// `[0, len)`, as a half-open range.
#[inline]
pub(super) fn valid_range(out: usize, s: usize, off: isize, len: usize) -> (usize, usize) {
    let s = s as isize;
    // o*s + off >= 0  <=>  o >= ceil(-off / s)
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    // o*s + off <= len-1  <=>  o <= floor((len-1-off)/s)
    let top = len as isize - 1 - off;
    let hi = if top < 0 { 0 } else { top / s + 1 };
    let lo = (lo as usize).min(out);
    (lo, (hi as usize).clamp(lo, out))
}

/// A block of a conv's output that is final: sample `n`, output channels
/// `c0..c0 + channels`, flattened output positions `p0..p0 + cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    pub n: usize,
    pub c0: usize,
    pub channels: usize,
    pub p0: usize,
    pub cols: usize,
}

/// Called on each [`Tile`] as soon as it is written, while it is in cache
/// (a compiled graph's pointwise epilogue). It may rewrite the tile's
/// elements in `out` in place and nothing else.
pub type Epilogue<'a> = &'a (dyn Fn(Tile) + Sync);

/// `conv2d` forward: `out[N, C_out, OH, OW] = conv(input[N, C_in, H, W], weight[C_out, C_in/g, kH, kW]) + bias`.
/// A `conv1d` geometry (H = 1) runs through the same code.
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) -> Result<()> {
    conv2d_tiled(g, input, weight, bias, out, None)
}

/// [`conv2d`], calling `epilogue` on every output tile once it is final.
pub fn conv2d_tiled<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    conv2d_call(
        g,
        input,
        weight,
        bias,
        out,
        ConvCall {
            epilogue,
            weight_key: None,
        },
    )
    .map(|_| ())
}

/// What a conv call may pass besides its operands.
#[derive(Clone, Copy, Default)]
pub struct ConvCall<'a> {
    /// Called on every output tile once it is final.
    pub epilogue: Option<Epilogue<'a>>,
    /// Identifies the weight so its packed forms are reused while it is unchanged.
    pub weight_key: Option<WeightKey<'a>>,
}

/// Grows `buf` to `len` elements: every conv scratch buffer is sized here,
/// fallibly — running out of memory is an `Err` naming `op`, the bytes
/// asked for and the conv's `shapes`, never an abort.
pub(super) fn scratch<T: Elem>(
    buf: &mut Vec<T>,
    len: usize,
    op: &str,
    shapes: &dyn Fn() -> String,
) -> Result<()> {
    if buf.len() < len {
        crate::scratch::try_resize(op, buf, len).map_err(|e| match e {
            Error::Op { op, msg } => {
                Error::op(op, format!("{msg}: the scratch buffer of {}", shapes()))
            }
            e => e,
        })?;
    }
    Ok(())
}

/// `input [N, C, H, W], weight [C_out, C_in/g, kH, kW]` of a conv, for messages.
pub(super) fn conv_shapes(g: &ConvGeometry) -> String {
    format!(
        "input [{}, {}, {}, {}], weight [{}, {}, {}, {}]",
        g.n,
        g.c_in,
        g.in_size[0],
        g.in_size[1],
        g.c_out,
        g.c_in_per_group(),
        g.kernel[0],
        g.kernel[1]
    )
}

/// Output bytes of one sample's group up to which a 1x1 conv's GEMM takes
/// the whole plane as one work item, not column tiles sized for an im2col
/// buffer it does not have. EfficientNet-B0's `[8,24,56,56] x [144,24]`
/// with its bias and SiLU epilogue ran 1.80-1.90 -> 1.61 ms (Zen 4, 2
/// threads): one epilogue call per plane instead of a 2720- and a
/// 416-column tile; tiles sized to the 1 MiB L2 instead ran 2.4 ms.
const WHOLE_PLANE_BYTES: usize = 2 << 20;

/// im2col + GEMM (a 1x1 stride-1 conv skips the copy: its input is the
/// column matrix).
pub(super) fn im2col_gemm<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let kk = cpg * kh * kw;
    let p = oh * ow;
    let pointwise =
        kh == 1 && kw == 1 && g.stride == [1, 1] && g.pad_begin == [0, 0] && g.pad_end == [0, 0];
    // a 1x1 conv reads its input in place, with no column matrix to keep
    // small: a plane that fits is one item, its epilogue one call
    let whole = pointwise && opg * p * std::mem::size_of::<T>() <= WHOLE_PLANE_BYTES;
    let tile = if whole { p } else { tile_cols::<T>(kk, p) };
    let n_tiles = p.div_ceil(tile);
    let items = g.n * g.groups * n_tiles;
    let work = g.n * g.c_out * p * kk;
    let dst = SendPtr(out.as_mut_ptr());

    let shapes = || conv_shapes(g);
    let run = |item: usize, buf: &mut Vec<T>, par: Parallelism| -> Result<()> {
        let ti = item % n_tiles;
        let gi = (item / n_tiles) % g.groups;
        let ni = item / (n_tiles * g.groups);
        let (p0, p1) = (ti * tile, ((ti + 1) * tile).min(p));
        let cols = p1 - p0;
        let x = &input[(ni * g.c_in + gi * cpg) * h * w..][..cpg * h * w];
        let wg = &weight[gi * opg * kk..][..opg * kk];
        let base = (ni * g.c_out + gi * opg) * p + p0;
        // SAFETY: item (ni, gi, ti) owns rows gi*opg.. of sample ni, columns p0..p1:
        // disjoint from every other item; all offsets are inside `out`.
        unsafe {
            if let Some(b) = bias {
                for oc in 0..opg {
                    let row = std::slice::from_raw_parts_mut(dst.get().add(base + oc * p), cols);
                    row.fill(b[gi * opg + oc]);
                }
            }
            let (bp, b_rs) = if pointwise {
                (x[p0..].as_ptr(), (h * w) as isize)
            } else {
                scratch(buf, kk * cols, "conv2d", &shapes)?;
                im2col(g, x, p0, p1, &mut buf[..kk * cols]);
                (buf.as_ptr(), cols as isize)
            };
            gemm_raw(
                opg,
                kk,
                cols,
                wg.as_ptr(),
                kk as isize,
                1,
                bp,
                b_rs,
                1,
                dst.get().add(base),
                p as isize,
                1,
                bias.is_some(),
                par,
            );
        }
        if let Some(e) = epilogue {
            e(Tile {
                n: ni,
                c0: gi * opg,
                channels: opg,
                p0,
                cols,
            });
        }
        Ok(())
    };

    if threads() > 1 && work >= PAR_MIN_WORK && items >= 2 * threads() {
        crate::par::try_for_each_chunk(items, Vec::new, |buf, i| run(i, buf, Parallelism::None))
            .map(drop)
    } else {
        let par = if work >= PAR_MIN_WORK {
            auto_parallelism(opg, kk, tile)
        } else {
            Parallelism::None
        };
        let mut buf = Vec::new();
        (0..items).try_for_each(|i| run(i, &mut buf, par))
    }
}

/// Writes the im2col matrix `[C/g * kH * kW, p1 - p0]` of output positions
/// `p0..p1` (flattened `oh*OW + ow`) of one sample's group `x[C/g, H, W]`.
fn im2col<T: Elem>(g: &ConvGeometry, x: &[T], p0: usize, p1: usize, col: &mut [T]) {
    im2col_ld(g, x, p0, p1, col, p1 - p0)
}

/// The bytes a reusable conv scratch holds (what [`with_thread_scratch`] keeps).
pub(super) trait ScratchBytes: Default + 'static {
    fn bytes(&self) -> usize;
}

impl<T: Elem> ScratchBytes for Vec<T> {
    fn bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

/// Runs `f` on this thread's reusable scratch of type `S`: fresh buffers
/// per call would zero-fill and page-fault their megabytes in on every
/// conv. A nested call of the same type gets a fresh one; scratch above
/// 32 MiB is freed after the call rather than kept.
pub(super) fn with_thread_scratch<S: ScratchBytes, R>(f: impl FnOnce(&mut S) -> R) -> R {
    const KEEP_BYTES: usize = 32 << 20;
    thread_local! {
        static KEPT: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut s: S = KEPT
        .with(|k| {
            let mut k = k.borrow_mut();
            let i = k.iter().position(|b| b.is::<S>())?;
            k.swap_remove(i).downcast::<S>().ok()
        })
        .map(|b| *b)
        .unwrap_or_default();
    let r = f(&mut s);
    if s.bytes() <= KEEP_BYTES {
        KEPT.with(|k| k.borrow_mut().push(Box::new(s)));
    }
    r
}

/// Whether `T` is f32 (the element type the wide kernels are written for).
pub(super) fn is_f32<T: Elem>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

/// `xs` as f32s.
///
/// # Safety
/// `T` must be f32 ([`is_f32`]).
pub(super) unsafe fn as_f32<T: Elem>(xs: &[T]) -> &[f32] {
    &*(xs as *const [T] as *const [f32])
}

/// `xs` as f32s.
///
/// # Safety
/// `T` must be f32 ([`is_f32`]).
pub(super) unsafe fn as_f32_mut<T: Elem>(xs: &mut [T]) -> &mut [f32] {
    &mut *(xs as *mut [T] as *mut [f32])
}

/// `dst[k] = src[k * stride]` for every `k` of `dst`.
#[inline]
pub(super) fn copy_strided<T: Elem>(dst: &mut [T], src: &[T], stride: usize) {
    match stride {
        1 => dst.copy_from_slice(&src[..dst.len()]),
        #[cfg(target_arch = "x86_64")]
        2 if is_f32::<T>() && cpu_isa::detect() == cpu_isa::Isa::Avx512 => {
            // SAFETY: T is f32 (checked above); the CPU has AVX-512F.
            unsafe { evens_avx512(as_f32_mut(dst), as_f32(src)) }
        }
        // indexing a slice cut to the reach keeps the loop free of checks
        // (a zipped step_by iterator ran several cycles per element)
        _ => {
            let Some(last) = dst.len().checked_sub(1) else {
                return;
            };
            let src = &src[..last * stride + 1];
            for (k, d) in dst.iter_mut().enumerate() {
                *d = src[k * stride];
            }
        }
    }
}

/// `dst[k] = src[2 * k]`: sixteen at a time picked out of two vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn evens_avx512(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::*;
    let pick = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let mut k = 0;
    // whole vectors while both source vectors are inside `src`
    while k + 16 <= dst.len() && 2 * k + 32 <= src.len() {
        let p = src.as_ptr().add(2 * k);
        let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        _mm512_storeu_ps(dst.as_mut_ptr().add(k), _mm512_permutex2var_ps(a, pick, b));
        k += 16;
    }
    for (j, d) in dst[k..].iter_mut().enumerate() {
        *d = src[2 * (k + j)];
    }
}

/// A whole plane's [`im2col_ld`] (every output position), by `map`'s
/// table when the plane's rows are short enough to have one.
pub(super) fn im2col_plane<T: Elem>(
    g: &ConvGeometry,
    map: Option<&patch_map::PatchMap>,
    x: &[T],
    col: &mut [T],
    ld: usize,
) {
    match map {
        Some(m) => m.gather(x, g.c_in_per_group(), col, ld),
        None => im2col_ld(g, x, 0, positions(g), col, ld),
    }
}

/// [`im2col`] into rows `ld` elements apart (columns of a wider matrix).
pub(super) fn im2col_ld<T: Elem>(
    g: &ConvGeometry,
    x: &[T],
    p0: usize,
    p1: usize,
    col: &mut [T],
    ld: usize,
) {
    let [h, w] = g.in_size;
    let ow = g.out_size[1];
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let (pt, pl) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let cols = p1 - p0;
    let cpg = g.c_in_per_group();
    let ranges: Vec<(usize, usize)> = (0..kw)
        .map(|j| valid_range(ow, sw, (j * dw) as isize - pl, w))
        .collect();
    let mut rows = col.chunks_mut(ld).map(|r| &mut r[..cols]);
    if p0 == 0 && p1 == g.out_size[0] * ow {
        // whole planes (small images): output rows in order, no divisions
        for c in 0..cpg {
            let plane = &x[c * h * w..][..h * w];
            for i in 0..kh {
                for (j, &(lo, hi)) in ranges.iter().enumerate() {
                    let row = rows.next().expect("im2col: column buffer too small");
                    let iw0 = (lo * sw + j * dw) as isize - pl;
                    for (r, seg) in row.chunks_exact_mut(ow).enumerate() {
                        let ih = (r * sh + i * dh) as isize - pt;
                        if ih < 0 || ih >= h as isize || lo >= hi {
                            seg.fill(T::ZERO);
                            continue;
                        }
                        let xrow = &plane[ih as usize * w..][..w];
                        seg[..lo].fill(T::ZERO);
                        seg[hi..].fill(T::ZERO);
                        copy_strided(&mut seg[lo..hi], &xrow[iw0 as usize..], sw);
                    }
                }
            }
        }
        return;
    }
    for c in 0..cpg {
        let plane = &x[c * h * w..][..h * w];
        for i in 0..kh {
            for (j, &(lo_j, hi_j)) in ranges.iter().enumerate() {
                let row = rows.next().expect("im2col: column buffer too small");
                let mut pp = p0;
                while pp < p1 {
                    let (r, ow0) = (pp / ow, pp % ow);
                    let ow1 = ow.min(ow0 + (p1 - pp));
                    let seg = &mut row[pp - p0..pp - p0 + (ow1 - ow0)];
                    pp += ow1 - ow0;
                    let ih = (r * sh + i * dh) as isize - pt;
                    if ih < 0 || ih >= h as isize {
                        seg.fill(T::ZERO);
                        continue;
                    }
                    let xrow = &plane[ih as usize * w..][..w];
                    let (lo, hi) = (
                        lo_j.clamp(ow0, ow1),
                        hi_j.clamp(ow0, ow1).max(lo_j.clamp(ow0, ow1)),
                    );
                    seg[..lo - ow0].fill(T::ZERO);
                    seg[hi - ow0..].fill(T::ZERO);
                    if lo < hi {
                        let iw0 = (lo * sw + j * dw) - pl as usize;
                        copy_strided(&mut seg[lo - ow0..hi - ow0], &xrow[iw0..], sw);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod algo_tests;
