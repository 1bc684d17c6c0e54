//! Direct convolution on packed weights: an implicit GEMM that never writes
//! a column matrix.
//!
//! The input is copied once into a zero-padded, phase-split form `xs`: for
//! stride `(sh, sw)` each channel becomes up to `sh * sw` planes of
//! `Hh x Wh = ceil(Hp / sh) x ceil(Wp / sw)` (`Hp, Wp` padded), plane
//! `(a, b)` holding `xpad[u * sh + a][v * sw + b]`. In that form every tap
//! `(c, i, j)` of output position `(oh, ow)` is at one fixed offset `koff`
//! from column `t = oh * Wh + ow`, for every position: the output is
//! computed over columns `t` of width `Wh` rows (the `Wh - OW` columns past
//! each row's end are computed and dropped), so a register tile of `NR`
//! consecutive columns loads `NR` consecutive input values per tap.
//!
//! Weights are packed once per parameter version into panels of `MR` output
//! channels (`[group][panel][k][MR]`, zero rows past the last channel).
//! Work items are (samples, output rows, channel panels) blocks: a block's
//! weight panels stay in L2 while it sweeps its columns, and its output
//! tile gets the bias and the compiled epilogue while it is in cache.

use super::microkernel::{self, MR, NR};
use super::{conv_shapes, kk, scratch, Epilogue, Tile};
use crate::externs::packed::{self, WeightKey};
use crate::externs::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Columns one work item sweeps per output-row block (6 register tiles).
const TARGET_COLS: usize = 6 * NR;
/// Bytes of packed weights one work item keeps hot (half an L2).
const WEIGHT_BYTES: usize = 128 * 1024;

/// Whether the direct kernel computes `g`: anything with more than one
/// input channel per group (one per group is the depthwise kernel's).
pub fn applies(g: &ConvGeometry) -> bool {
    g.c_in_per_group() > 1
}

/// The padded, phase-split input's layout (see the module doc). Only the
/// phases some tap reads are kept: a 1x1 stride-2 conv reads one in four.
pub(super) struct Layout {
    sh: usize,
    sw: usize,
    hh: usize,
    pub wh: usize,
    /// The row phases `a` taps read, in plane order.
    row_phases: Vec<usize>,
    /// The column phases `b` taps read, in plane order.
    col_phases: Vec<usize>,
}

impl Layout {
    pub fn of(g: &ConvGeometry) -> Layout {
        let [sh, sw] = g.stride;
        let hp = g.in_size[0] + g.pad_begin[0] + g.pad_end[0];
        let wp = g.in_size[1] + g.pad_begin[1] + g.pad_end[1];
        let used = |taps: usize, d: usize, s: usize| {
            let mut p: Vec<usize> = (0..taps).map(|i| (i * d) % s).collect();
            p.sort_unstable();
            p.dedup();
            p
        };
        Layout {
            sh,
            sw,
            hh: hp.div_ceil(sh),
            wh: wp.div_ceil(sw),
            row_phases: used(g.kernel[0], g.dilation[0], sh),
            col_phases: used(g.kernel[1], g.dilation[1], sw),
        }
    }

    /// Elements of one plane.
    fn plane(&self) -> usize {
        self.hh * self.wh
    }

    /// Elements of one channel: its planes.
    pub fn channel(&self) -> usize {
        self.row_phases.len() * self.col_phases.len() * self.plane()
    }

    /// The index among a channel's planes of phase `(a, b)` (one some tap reads).
    fn plane_of(&self, a: usize, b: usize) -> usize {
        let pos = |v: &[usize], x| v.iter().position(|&p| p == x).expect("a used phase");
        pos(&self.row_phases, a) * self.col_phases.len() + pos(&self.col_phases, b)
    }
}

/// The offset of each tap `k = (c, i, j)` (im2col's row order, the packed
/// weights' too) from its output column, within one group's channels.
pub(super) fn tap_offsets(g: &ConvGeometry, l: &Layout) -> Vec<isize> {
    let [kh, kw] = g.kernel;
    let [dh, dw] = g.dilation;
    let mut koff = Vec::with_capacity(g.c_in_per_group() * kh * kw);
    for c in 0..g.c_in_per_group() {
        for i in 0..kh {
            let (a, u) = ((i * dh) % l.sh, (i * dh) / l.sh);
            for j in 0..kw {
                let (b, v) = ((j * dw) % l.sw, (j * dw) / l.sw);
                let p = c * l.channel() + l.plane_of(a, b) * l.plane();
                koff.push((p + u * l.wh + v) as isize);
            }
        }
    }
    koff
}

/// [`pack_weights`] once per parameter version (`key`; every call without one).
pub fn packed_weights<T: Elem>(
    g: &ConvGeometry,
    weight: &[T],
    key: Option<WeightKey>,
) -> std::sync::Arc<Vec<T>> {
    packed::packed_or_insert(key, "direct-mr6", || pack_weights(g, weight))
}

/// Packs `weight [C_out, C_in/g, kH, kW]` into `[group][panel][k][MR]`.
pub fn pack_weights<T: Elem>(g: &ConvGeometry, weight: &[T]) -> Vec<T> {
    let (opg, kk) = (g.c_out_per_group(), kk(g));
    let panels = opg.div_ceil(MR);
    let mut out = vec![T::ZERO; g.groups * panels * kk * MR];
    for gi in 0..g.groups {
        for oc in 0..opg {
            let (pi, r) = (oc / MR, oc % MR);
            let src = &weight[(gi * opg + oc) * kk..][..kk];
            let dst = &mut out[(gi * panels + pi) * kk * MR..][..kk * MR];
            for (k, &v) in src.iter().enumerate() {
                dst[k * MR + r] = v;
            }
        }
    }
    out
}

/// Writes the padded, phase-split form of `input` into `xs`.
fn split_input<T: Elem>(g: &ConvGeometry, l: &Layout, input: &[T], xs: &mut [T]) {
    let plane = g.in_size[0] * g.in_size[1];
    let channel = |(idx, dst): (usize, &mut [T])| {
        split_channel(g, l, &input[idx * plane..][..plane], dst, true)
    };
    let channels = g.n * g.c_in;
    let xs = &mut xs[..channels * l.channel()];
    if threads() > 1 && xs.len() >= PAR_MIN_WORK {
        crate::par::for_each_piece(xs, l.channel(), || (), |_, i, d| channel((i, d)));
    } else {
        xs.chunks_mut(l.channel()).enumerate().for_each(channel);
    }
}

/// Writes the padded, phase-split form of one input channel `x` (an
/// `H x W` plane) into `dst` (`l.channel()` elements); with `fill_padding`
/// false the padding is left as it is (a buffer zeroed once and refilled
/// with channels of the same geometry keeps it zero).
pub(super) fn split_channel<T: Elem>(
    g: &ConvGeometry,
    l: &Layout,
    x: &[T],
    dst: &mut [T],
    fill_padding: bool,
) {
    let [h, w] = g.in_size;
    let (pt, pl) = (g.pad_begin[0], g.pad_begin[1]);
    let plane = l.hh * l.wh;
    for &a in &l.row_phases {
        for &b in &l.col_phases {
            let dst = &mut dst[l.plane_of(a, b) * plane..][..plane];
            // padded column v * sw + b reads input column v * sw + b - pl
            let v_lo = pl.saturating_sub(b).div_ceil(l.sw).min(l.wh);
            let v_hi = (w + pl).saturating_sub(b).div_ceil(l.sw).clamp(v_lo, l.wh);
            for (u, row) in dst.chunks_exact_mut(l.wh).enumerate() {
                let ih = u * l.sh + a;
                if ih < pt || ih - pt >= h || v_lo == v_hi {
                    if fill_padding {
                        row.fill(T::ZERO);
                    }
                    continue;
                }
                let xrow = &x[(ih - pt) * w..][..w];
                if fill_padding {
                    row[..v_lo].fill(T::ZERO);
                    row[v_hi..].fill(T::ZERO);
                }
                let iw0 = v_lo * l.sw + b - pl;
                super::copy_strided(&mut row[v_lo..v_hi], &xrow[iw0..], l.sw);
            }
        }
    }
}

/// How the output is cut into work items.
#[derive(Clone, Copy, Debug)]
struct Blocks {
    /// Samples per item (more than one only when an item covers whole planes).
    samples: usize,
    /// Output rows per item.
    rows: usize,
    /// Weight panels per item.
    panels: usize,
}

impl Blocks {
    fn of<T>(g: &ConvGeometry, l: &Layout) -> Blocks {
        let oh = g.out_size[0];
        let rows = (TARGET_COLS / l.wh).clamp(1, oh);
        let samples = if rows == oh {
            (TARGET_COLS / (oh * l.wh)).clamp(1, g.n)
        } else {
            1
        };
        let per_panel = MR * kk(g) * std::mem::size_of::<T>();
        let all = g.c_out_per_group().div_ceil(MR);
        // at least a pair: the AVX-512 tile computes two panels per input load
        let panels = (WEIGHT_BYTES / per_panel).max(2).min(all);
        Blocks {
            samples: even(g.n, samples),
            rows: even(oh, rows),
            panels: even(all, panels),
        }
    }
}

/// The block size at most `max` that cuts `total` into equal-as-possible blocks.
fn even(total: usize, max: usize) -> usize {
    total.div_ceil(total.div_ceil(max.max(1)).max(1))
}

/// `conv2d` by the direct kernel (see the module doc); `key` identifies the
/// weight so its packed form is reused.
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
    key: Option<WeightKey>,
) -> Result<()> {
    let l = Layout::of(g);
    let koff = tap_offsets(g, &l);
    let wp = packed_weights(g, weight, key);
    let cpg = g.c_in_per_group();
    // the last group's last sample, its farthest tap and last tile must be readable
    let last_base = ((g.n - 1) * g.c_in + (g.groups - 1) * cpg) * l.channel();
    let reach =
        last_base + koff.iter().copied().max().unwrap_or(0) as usize + g.out_size[0] * l.wh + NR;
    let len = reach.max(g.n * g.c_in * l.channel());
    super::with_thread_scratch(|xs: &mut Vec<T>| {
        scratch(xs, len, "conv2d", &|| conv_shapes(g))?;
        split_input(g, &l, input, xs);
        compute(g, &l, &koff, xs, &wp, bias, out, epilogue);
        Ok(())
    })
}

/// Computes every work item of the conv from the split input `xs`.
#[allow(clippy::too_many_arguments)]
fn compute<T: Elem>(
    g: &ConvGeometry,
    l: &Layout,
    koff: &[isize],
    xs: &[T],
    wp: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) {
    let (oh, ow) = (g.out_size[0], g.out_size[1]);

    let b = Blocks::of::<T>(g, l);
    let all_panels = g.c_out_per_group().div_ceil(MR);
    let (n_s, n_r, n_p) = (
        g.n.div_ceil(b.samples),
        oh.div_ceil(b.rows),
        all_panels.div_ceil(b.panels),
    );
    let items = g.groups * n_s * n_r * n_p;
    let dst = SendPtr(out.as_mut_ptr());
    let run = |item: usize| {
        let pb = item % n_p;
        let rb = (item / n_p) % n_r;
        let sb = (item / (n_p * n_r)) % n_s;
        let gi = item / (n_p * n_r * n_s);
        let block = Block {
            g,
            l,
            koff,
            xs,
            wp,
            bias,
            gi,
            samples: sb * b.samples..((sb + 1) * b.samples).min(g.n),
            rows: rb * b.rows..((rb + 1) * b.rows).min(oh),
            panels: pb * b.panels..((pb + 1) * b.panels).min(all_panels),
        };
        // SAFETY: items own disjoint (sample, channel, row) blocks of `out`.
        unsafe { block.compute(dst) };
        if let Some(e) = epilogue {
            let opg = g.c_out_per_group();
            let c0 = block.panels.start * MR;
            let c1 = (block.panels.end * MR).min(opg);
            for n in block.samples.clone() {
                e(Tile {
                    n,
                    c0: gi * opg + c0,
                    channels: c1 - c0,
                    p0: block.rows.start * ow,
                    cols: block.rows.len() * ow,
                });
            }
        }
    };
    let work = g.n * g.c_out * oh * ow * kk(g);
    if threads() > 1 && work >= PAR_MIN_WORK && items > 1 {
        crate::par::for_each_chunk(items, || (), |_, i| run(i));
    } else {
        (0..items).for_each(run);
    }
}

/// One work item: samples x output rows x weight panels of group `gi`.
struct Block<'a, T> {
    g: &'a ConvGeometry,
    l: &'a Layout,
    koff: &'a [isize],
    xs: &'a [T],
    wp: &'a [T],
    bias: Option<&'a [T]>,
    gi: usize,
    samples: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
}

impl<T: Elem> Block<'_, T> {
    /// Computes the block's outputs (with bias) into `out`.
    ///
    /// # Safety
    /// `out` is the conv's output; no other thread writes this block.
    unsafe fn compute(&self, out: SendPtr<T>) {
        let g = self.g;
        let (opg, kk) = (g.c_out_per_group(), self.koff.len());
        let all_panels = opg.div_ceil(MR);
        let (t0, t1) = (self.rows.start * self.l.wh, self.rows.end * self.l.wh);
        let (mut tile, mut tile2) = ([T::ZERO; MR * NR], [T::ZERO; MR * NR]);
        let panel = |pi: usize| self.wp[(self.gi * all_panels + pi) * kk * MR..].as_ptr();
        // panels two at a time: one load of each input vector feeds both
        for pi in self.panels.clone().step_by(2) {
            let pair = pi + 1 < self.panels.end;
            let rows = |pi: usize| MR.min(opg - pi * MR);
            for n in self.samples.clone() {
                let base = (n * g.c_in + self.gi * g.c_in_per_group()) * self.l.channel();
                let x = self.xs[base..].as_ptr();
                let oc0 = self.gi * opg + pi * MR;
                for t in (t0..t1).step_by(NR) {
                    // SAFETY: `reach` in conv2d covers every tap of every tile.
                    if pair {
                        let (a0, a1) = (panel(pi), panel(pi + 1));
                        microkernel::tile_pair(a0, a1, self.koff, x.add(t), &mut tile, &mut tile2);
                        self.store(out, &tile2, n, oc0 + MR, rows(pi + 1), t, t1);
                    } else {
                        microkernel::tile(panel(pi), self.koff, x.add(t), &mut tile);
                    }
                    self.store(out, &tile, n, oc0, rows(pi), t, t1);
                }
            }
        }
    }

    /// Writes the tile's valid columns (`< t_end`, inside a row) plus bias.
    unsafe fn store(
        &self,
        out: SendPtr<T>,
        tile: &[T; MR * NR],
        n: usize,
        oc0: usize,
        rows: usize,
        t: usize,
        t_end: usize,
    ) {
        let g = self.g;
        let (oh_n, ow_n) = (g.out_size[0], g.out_size[1]);
        let p = oh_n * ow_n;
        let cols = NR.min(t_end - t);
        let (mut oh, mut ow) = (t / self.l.wh, t % self.l.wh);
        // runs of columns inside one output row
        let mut q = 0;
        while q < cols {
            let run = (self.l.wh - ow).min(cols - q);
            let valid = run.min(ow_n.saturating_sub(ow));
            for r in 0..rows {
                let bias = self.bias.map_or(T::ZERO, |b| b[oc0 + r]);
                let d = out.get().add((n * g.c_out + oc0 + r) * p + oh * ow_n + ow);
                for s in 0..valid {
                    *d.add(s) = tile[r * NR + q + s] + bias;
                }
            }
            q += run;
            oh += 1;
            ow = 0;
        }
    }
}
