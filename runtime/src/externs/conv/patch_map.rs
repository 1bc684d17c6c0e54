//! im2col and col2im for small planes through a table of element offsets.
//!
//! The segment loops of `im2col_ld` and `col2im` pay a bounds computation,
//! two fills and a `memcpy` call per output row of each kernel tap: on an
//! 8x8 or 4x4 plane (the small CNN) that is a call per 4-8 elements and
//! those two loops took 31% of a W5 training step. A patch map resolves
//! every (tap, position) pair to a plane offset once per geometry (the maps
//! are kept, [`KEPT_MAPS`]), so each channel of each sample is one gather
//! (or scatter-add) over the table.

use super::super::Elem;
use kiln_ir::op::conv::{ConvGeometry, ConvTransposeGeometry};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// Marks a (tap, position) pair that falls in the padding.
const PAD: u32 = u32::MAX;

/// Rows of a plane below which the table beats the segment loops: a row
/// shorter than a cache line.
const SHORT_ROW: usize = 16;

/// The largest table built (entries of `u32`: 256 KiB).
const MAX_ENTRIES: usize = 64 * 1024;

/// Geometries whose maps are kept: building a map on every call was 1.7%
/// of a MobileNetV3 forward (a few thousand entries per conv, 52 convs).
/// Past this many the kept maps are dropped and built again as used.
pub const KEPT_MAPS: usize = 256;

/// For each kernel tap `(i, j)` and each position of a grid, the offset of
/// the plane element the pair touches, or [`PAD`].
pub struct PatchMap {
    taps: usize,
    positions: usize,
    plane: usize,
    offsets: Vec<u32>,
}

/// Per axis (rows, columns): the grid's and the plane's extents and the
/// kernel, stride, dilation and leading pad that map grid position `o` and
/// tap `k` to plane coordinate `o * stride + k * dilation - pad`.
type Axes = [[usize; 2]; 6];

impl PatchMap {
    /// The map of `g`'s im2col (grid: output positions, plane: the input),
    /// when its output rows are short enough for the table to pay.
    pub fn for_conv(g: &ConvGeometry) -> Option<Arc<PatchMap>> {
        Self::kept([
            g.out_size,
            g.in_size,
            g.kernel,
            g.stride,
            g.dilation,
            g.pad_begin,
        ])
    }

    /// The map of `g`'s col2im (grid: input positions, plane: the output).
    pub fn for_transpose(g: &ConvTransposeGeometry) -> Option<Arc<PatchMap>> {
        Self::kept([
            g.in_size, g.out_size, g.kernel, g.stride, g.dilation, g.padding,
        ])
    }

    /// The kept map of `axes`, built on first use (`None`, also kept: no table pays).
    fn kept(axes: Axes) -> Option<Arc<PatchMap>> {
        type Maps = Mutex<HashMap<Axes, Option<Arc<PatchMap>>>>;
        static MAPS: LazyLock<Maps> = LazyLock::new(Default::default);
        let maps = || MAPS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps().get(&axes) {
            return m.clone();
        }
        // built outside the lock: two threads may both build one, keeping either
        let m = Self::build(axes).map(Arc::new);
        let mut kept = maps();
        if kept.len() >= KEPT_MAPS {
            kept.clear();
        }
        kept.insert(axes, m.clone());
        m
    }

    fn build([grid, size, kernel, stride, dilation, pad]: Axes) -> Option<PatchMap> {
        let taps = kernel[0] * kernel[1];
        let (positions, plane) = (grid[0] * grid[1], size[0] * size[1]);
        let entries = taps.checked_mul(positions)?;
        if grid[1] >= SHORT_ROW || entries > MAX_ENTRIES || plane >= PAD as usize {
            return None;
        }
        let coord = |d: usize, o: usize, k: usize| {
            let at = (o * stride[d] + k * dilation[d]) as isize - pad[d] as isize;
            (0..size[d] as isize).contains(&at).then_some(at as usize)
        };
        let mut offsets = Vec::with_capacity(entries);
        for i in 0..kernel[0] {
            for j in 0..kernel[1] {
                for r in 0..grid[0] {
                    for c in 0..grid[1] {
                        let at = match (coord(0, r, i), coord(1, c, j)) {
                            (Some(y), Some(x)) => (y * size[1] + x) as u32,
                            _ => PAD,
                        };
                        offsets.push(at);
                    }
                }
            }
        }
        Some(PatchMap {
            taps,
            positions,
            plane,
            offsets,
        })
    }

    fn tap(&self, t: usize) -> &[u32] {
        &self.offsets[t * self.positions..][..self.positions]
    }

    /// im2col of `channels` planes of `x` into rows `ld` apart of `col`
    /// (row `c * taps + t` holds tap `t` of channel `c`), zero in the padding.
    pub fn gather<T: Elem>(&self, x: &[T], channels: usize, col: &mut [T], ld: usize) {
        for c in 0..channels {
            let plane = &x[c * self.plane..][..self.plane];
            for t in 0..self.taps {
                let row = &mut col[(c * self.taps + t) * ld..][..self.positions];
                for (d, &at) in row.iter_mut().zip(self.tap(t)) {
                    *d = plane.get(at as usize).copied().unwrap_or(T::ZERO);
                }
            }
        }
    }

    /// col2im: adds rows `ld` apart of `cols` (laid out as [`Self::gather`]
    /// writes them) into `channels` planes of `out`, skipping the padding.
    pub fn scatter_add<T: Elem>(&self, cols: &[T], channels: usize, out: &mut [T], ld: usize) {
        for c in 0..channels {
            let plane = &mut out[c * self.plane..][..self.plane];
            for t in 0..self.taps {
                let row = &cols[(c * self.taps + t) * ld..][..self.positions];
                for (&s, &at) in row.iter().zip(self.tap(t)) {
                    if let Some(d) = plane.get_mut(at as usize) {
                        *d += s;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::externs::conv::im2col_ld;
    use crate::externs::conv_transpose::col2im;
    use crate::externs::testutil::Lcg;
    use kiln_ir::op::conv::{
        conv_geometry, conv_transpose_geometry, ConvParams, ConvTransposeParams, Padding,
    };

    /// (input, weight, stride, padding (begin and end per axis), dilation)
    /// with short rows: every case builds a map.
    type Case = ([usize; 4], [usize; 4], [usize; 2], Vec<usize>, [usize; 2]);

    fn cases() -> Vec<Case> {
        vec![
            ([1, 1, 8, 8], [8, 1, 3, 3], [1, 1], vec![1], [1, 1]),
            ([1, 8, 8, 8], [16, 8, 3, 3], [2, 2], vec![1], [1, 1]),
            ([1, 3, 5, 7], [2, 3, 2, 3], [1, 2], vec![0, 1], [1, 1]),
            ([1, 2, 9, 6], [3, 2, 3, 2], [2, 1], vec![2, 0], [2, 1]),
            ([1, 4, 3, 3], [4, 4, 5, 5], [1, 1], vec![2], [1, 1]),
            ([1, 2, 7, 15], [2, 2, 1, 1], [1, 1], vec![0], [1, 1]),
        ]
    }

    #[test]
    fn gather_matches_the_segment_im2col() {
        for (xs, ws, stride, padding, dilation) in cases() {
            let p = ConvParams {
                stride: stride.to_vec(),
                padding: Padding::Explicit(padding.clone()),
                dilation: dilation.to_vec(),
                groups: 1,
            };
            let g = conv_geometry("conv2d", &xs, &ws, None, &p).unwrap();
            let map = PatchMap::for_conv(&g).expect("short rows build a map");
            let x: Vec<f32> = Lcg(3).vec(xs.iter().product());
            let (rows, pos) = (xs[1] * ws[2] * ws[3], g.out_size[0] * g.out_size[1]);
            let ld = pos + 5; // rows of a wider matrix
            let (mut want, mut got) = (vec![f32::NAN; rows * ld], vec![f32::NAN; rows * ld]);
            im2col_ld(&g, &x, 0, pos, &mut want, ld);
            map.gather(&x, xs[1], &mut got, ld);
            for r in 0..rows {
                let (a, b) = (&got[r * ld..][..pos], &want[r * ld..][..pos]);
                assert_eq!(a, b, "{xs:?} {ws:?} {p:?}: row {r}");
            }
        }
    }

    #[test]
    fn scatter_add_matches_the_segment_col2im() {
        for (xs, ws, stride, padding, dilation) in cases() {
            // the transpose of each case (its padding symmetric)
            let p = ConvTransposeParams {
                stride: stride.to_vec(),
                padding: vec![padding[0]],
                output_padding: vec![0],
                dilation: dilation.to_vec(),
                groups: 1,
            };
            let w = [xs[1], ws[0], ws[2], ws[3]];
            let g = conv_transpose_geometry("conv_transpose2d", &xs, &w, None, &p).unwrap();
            let map = PatchMap::for_transpose(&g).expect("short rows build a map");
            let (rows, q) = (ws[0] * ws[2] * ws[3], xs[2] * xs[3]);
            let ld = q + 3;
            let cols: Vec<f32> = Lcg(5).vec(rows * ld);
            let plane = g.out_size[0] * g.out_size[1];
            let base: Vec<f32> = Lcg(7).vec(ws[0] * plane);
            let (mut want, mut got) = (base.clone(), base);
            col2im(&g, &cols, 0, q, &mut want, ld);
            map.scatter_add(&cols, ws[0], &mut got, ld);
            assert_eq!(got, want, "{xs:?} {w:?} {p:?}");
        }
    }

    #[test]
    fn long_rows_keep_the_segment_loops() {
        let p = ConvParams::default();
        let g = conv_geometry("conv2d", &[1, 1, 4, 40], &[1, 1, 3, 3], None, &p).unwrap();
        assert!(PatchMap::for_conv(&g).is_none());
    }

    #[test]
    fn a_geometry_builds_its_map_once() {
        let p = ConvParams::default();
        let g = conv_geometry("conv2d", &[2, 3, 6, 6], &[4, 3, 3, 3], None, &p).unwrap();
        let (a, b) = (
            PatchMap::for_conv(&g).unwrap(),
            PatchMap::for_conv(&g).unwrap(),
        );
        assert!(Arc::ptr_eq(&a, &b));
        let other = conv_geometry("conv2d", &[2, 3, 7, 6], &[4, 3, 3, 3], None, &p).unwrap();
        assert_eq!(PatchMap::for_conv(&other).unwrap().positions, 5 * 4);
    }
}
