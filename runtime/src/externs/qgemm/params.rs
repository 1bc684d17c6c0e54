//! Quantization parameters, chosen as PyTorch's fbgemm backend chooses them.
//!
//! Weights: symmetric int8 (`MinMaxObserver` / `PerChannelMinMaxObserver`
//! with `qscheme=per_*_symmetric`): `scale = max(|min|, |max|) / 127.5`
//! (at least f32 epsilon), zero point 0, `q = clamp(rne(w * (1/scale)), -128, 127)`.
//!
//! Activations: per call, uint8 over the whole input
//! (`quant_utils::ChooseQuantizationParams` with `reduce_range`: 7 bits,
//! `[0, 127]`), quantized as fbgemm's `QuantizeAvx2` does:
//! `q = clamp(rne(fma(x, 1/scale, zero_point)), 0, 255)`.

/// An affine quantization: `real = scale * (q - zero_point)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QParams {
    pub scale: f32,
    pub zero_point: i32,
}

/// fbgemm's smallest activation scale (`SMALL_SCALE_THRESHOLD`).
const SMALL_SCALE_THRESHOLD: f32 = 6.1e-5;

/// `quant_utils::ChooseQuantizationParams(min, max, 0, 255, preserve_sparsity=false,
/// force_scale_power_of_two=false, reduce_range)`: the uint8 parameters of a
/// tensor whose values span `[min, max]` (both finite).
///
/// ```
/// use kiln_runtime::externs::qgemm::choose_activation_qparams;
/// let q = choose_activation_qparams(-1.0, 3.0, true);
/// assert_eq!(q.zero_point, 32);                 // 0 maps to 32 of [0, 127]
/// assert!((q.scale - 4.0 / 127.0).abs() < 1e-7);
/// ```
pub fn choose_activation_qparams(min: f32, max: f32, reduce_range: bool) -> QParams {
    let (mut qmin, mut qmax) = (0i32, 255i32);
    if reduce_range {
        qmin /= 2;
        qmax /= 2;
    }
    // The interval must contain 0 so that 0 is exactly representable.
    let mut min = min.min(0.0);
    let mut max = max.max(0.0);
    // Double precision in between, single precision for the scale used.
    let mut scale = (max as f64 - min as f64) / (qmax - qmin) as f64;
    if scale as f32 == 0.0 || (1.0f32 / scale as f32).is_infinite() {
        scale = 0.1;
    }
    if scale < SMALL_SCALE_THRESHOLD as f64 {
        let org_scale = scale as f32;
        scale = SMALL_SCALE_THRESHOLD as f64;
        if min == 0.0 {
            max = SMALL_SCALE_THRESHOLD * (qmax - qmin) as f32;
        } else if max == 0.0 {
            min = -SMALL_SCALE_THRESHOLD * (qmax - qmin) as f32;
        } else {
            let amplifier = SMALL_SCALE_THRESHOLD / org_scale;
            min *= amplifier;
            max *= amplifier;
        }
    }
    // The zero point from whichever end adds the smaller terms (fbgemm's
    // error estimate, kept verbatim: |qmin| - |min/scale|).
    let zp_from_min = qmin as f64 - min as f64 / scale;
    let zp_from_max = qmax as f64 - max as f64 / scale;
    let err_min = (qmin as f64).abs() - (min as f64 / scale).abs();
    let err_max = (qmax as f64).abs() - (max as f64 / scale).abs();
    let initial = if err_min < err_max {
        zp_from_min
    } else {
        zp_from_max
    };
    let zero_point = if initial < qmin as f64 {
        qmin
    } else if initial > qmax as f64 {
        qmax
    } else {
        initial.round_ties_even() as i32
    };
    QParams {
        scale: scale as f32,
        zero_point,
    }
}

/// `(min, max)` of `x` as fbgemm's `FindMinMax` (0, 0 when empty).
pub fn find_min_max(x: &[f32]) -> (f32, f32) {
    let Some(&first) = x.first() else {
        return (0.0, 0.0);
    };
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 checked; x is non-empty.
        return unsafe { super::simd::min_max_avx2(x) };
    }
    x.iter()
        .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Quantizes `rows x k` activations to uint8 rows of `k_padded` bytes
/// (the tail zero), as fbgemm's `PackAWithQuantRowOffset` does
/// (`QuantizeAvx2`, LEGACY: one fused multiply-add, then round half to even).
pub fn quantize_activations(x: &[f32], k: usize, k_padded: usize, q: QParams) -> Vec<u8> {
    assert!(
        k > 0 && x.len() % k == 0 && k_padded >= k,
        "quantize_activations: {} values, k {k}, padded {k_padded}",
        x.len()
    );
    let rows = x.len() / k;
    let inv = 1.0f32 / q.scale;
    let zp = q.zero_point as f32;
    let mut out = vec![0u8; rows * k_padded];
    #[cfg(target_arch = "x86_64")]
    let simd =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(k_padded)) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: AVX2 and FMA checked; dst holds k_padded >= k bytes.
            unsafe { super::simd::quantize_row_avx2(src, dst, inv, zp) };
            continue;
        }
        quantize_row_scalar(src, dst, inv, zp);
    }
    out
}

/// One row of [`quantize_activations`], one element at a time.
pub(super) fn quantize_row_scalar(src: &[f32], dst: &mut [u8], inv: f32, zp: f32) {
    for (d, &v) in dst.iter_mut().zip(src) {
        // fbgemm clips at the largest int32 a float holds before converting
        let t = v.mul_add(inv, zp).min(2147483520.0).round_ties_even();
        *d = t.clamp(0.0, 255.0) as u8;
    }
}

/// Symmetric int8 weights of a `rows x cols` matrix (a Linear's `[out, in]`),
/// one scale for the tensor or one per row (output channel).
///
/// Returns the int8 values (row-major) and the scales (1 or `rows`).
///
/// ```
/// use kiln_runtime::externs::qgemm::quantize_weight_symmetric;
/// let (q, s) = quantize_weight_symmetric(&[0.5, -1.0, 0.25, 2.0], 2, 2, true);
/// assert_eq!(s, vec![1.0 / 127.5, 2.0 / 127.5]);
/// assert_eq!((q[0], q[2], q[3]), (64, 16, 127)); // 0.5 * 127.5 = 63.75 -> 64
/// assert!(q[1] <= -127);
/// ```
pub fn quantize_weight_symmetric(
    w: &[f32],
    rows: usize,
    cols: usize,
    per_channel: bool,
) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(
        w.len(),
        rows * cols,
        "quantize_weight_symmetric: {} values for {rows}x{cols}",
        w.len()
    );
    let scale_of = |vals: &[f32]| {
        let (lo, hi) = find_min_max(vals);
        let max_pos = (-lo.min(0.0)).max(hi.max(0.0));
        (max_pos / 127.5).max(f32::EPSILON)
    };
    let scales: Vec<f32> = if per_channel {
        w.chunks(cols.max(1)).map(scale_of).collect()
    } else {
        vec![scale_of(w)]
    };
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = if per_channel {
                scales[i / cols]
            } else {
                scales[0]
            };
            let t = (v * (1.0f32 / s)).round_ties_even();
            t.clamp(-128.0, 127.0) as i8
        })
        .collect();
    (q, scales)
}
