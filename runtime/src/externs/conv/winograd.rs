//! Winograd F(2x2, 3x3) for 3x3 stride-1 undilated ungrouped convolutions:
//! each 2x2 output tile costs 16 multiplies per (input, output) channel pair
//! instead of 36. Per block of tile rows the input is transformed
//! (`V = B^T d B`), 16 GEMMs `M_xi[K, T] = U_xi[K, C] @ V_xi[C, T]` run on the
//! weights transformed once (`U = G w G^T`, [`pack_weights`]), and the
//! output is transformed back (`Y = A^T M A`) with the bias, then handed to
//! the epilogue while it is in cache. The tile rows of all samples are
//! numbered as one run and cut into even blocks, so small planes (7x7 has
//! 16 tiles) share a block, and with it each read of `U`, with other
//! samples' tiles instead of running 16 GEMMs a sample on a sliver of tiles.
//!
//! The transforms are written over contiguous runs of tiles (the input row
//! split into its even and odd columns), so the compiler vectorises them; on
//! x86 they are compiled a second time for AVX2 and chosen at run time.
//! For f32 on AVX-512 the transforms run on 16 tiles a vector (`avx512.rs`).

#[cfg(target_arch = "x86_64")]
use super::{as_f32, as_f32_mut};
use super::{Epilogue, Tile};
use crate::externs::cpu_isa::{self, Isa};
use crate::externs::gemm::{auto_parallelism, gemm_raw, Parallelism};
use crate::externs::packed::{self, WeightKey};
use crate::externs::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Tiles per block: `V` and `M` of a 64-channel block (2 x 16 x 64 x 96 f32,
/// 768 KiB) stay in L2/L3 while the 16 GEMMs read them.
const BLOCK_TILES: usize = 96;

/// Whether Winograd F(2x2, 3x3) computes `g`.
pub fn applies(g: &ConvGeometry) -> bool {
    g.kernel == [3, 3]
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && g.groups == 1
        && g.out_size[0] > 0
        && g.out_size[1] > 0
}

/// [`pack_weights`] once per parameter version (`key`; every call without one).
pub fn packed_weights<T: Elem>(
    g: &ConvGeometry,
    weight: &[T],
    key: Option<WeightKey>,
) -> std::sync::Arc<Vec<T>> {
    packed::packed_or_insert(key, "winograd-f2x2-3x3", || {
        pack_weights(g.c_out, g.c_in, weight)
    })
}

/// `U[16][C_out][C_in]`: each 3x3 filter as `G w G^T` (4x4).
pub fn pack_weights<T: Elem>(c_out: usize, c_in: usize, weight: &[T]) -> Vec<T> {
    assert_eq!(weight.len(), c_out * c_in * 9, "winograd: weight length");
    let half = T::from_f64(0.5);
    let mut u = vec![T::ZERO; 16 * c_out * c_in];
    for oc in 0..c_out {
        for ic in 0..c_in {
            let w = &weight[(oc * c_in + ic) * 9..][..9];
            let mut t = [[T::ZERO; 3]; 4];
            for j in 0..3 {
                let (a, b, c) = (w[j], w[3 + j], w[6 + j]);
                t[0][j] = a;
                t[1][j] = (a + b + c) * half;
                t[2][j] = (a - b + c) * half;
                t[3][j] = c;
            }
            for (i, r) in t.iter().enumerate() {
                let (a, b, c) = (r[0], r[1], r[2]);
                let row = [a, (a + b + c) * half, (a - b + c) * half, c];
                for (j, v) in row.into_iter().enumerate() {
                    u[((i * 4 + j) * c_out + oc) * c_in + ic] = v;
                }
            }
        }
    }
    u
}

/// The per-worker buffers of one block.
#[derive(Default)]
struct Scratch<T> {
    v: Vec<T>,
    m: Vec<T>,
    /// even/odd columns of the 4 input rows: `[4][2][tw + 1]`
    eo: Vec<T>,
    /// the row-transformed input rows: `[4][4][tw]`
    rt: Vec<T>,
    /// the output transform's rows: `[3][4][tw]`
    st: Vec<T>,
}

impl<T: Elem> super::ScratchBytes for Scratch<T> {
    fn bytes(&self) -> usize {
        [&self.v, &self.m, &self.eo, &self.rt, &self.st]
            .iter()
            .map(|b| b.bytes())
            .sum()
    }
}

/// Geometry of the tiling. Tile rows are numbered across the batch: global
/// row `gr` is tile row `gr % th` of sample `gr / th`.
#[derive(Clone, Copy)]
struct Tiling {
    /// tiles per output row pair
    tw: usize,
    /// tile rows per sample
    th: usize,
}

impl Tiling {
    fn new(g: &ConvGeometry) -> Tiling {
        let [oh, ow] = g.out_size;
        Tiling {
            tw: ow.div_ceil(2),
            th: oh.div_ceil(2),
        }
    }

    /// `(sample, tile row)` of global tile row `gr`.
    fn locate(self, gr: usize) -> (usize, usize) {
        (gr / self.th, gr % self.th)
    }

    /// `(rows per block, blocks)` over the `n * th` global rows: equal
    /// blocks whose count is a multiple of `workers` (no worker waits on a
    /// short last block), the one nearest [`BLOCK_TILES`] tiles. Where no
    /// divisor of the rows comes within 2x of that, blocks of about
    /// `BLOCK_TILES` with a shorter last one.
    fn blocks(self, n: usize, workers: usize) -> (usize, usize) {
        let rows = n * self.th;
        let off = |p: usize| {
            let nt = (p * self.tw) as f64;
            (nt / BLOCK_TILES as f64).ln().abs()
        };
        let even = |w: usize| {
            (1..=rows.min(2 * BLOCK_TILES / self.tw + 1))
                .filter(move |&p| rows.is_multiple_of(p) && (rows / p).is_multiple_of(w))
                .min_by(|&a, &b| off(a).total_cmp(&off(b)))
        };
        match even(workers).or_else(|| even(1)) {
            Some(p) if off(p) <= 2f64.ln() => (p, rows / p),
            _ => {
                let p = (BLOCK_TILES / self.tw).min(rows).max(1);
                (p, rows.div_ceil(p))
            }
        }
    }
}

/// `conv2d` by Winograd F(2x2, 3x3) on the transformed weights `u`
/// ([`pack_weights`]); the caller has checked [`applies`] and the lengths.
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    u: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> kiln_ir::Result<()> {
    let [oh, ow] = g.out_size;
    let tl = Tiling::new(g);
    let work = g.n * g.c_out * g.c_in * tl.th * tl.tw * 16;
    let workers = if work >= PAR_MIN_WORK { threads() } else { 1 };
    let (rows_per_block, items) = tl.blocks(g.n, workers);
    assert_eq!(u.len(), 16 * g.c_out * g.c_in, "winograd: packed weights");
    assert!(input.len() >= g.n * g.c_in * g.in_size[0] * g.in_size[1]);
    assert!(out.len() >= g.n * g.c_out * oh * ow);
    let dst = SendPtr(out.as_mut_ptr());
    let isa = cpu_isa::detect();
    let run = |item: usize, s: &mut Scratch<T>, par: Parallelism| -> kiln_ir::Result<()> {
        let gr0 = item * rows_per_block;
        let gr1 = (gr0 + rows_per_block).min(g.n * tl.th);
        // SAFETY: the item writes output rows 2*tr..2*tr+2 of the samples of
        // its global tile rows gr0..gr1 in every channel: disjoint from every
        // other item, inside `out` (checked above).
        unsafe { block(g, tl, input, u, bias, dst.get(), (gr0, gr1), s, par, isa)? };
        if let Some(e) = epilogue {
            // one tile per sample the block touches
            let mut gr = gr0;
            while gr < gr1 {
                let (ni, tr0) = tl.locate(gr);
                let tr1 = tr0 + (gr1 - gr).min(tl.th - tr0);
                let (r0, r1) = (2 * tr0, (2 * tr1).min(oh));
                e(Tile {
                    n: ni,
                    c0: 0,
                    channels: g.c_out,
                    p0: r0 * ow,
                    cols: (r1 - r0) * ow,
                });
                gr += tr1 - tr0;
            }
        }
        Ok(())
    };
    if workers > 1 && items >= workers {
        crate::par::try_for_each_chunk(
            items,
            || (),
            |_, i| super::with_thread_scratch(|s| run(i, s, Parallelism::None)),
        )
        .map(drop)
    } else {
        let par = if work >= PAR_MIN_WORK {
            auto_parallelism(g.c_out, g.c_in, rows_per_block * tl.tw)
        } else {
            Parallelism::None
        };
        super::with_thread_scratch(|s| (0..items).try_for_each(|i| run(i, s, par)))
    }
}

/// Global tile rows `gr0..gr1` of `x[N, C, H, W]` into `out[N, K, OH, OW]`.
///
/// # Safety
/// `out` must be valid for `N * K * OH * OW` elements, and no other thread
/// may write the output rows of tile rows `gr0..gr1`.
#[allow(clippy::too_many_arguments)]
unsafe fn block<T: Elem>(
    g: &ConvGeometry,
    tl: Tiling,
    x: &[T],
    u: &[T],
    bias: Option<&[T]>,
    out: *mut T,
    (gr0, gr1): (usize, usize),
    s: &mut Scratch<T>,
    par: Parallelism,
    isa: Isa,
) -> kiln_ir::Result<()> {
    let (c, k) = (g.c_in, g.c_out);
    let nt = (gr1 - gr0) * tl.tw;
    let shapes = || super::conv_shapes(g);
    super::scratch(&mut s.v, 16 * c * nt, "conv2d", &shapes)?;
    super::scratch(&mut s.m, 16 * k * nt, "conv2d", &shapes)?;
    let wide = isa == Isa::Avx512 && super::is_f32::<T>();
    if !wide {
        // the staging rows of the portable transforms
        super::scratch(&mut s.eo, 8 * (tl.tw + 1), "conv2d", &shapes)?;
        super::scratch(&mut s.rt, 16 * tl.tw, "conv2d", &shapes)?;
        super::scratch(&mut s.st, 12 * tl.tw, "conv2d", &shapes)?;
    }
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: T is f32 (checked above) and the CPU has AVX-512F.
        avx512::input_transform(g, tl, as_f32(x), (gr0, gr1), as_f32_mut(&mut s.v));
    } else if isa >= Isa::Avx2 {
        input_transform_avx2(g, tl, x, (gr0, gr1), s);
    } else {
        input_transform(g, tl, x, (gr0, gr1), s);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, wide);
        input_transform(g, tl, x, (gr0, gr1), s);
    }
    for xi in 0..16 {
        gemm_raw(
            k,
            c,
            nt,
            u[xi * k * c..].as_ptr(),
            c as isize,
            1,
            s.v[xi * c * nt..].as_ptr(),
            nt as isize,
            1,
            s.m[xi * k * nt..].as_mut_ptr(),
            nt as isize,
            1,
            false,
            par,
        );
    }
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: as for the input transform; `out` as this function's.
        let bias = bias.map(|b| as_f32(b));
        avx512::output_transform(g, tl, as_f32(&s.m), bias, out.cast(), (gr0, gr1));
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        output_transform_avx2(g, tl, &s.m, &mut s.st, bias, out, (gr0, gr1));
        return Ok(());
    }
    output_transform(g, tl, &s.m, &mut s.st, bias, out, (gr0, gr1));
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn input_transform_avx2<T: Elem>(
    g: &ConvGeometry,
    tl: Tiling,
    x: &[T],
    rows: (usize, usize),
    s: &mut Scratch<T>,
) {
    input_transform(g, tl, x, rows, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn output_transform_avx2<T: Elem>(
    g: &ConvGeometry,
    tl: Tiling,
    m: &[T],
    st: &mut [T],
    bias: Option<&[T]>,
    out: *mut T,
    rows: (usize, usize),
) {
    output_transform(g, tl, m, st, bias, out, rows)
}

/// Writes `V[16][C][T]` for global tile rows `gr0..gr1` of `x[N, C, H, W]`:
/// `B^T d B` of every 4x4 input patch (zero outside the image).
#[inline(always)]
fn input_transform<T: Elem>(
    g: &ConvGeometry,
    tl: Tiling,
    x: &[T],
    (gr0, gr1): (usize, usize),
    s: &mut Scratch<T>,
) {
    let [h, w] = g.in_size;
    let (pt, pl) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let tw = tl.tw;
    let c_in = g.c_in;
    let nt = (gr1 - gr0) * tw;
    let n1 = tw + 1;
    let (eo, rt, v) = (&mut s.eo, &mut s.rt, &mut s.v);
    for c in 0..c_in {
        for (r, gr) in (gr0..gr1).enumerate() {
            let (ni, tr) = tl.locate(gr);
            let plane = &x[(ni * c_in + c) * h * w..][..h * w];
            for i in 0..4 {
                let ih = (2 * tr + i) as isize - pt;
                let (e, o) = eo[i * 2 * n1..][..2 * n1].split_at_mut(n1);
                if ih < 0 || ih >= h as isize {
                    e.fill(T::ZERO);
                    o.fill(T::ZERO);
                    continue;
                }
                let row = &plane[ih as usize * w..][..w];
                split_row(row, pl, e, o);
            }
            for i in 0..4 {
                let (e, o) = eo[i * 2 * n1..][..2 * n1].split_at(n1);
                let dst = &mut rt[i * 4 * tw..][..4 * tw];
                let (d0, rest) = dst.split_at_mut(tw);
                let (d1, rest) = rest.split_at_mut(tw);
                let (d2, d3) = rest.split_at_mut(tw);
                for t in 0..tw {
                    let (x0, x1, x2, x3) = (e[t], o[t], e[t + 1], o[t + 1]);
                    d0[t] = x0 - x2;
                    d1[t] = x1 + x2;
                    d2[t] = x2 - x1;
                    d3[t] = x1 - x3;
                }
            }
            let (r0, rest) = rt.split_at(4 * tw);
            let (r1, rest) = rest.split_at(4 * tw);
            let (r2, r3) = rest.split_at(4 * tw);
            for j in 0..4 {
                let (a, b, cc, d) = (
                    &r0[j * tw..][..tw],
                    &r1[j * tw..][..tw],
                    &r2[j * tw..][..tw],
                    &r3[j * tw..][..tw],
                );
                let at = |xi: usize| (xi * c_in + c) * nt + r * tw;
                for t in 0..tw {
                    v[at(j) + t] = a[t] - cc[t];
                }
                for t in 0..tw {
                    v[at(4 + j) + t] = b[t] + cc[t];
                }
                for t in 0..tw {
                    v[at(8 + j) + t] = cc[t] - b[t];
                }
                for t in 0..tw {
                    v[at(12 + j) + t] = b[t] - d[t];
                }
            }
        }
    }
}

/// The even (`e[t] = row[2t - pl]`) and odd (`o[t] = row[2t + 1 - pl]`)
/// columns of an input row, zero outside it.
#[inline(always)]
fn split_row<T: Elem>(row: &[T], pl: isize, e: &mut [T], o: &mut [T]) {
    let w = row.len() as isize;
    let n1 = e.len();
    let at = |col: isize| {
        if col >= 0 && col < w {
            row[col as usize]
        } else {
            T::ZERO
        }
    };
    // interior tiles read whole pairs without bounds juggling
    let first = ((pl + 1) / 2) as usize; // 2t - pl >= 0
    let last = if w + pl < 2 {
        0
    } else {
        (((w + pl - 2) / 2) + 1).min(n1 as isize) as usize // 2t + 1 - pl < w
    };
    for t in 0..first.min(n1) {
        e[t] = at(2 * t as isize - pl);
        o[t] = at(2 * t as isize + 1 - pl);
    }
    if first < last {
        let base = (2 * first as isize - pl) as usize;
        let pairs = &row[base..base + 2 * (last - first)];
        for (t, pr) in pairs.chunks_exact(2).enumerate() {
            e[first + t] = pr[0];
            o[first + t] = pr[1];
        }
    }
    for t in last.max(first)..n1 {
        e[t] = at(2 * t as isize - pl);
        o[t] = at(2 * t as isize + 1 - pl);
    }
}

/// `Y = A^T M A` (+ bias) for global tile rows `gr0..gr1` into
/// `out[N, K, OH, OW]`.
#[inline(always)]
fn output_transform<T: Elem>(
    g: &ConvGeometry,
    tl: Tiling,
    m: &[T],
    st: &mut [T],
    bias: Option<&[T]>,
    out: *mut T,
    (gr0, gr1): (usize, usize),
) {
    let [oh, ow] = g.out_size;
    let tw = tl.tw;
    let k_out = g.c_out;
    let nt = (gr1 - gr0) * tw;
    let (s0, rest) = st[..12 * tw].split_at_mut(4 * tw);
    let (s1, y) = rest.split_at_mut(4 * tw);
    for k in 0..k_out {
        let b = bias.map_or(T::ZERO, |b| b[k]);
        for (r, gr) in (gr0..gr1).enumerate() {
            let (ni, tr) = tl.locate(gr);
            let mm = |xi: usize| &m[(xi * k_out + k) * nt + r * tw..][..tw];
            for j in 0..4 {
                let (a0, a1, a2, a3) = (mm(j), mm(4 + j), mm(8 + j), mm(12 + j));
                let (d0, d1) = (&mut s0[j * tw..][..tw], &mut s1[j * tw..][..tw]);
                for t in 0..tw {
                    d0[t] = a0[t] + a1[t] + a2[t];
                    d1[t] = a1[t] - a2[t] - a3[t];
                }
            }
            // y rows: [row 0 col 0, row 0 col 1, row 1 col 0, row 1 col 1]
            for (si, s) in [&*s0, &*s1].into_iter().enumerate() {
                let (c0, c1, c2, c3) = (&s[..tw], &s[tw..2 * tw], &s[2 * tw..3 * tw], &s[3 * tw..]);
                let (ya, yb) = y[si * 2 * tw..][..2 * tw].split_at_mut(tw);
                for t in 0..tw {
                    ya[t] = c0[t] + c1[t] + c2[t] + b;
                    yb[t] = c1[t] - c2[t] - c3[t] + b;
                }
            }
            for dr in 0..2 {
                let oy = 2 * tr + dr;
                if oy >= oh {
                    break;
                }
                let (ya, yb) = (&y[dr * 2 * tw..][..tw], &y[dr * 2 * tw + tw..][..tw]);
                // SAFETY: row oy of channel k of sample ni is inside `out`
                // and owned by the caller (see `block`).
                let at = ((ni * k_out + k) * oh + oy) * ow;
                let orow = unsafe { std::slice::from_raw_parts_mut(out.add(at), ow) };
                let (pairs, tail) = orow.split_at_mut(ow / 2 * 2);
                for (t, pr) in pairs.chunks_exact_mut(2).enumerate() {
                    pr[0] = ya[t];
                    pr[1] = yb[t];
                }
                if let Some(last) = tail.first_mut() {
                    *last = ya[tw - 1];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tiling;

    /// Blocks cover every global row once; on ResNet-18's planes at batch 8
    /// with two workers they are equal and a multiple of the workers.
    #[test]
    fn blocks_cover_every_row_and_are_even_where_they_can_be() {
        let resnet = [(56, (4, 56)), (28, (7, 16)), (14, (14, 4)), (7, (16, 2))];
        for (side, want) in resnet {
            let tl = Tiling {
                tw: side / 2 + side % 2,
                th: side / 2 + side % 2,
            };
            assert_eq!(tl.blocks(8, 2), want, "{side}x{side}");
        }
        for n in [1, 2, 3, 7, 8] {
            for (tw, th) in [(1, 1), (4, 4), (7, 7), (13, 5), (50, 3), (112, 112)] {
                for workers in [1, 2, 3] {
                    let (p, blocks) = Tiling { tw, th }.blocks(n, workers);
                    let rows = n * th;
                    let what = format!("n {n} tiles {tw}x{th} workers {workers}: ({p}, {blocks})");
                    assert!(
                        p >= 1 && p * blocks >= rows && p * (blocks - 1) < rows,
                        "{what}"
                    );
                }
            }
        }
    }
}
