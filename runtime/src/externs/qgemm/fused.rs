//! The whole dynamically quantized Linear as one extern call, in output
//! tiles of [`TILE_ROWS`] rows: the input's range is found first (one read
//! of `x`: the scale depends on all of it), then per tile the rows are
//! quantized to uint8, multiplied with the packed int8 weight, dequantized
//! with the bias (and ReLU) on the accumulators in registers, and handed to
//! the caller's tile epilogue (a compiled pointwise expression) while the
//! tile is still in cache.
//!
//! Each output element's arithmetic is the same whatever the tiling (its
//! int32 sum is exact, its epilogue one FMA), so the eager call and a
//! compiled one with any epilogue agree bit for bit.
//!
//! Packed weights are cached by [`packed_weights`] in the same cache (and
//! with the same invalidation) as the packed conv weights: a weight's
//! storage, view and version counter, so changing a quantized weight in
//! place (`load_state_dict`, a re-quantization) repacks it.
//!
//! ```
//! use kiln_runtime::externs::qgemm::{packed_weights, qlinear_into, Isa, QLinearCall};
//! let packed = packed_weights(None, &[1, 2, 3, 4], 2, 2);  // [out 2, in 2]
//! let call = QLinearCall { packed: &packed, w_scale: &[0.5], bias: None, relu: false, isa: Isa::detect() };
//! let mut out = [0f32; 2];
//! let tiles = std::sync::atomic::AtomicUsize::new(0);
//! let count = |_r0: usize, _rows: usize| { tiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed); };
//! qlinear_into(&[1.0, 0.0], 1, &call, &mut out, Some(&count));
//! assert_eq!(tiles.into_inner(), 1);
//! assert!((out[0] - 0.5).abs() < 0.01 && (out[1] - 1.5).abs() < 0.02);
//! ```

use super::{
    choose_activation_qparams, find_min_max, gemm_rows, quantize_activations, Epilogue, Isa,
    PackedWeights,
};
use crate::externs::packed::{packed_or_insert, WeightKey};
use crate::externs::{threads, SendPtr, PAR_MIN_WORK};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Output rows per tile: 64 rows of a 1024-wide f32 output are 256 KiB,
/// which stays in a core's L2 between the GEMM and the epilogue.
pub const TILE_ROWS: usize = 64;

/// A packed weight shared through the packed-weight cache.
#[derive(Clone)]
pub struct PackedHandle(Arc<Vec<PackedWeights>>);

impl std::ops::Deref for PackedHandle {
    type Target = PackedWeights;
    fn deref(&self) -> &PackedWeights {
        &self.0[0]
    }
}

static PACKS: AtomicUsize = AtomicUsize::new(0);

/// How many times weights have been packed in this process (tests check
/// that a cached weight is not repacked, and that a changed one is).
pub fn pack_count() -> usize {
    PACKS.load(Ordering::Relaxed)
}

/// The packed form of the row-major `[n, k]` int8 weight `w`, reused while
/// `key` (its storage, view and version) is unchanged; packed afresh
/// without a key.
pub fn packed_weights(key: Option<WeightKey>, w: &[i8], n: usize, k: usize) -> PackedHandle {
    // the conv cache stores Vec<T>: a one-element Vec holds the packed form
    PackedHandle(packed_or_insert(key, "qgemm-panels-16", || {
        PACKS.fetch_add(1, Ordering::Relaxed);
        vec![PackedWeights::pack(w, n, k)]
    }))
}

/// What one quantized Linear call multiplies with.
pub struct QLinearCall<'a> {
    pub packed: &'a PackedWeights,
    /// One scale (per tensor) or one per output column.
    pub w_scale: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub relu: bool,
    pub isa: Isa,
}

/// `out[m, n] = epilogue(quantize(x[m, k]) x packed^T)`, calling
/// `tile(row0, rows)` once each tile of `out` rows is written (tiles may
/// run on several threads at once).
///
/// The caller checks that `x` is finite (NaN has no quantized value).
pub fn qlinear_into(
    x: &[f32],
    m: usize,
    call: &QLinearCall,
    out: &mut [f32],
    tile: Option<&(dyn Fn(usize, usize) + Sync)>,
) {
    let (n, k, lda) = (call.packed.n(), call.packed.k(), call.packed.k_padded());
    assert_eq!(x.len(), m * k, "qlinear: {} inputs for [{m}, {k}]", x.len());
    assert_eq!(
        out.len(),
        m * n,
        "qlinear: output of {} for [{m}, {n}]",
        out.len()
    );
    let (lo, hi) = find_min_max(x);
    let a = choose_activation_qparams(lo, hi, true);
    let ep = Epilogue::new(call.packed, a, call.w_scale, call.bias, call.relu);
    let tiles = m.div_ceil(TILE_ROWS);
    let big = m * n * k >= PAR_MIN_WORK * 4 && threads() > 1;
    // enough tiles for every thread: one tile per task; else the panels of
    // each tile split across threads
    let by_tile = big && tiles >= threads();
    let out_ptr = SendPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let (r0, rows) = (t * TILE_ROWS, TILE_ROWS.min(m - t * TILE_ROWS));
        let xq = if k == 0 {
            vec![0u8; rows * lda]
        } else {
            quantize_activations(&x[r0 * k..(r0 + rows) * k], k, lda, a)
        };
        // SAFETY: tiles write disjoint row ranges of `out`.
        let dst = unsafe { out_ptr.get().add(r0 * n) };
        gemm_rows(&xq, rows, call.packed, &ep, dst, call.isa, big && !by_tile);
        if let Some(f) = tile {
            f(r0, rows);
        }
    };
    if by_tile {
        crate::par::for_each_chunk(tiles, || (), |_, i| run(i));
    } else {
        (0..tiles).for_each(run);
    }
}
