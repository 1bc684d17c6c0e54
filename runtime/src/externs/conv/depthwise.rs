//! Depthwise convolution (one input channel per group, channel multipliers
//! too) on register accumulators.
//!
//! Each (sample, output channel) plane copies its input channel once into
//! the direct kernel's padded, phase-split form (`direct.rs`): there every
//! tap of output column `t = oh * Wh + ow` sits at one fixed offset from
//! `t`, so a run of consecutive outputs reads a run of consecutive inputs
//! per tap. A block of [`BLOCK`] columns then accumulates all `kH * kW`
//! taps in registers (four independent vectors, so the FMAs do not wait on
//! each other) and is stored once; the `Wh - OW` columns past each row's end
//! are computed and dropped. The old loop added each tap into the output
//! row in memory: a load, a multiply-add and a store per tap and element.
//!
//! For f32 the body is AVX-512 or AVX2 + FMA (chosen at run time); other
//! types and CPUs run the portable body, which adds the taps in the same
//! order (bias first) without fused multiply-adds.

use super::direct::{self, Layout};
use super::{conv_shapes, scratch, Epilogue, Tile};
use crate::externs::cpu_isa::{self, Isa};
use crate::externs::{threads, Elem, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Output columns one accumulator block covers: four 16-lane vectors.
const BLOCK: usize = 64;

/// `conv2d` for `g.c_in_per_group() == 1` (see the module doc).
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let taps = g.kernel[0] * g.kernel[1];
    let l = Layout::of(g);
    let koff = direct::tap_offsets(g, &l);
    let cols = oh * l.wh;
    // the farthest tap of the last block must stay inside the split input
    let blocks = cols.div_ceil(BLOCK) * BLOCK;
    let reach = koff.iter().copied().max().unwrap_or(0) as usize + blocks;
    let split_len = reach.max(l.channel());
    let opg = g.c_out_per_group();
    let shapes = || conv_shapes(g);
    let plane = |(idx, o): (usize, &mut [T]), (xs, acc): &mut (Vec<T>, Vec<T>)| -> Result<()> {
        let (ni, oc) = (idx / g.c_out, idx % g.c_out);
        scratch(xs, split_len, "conv2d", &shapes)?;
        scratch(acc, blocks, "conv2d", &shapes)?;
        let acc = &mut acc[..blocks];
        let x = &input[(ni * g.c_in + oc / opg) * h * w..][..h * w];
        // xs was zeroed when allocated and every plane of the call has the
        // same padding: only the data moves
        direct::split_channel(g, &l, x, xs, false);
        let wk = &weight[oc * taps..][..taps];
        let b = bias.map_or(T::ZERO, |b| b[oc]);
        // SAFETY: xs holds reach elements: every tap of every block is inside.
        unsafe { accumulate(wk, &koff, xs, b, acc) };
        for (r, orow) in o.chunks_exact_mut(ow).enumerate() {
            orow.copy_from_slice(&acc[r * l.wh..][..ow]);
        }
        if let Some(e) = epilogue {
            e(Tile {
                n: ni,
                c0: oc,
                channels: 1,
                p0: 0,
                cols: oh * ow,
            });
        }
        Ok(())
    };
    let init = || (Vec::new(), Vec::new());
    let work = out.len() * taps;
    if threads() > 1 && work >= PAR_MIN_WORK {
        crate::par::try_for_each_piece(out, oh * ow, init, |s, i, d| plane((i, d), s)).map(drop)
    } else {
        let mut s = init();
        out.chunks_mut(oh * ow)
            .enumerate()
            .try_for_each(|p| plane(p, &mut s))
    }
}

/// `acc[t] = bias + sum_k w[k] * xs[koff[k] + t]` for every `t` of `acc`
/// (a multiple of [`BLOCK`]).
///
/// # Safety
/// `xs[koff[k] + t]` must be in bounds for every `k` and `t < acc.len()`.
unsafe fn accumulate<T: Elem>(w: &[T], koff: &[isize], xs: &[T], bias: T, acc: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if super::is_f32::<T>() {
        let (w, acc) = (super::as_f32(w), super::as_f32_mut(acc));
        let xs = (xs as *const [T]).cast::<f32>();
        let bias = *(&bias as *const T).cast::<f32>();
        match cpu_isa::detect() {
            // SAFETY: T is f32 (checked above); the CPU has the ISA.
            Isa::Avx512 => return accumulate_avx512(w, koff, xs, bias, acc),
            Isa::Avx2 => return accumulate_avx2(w, koff, xs, bias, acc),
            Isa::Scalar => {}
        }
    }
    accumulate_portable(w, koff, xs, bias, acc)
}

/// [`accumulate`] in plain Rust, for any element type.
fn accumulate_portable<T: Elem>(w: &[T], koff: &[isize], xs: &[T], bias: T, acc: &mut [T]) {
    for (t0, block) in acc.chunks_exact_mut(BLOCK).enumerate() {
        block.fill(bias);
        for (&wv, &off) in w.iter().zip(koff) {
            let src = &xs[off as usize + t0 * BLOCK..][..BLOCK];
            for (a, &x) in block.iter_mut().zip(src) {
                *a = *a + wv * x;
            }
        }
    }
}

/// [`accumulate`] for f32 with AVX-512F: four 16-lane accumulators a block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn accumulate_avx512(w: &[f32], koff: &[isize], xs: *const f32, bias: f32, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    for (t0, block) in acc.chunks_exact_mut(BLOCK).enumerate() {
        let base = xs.add(t0 * BLOCK);
        let mut a = [_mm512_set1_ps(bias); 4];
        for (&wv, &off) in w.iter().zip(koff) {
            let (wv, p) = (_mm512_set1_ps(wv), base.offset(off));
            for (u, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p.add(16 * u)), *a);
            }
        }
        for (u, a) in a.iter().enumerate() {
            _mm512_storeu_ps(block.as_mut_ptr().add(16 * u), *a);
        }
    }
}

/// [`accumulate`] for f32 with AVX2 + FMA: the block as two halves of four
/// 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_avx2(w: &[f32], koff: &[isize], xs: *const f32, bias: f32, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    for (t0, half) in acc.chunks_exact_mut(BLOCK / 2).enumerate() {
        let base = xs.add(t0 * BLOCK / 2);
        let mut a = [_mm256_set1_ps(bias); 4];
        for (&wv, &off) in w.iter().zip(koff) {
            let (wv, p) = (_mm256_set1_ps(wv), base.offset(off));
            for (u, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p.add(8 * u)), *a);
            }
        }
        for (u, a) in a.iter().enumerate() {
            _mm256_storeu_ps(half.as_mut_ptr().add(8 * u), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::externs::testutil::Lcg;

    /// Every wide body the CPU has agrees with the portable one to rounding.
    #[test]
    fn the_wide_bodies_agree_with_the_portable_body() {
        let mut r = Lcg(11);
        let w: Vec<f32> = r.vec(25);
        let koff: Vec<isize> = (0..25).map(|k| (k * 7 % 40) as isize).collect();
        let xs: Vec<f32> = r.vec(40 + 3 * BLOCK);
        let mut want = vec![f32::NAN; 3 * BLOCK];
        accumulate_portable(&w, &koff, &xs, 0.25, &mut want);
        #[allow(clippy::type_complexity)]
        let mut bodies: Vec<(
            &str,
            unsafe fn(&[f32], &[isize], *const f32, f32, &mut [f32]),
        )> = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                bodies.push(("avx2", accumulate_avx2));
            }
            if is_x86_feature_detected!("avx512f") {
                bodies.push(("avx512", accumulate_avx512));
            }
        }
        for (name, body) in bodies {
            let mut got = vec![f32::NAN; 3 * BLOCK];
            // SAFETY: the CPU has the ISA; xs covers every tap of 3 blocks.
            unsafe { body(&w, &koff, xs.as_ptr(), 0.25, &mut got) };
            for (t, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{name} column {t}: {g} vs {e}"
                );
            }
        }
    }
}
