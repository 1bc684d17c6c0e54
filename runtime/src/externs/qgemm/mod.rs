//! Int8 GEMM for dynamically quantized Linear layers, with PyTorch's fbgemm
//! numerics: uint8 activations (quantized per call, 7 bits) times symmetric
//! int8 weights (packed once), int32 accumulation, then the float scale and
//! bias in the same pass over the accumulators.
//!
//! Kernels: AVX-512-VNNI (`vpdpbusd`) where the CPU has it, AVX2
//! (`vpmaddubsw` + `vpmaddwd`) otherwise, chosen at run time ([`Isa::detect`]),
//! and a scalar reference that the SIMD kernels must match bit for bit.
//!
//! ```
//! use kiln_runtime::externs::qgemm::{qlinear, quantize_weight_symmetric, Isa, PackedWeights};
//! let w = [0.5f32, -0.25, 1.0, 0.75];                      // [out 2, in 2]
//! let (wq, scales) = quantize_weight_symmetric(&w, 2, 2, false);
//! let packed = PackedWeights::pack(&wq, 2, 2);
//! let y = qlinear(&[1.0, 2.0], 1, &packed, &scales, Some(&[0.1, 0.0]), false, Isa::detect());
//! assert!((y[0] - 0.1).abs() < 0.02 && (y[1] - 2.5).abs() < 0.03);
//! ```

mod fused;
mod pack;
mod params;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;

pub use fused::{pack_count, packed_weights, qlinear_into, PackedHandle, QLinearCall, TILE_ROWS};
pub use pack::{PackedWeights, NR};
pub use params::{
    choose_activation_qparams, find_min_max, quantize_activations, quantize_weight_symmetric,
    QParams,
};

use super::{threads, SendPtr, PAR_MIN_WORK};

/// Which int8 kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best kernel this CPU runs; `KILN_QGEMM=scalar|avx2|vnni` picks one
    /// (falling back to the best available when the CPU lacks it).
    pub fn detect() -> Isa {
        let best = Isa::best();
        match std::env::var("KILN_QGEMM").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if Isa::Avx2.is_available() => Isa::Avx2,
            Ok("vnni") if Isa::Avx512Vnni.is_available() => Isa::Avx512Vnni,
            _ => best,
        }
    }

    fn best() -> Isa {
        if Isa::Avx512Vnni.is_available() {
            Isa::Avx512Vnni
        } else if Isa::Avx2.is_available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU can run the kernel (CPUID).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// The per-column constants of one call's epilogue, padded to whole panels:
/// `out = fma(f32(acc - offs[j]), mult[j], bias[j])`, then ReLU if asked.
pub(crate) struct Epilogue {
    offs: Vec<i32>,
    mult: Vec<f32>,
    bias: Vec<f32>,
    relu: bool,
}

impl Epilogue {
    /// `w_scale` holds one scale (per tensor) or one per output column.
    fn new(
        packed: &PackedWeights,
        a: QParams,
        w_scale: &[f32],
        bias: Option<&[f32]>,
        relu: bool,
    ) -> Epilogue {
        let n = packed.n();
        assert!(
            w_scale.len() == 1 || w_scale.len() == n,
            "qgemm: {} weight scales for {n} columns",
            w_scale.len()
        );
        if let Some(b) = bias {
            assert_eq!(b.len(), n, "qgemm: bias of {} for {n} columns", b.len());
        }
        let width = packed.panels() * NR;
        let mut ep = Epilogue {
            offs: vec![0; width],
            mult: vec![0.0; width],
            bias: vec![0.0; width],
            relu,
        };
        for j in 0..n {
            ep.offs[j] = a.zero_point * packed.colsum()[j];
            // fbgemm: A_scale * B_scale, one f32 product
            ep.mult[j] = a.scale * w_scale[if w_scale.len() == 1 { 0 } else { j }];
            ep.bias[j] = bias.map_or(0.0, |b| b[j]);
        }
        ep
    }

    #[inline]
    fn apply(&self, acc: i32, j: usize) -> f32 {
        // one rounding, as fbgemm's vfmadd: PyTorch's outputs match bit for bit
        let v = ((acc - self.offs[j]) as f32).mul_add(self.mult[j], self.bias[j]);
        if self.relu {
            // vmaxps(0, v) returns v unless 0 > v: NaN and -0.0 stay
            if v < 0.0 {
                0.0
            } else {
                v
            }
        } else {
            v
        }
    }
}

/// One panel's work for a SIMD kernel: all `m` rows times columns
/// `[p * NR, p * NR + ncols)`.
pub(crate) struct PanelTask {
    m: usize,
    a: *const u8,
    lda: usize,
    b: *const u8,
    groups: usize,
    offs: *const i32,
    mult: *const f32,
    bias: *const f32,
    relu: bool,
    out: *mut f32,
    ldo: usize,
    ncols: usize,
}

/// `out[m, n] = epilogue(xq[m, k_padded] (u8) x packed^T)` with the kernel `isa`.
///
/// `xq` rows are `packed.k_padded()` bytes (zero padded), quantized with `a`.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_dequant(
    xq: &[u8],
    m: usize,
    a: QParams,
    packed: &PackedWeights,
    w_scale: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    out: &mut [f32],
    isa: Isa,
) {
    let (n, k, lda) = (packed.n(), packed.k(), packed.k_padded());
    assert_eq!(
        xq.len(),
        m * lda,
        "qgemm: {} activation bytes for [{m}, {lda}]",
        xq.len()
    );
    assert_eq!(
        out.len(),
        m * n,
        "qgemm: output of {} for [{m}, {n}]",
        out.len()
    );
    let ep = Epilogue::new(packed, a, w_scale, bias, relu);
    let par = m * n * k >= PAR_MIN_WORK * 4 && threads() > 1;
    gemm_rows(xq, m, packed, &ep, out.as_mut_ptr(), isa, par);
}

/// `rows` rows of `xq` (each `packed.k_padded()` bytes) times the packed
/// weight, with the epilogue `ep`, into the row-major `[rows, n]` at `out`;
/// the panels split across threads when `parallel`.
///
/// `out` must be valid for `rows * n` writes that nothing else touches
/// during the call.
pub(crate) fn gemm_rows(
    xq: &[u8],
    rows: usize,
    packed: &PackedWeights,
    ep: &Epilogue,
    out: *mut f32,
    isa: Isa,
    parallel: bool,
) {
    let (n, k, lda) = (packed.n(), packed.k(), packed.k_padded());
    if rows == 0 || n == 0 {
        return;
    }
    let isa = if isa.is_available() { isa } else { Isa::Scalar };
    if isa == Isa::Scalar {
        // SAFETY: the caller hands over `rows * n` floats at `out`.
        let out = unsafe { std::slice::from_raw_parts_mut(out, rows * n) };
        scalar::qgemm(xq, rows, lda, packed.plain(), n, k, ep, out);
        return;
    }
    let out_ptr = SendPtr(out);
    let run = |p: usize| {
        let task = PanelTask {
            m: rows,
            a: xq.as_ptr(),
            lda,
            b: packed.panel(p).as_ptr(),
            groups: lda / 4,
            offs: ep.offs[p * NR..].as_ptr(),
            mult: ep.mult[p * NR..].as_ptr(),
            bias: ep.bias[p * NR..].as_ptr(),
            relu: ep.relu,
            // SAFETY: panels write disjoint column ranges of `out`.
            out: unsafe { out_ptr.get().add(p * NR) },
            ldo: n,
            ncols: (n - p * NR).min(NR),
        };
        run_panel(isa, &task);
    };
    let panels = packed.panels();
    if parallel && panels > 1 {
        crate::par::for_each_chunk(panels, || (), |_, i| run(i));
    } else {
        (0..panels).for_each(run);
    }
}

fn run_panel(isa: Isa, task: &PanelTask) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `isa` was checked available; the task's pointers cover its geometry.
    unsafe {
        match isa {
            Isa::Avx2 => simd::panel_avx2(task),
            Isa::Avx512Vnni => simd::panel_vnni(task),
            Isa::Scalar => unreachable!("the scalar kernel runs whole"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, task);
        unreachable!("no SIMD kernel off x86-64")
    }
}

/// A dynamically quantized Linear on row-major `[m, k]` f32 activations:
/// finds their range, quantizes them to uint8 with `reduce_range`, runs the
/// int8 GEMM and the float epilogue. Returns `[m, n]`.
///
/// The caller checks that `x` is finite (NaN has no quantized value).
#[allow(clippy::too_many_arguments)]
pub fn qlinear(
    x: &[f32],
    m: usize,
    packed: &PackedWeights,
    w_scale: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    isa: Isa,
) -> Vec<f32> {
    let mut out = vec![0f32; m * packed.n()];
    let call = QLinearCall {
        packed,
        w_scale,
        bias,
        relu,
        isa,
    };
    qlinear_into(x, m, &call, &mut out, None);
    out
}
