//! Convolution as ONE tiled CUDA kernel with its pointwise epilogue:
//! an implicit GEMM (no im2col buffer, padding read as zeros), whose
//! output tile goes through the fused epilogue — a KernelIR pointwise
//! kernel, emitted by the same scalar code as every other kernel — before
//! it is stored. So a compiled Conv + folded BatchNorm + ReLU is one launch.
//!
//! # Tiling
//!
//! Per group, the conv is the product of the weights `[cog, cg*kh*kw]` and
//! the patches `[cg*kh*kw, n*oh*ow]`. A block of 256 threads computes a
//! 64 x 64 output tile (64 output channels by 64 output positions), each
//! thread a 4 x 4 of it, staging 16-deep slices of both operands in shared
//! memory; blocks loop over tiles (any grid works). Each output's sum runs
//! over `(ci, r, s)` in order, one product at a time (FMA on a GPU).
//!
//! # Parameters, in order (all 8 bytes)
//!
//! - `p0`: the output, contiguous `[N, K, OH, OW]`; `cx`: the input,
//!   contiguous `[N, C, H, W]`; `cw`: the weights, contiguous
//!   `[K, C/groups, R, S]`; `cb`: the bias `[K]` (only with one);
//! - `p{op}` for each epilogue input that is not the conv's value;
//! - `N C H W K OH OW R S stride_h stride_w pad_h pad_w dil_h dil_w groups`;
//! - `s{op}_0 .. s{op}_3`: each epilogue input's strides over `[N, K, OH, OW]`;
//! - `sc{n}`: the epilogue's scalars.
//!
//! A 1-d conv is a 2-d one with `H = R = 1`.

use super::epilogue;
pub use super::epilogue::Epilogue;
use super::template::{assemble, float_types, Parts, TemplateKernel};
use kiln_ir::{DType, Error};

/// Threads per block of the conv kernel.
pub const CONV_BLOCK: u32 = 256;

/// The geometry parameters, in the kernel's order.
pub const GEOMETRY: [&str; 16] = [
    "N", "C", "H", "W", "K", "OH", "OW", "R", "S", "stride_h", "stride_w", "pad_h", "pad_w",
    "dil_h", "dil_w", "groups",
];

/// What a conv kernel is specialised on (sizes are parameters).
#[derive(Debug, Clone, Copy)]
pub struct ConvSpec<'a> {
    /// f32 or f64: input, weights, bias and the conv's value.
    pub dtype: DType,
    pub bias: bool,
    pub epilogue: Option<Epilogue<'a>>,
}

impl ConvSpec<'_> {
    /// The epilogue inputs that get a pointer of their own.
    pub fn epilogue_inputs(&self) -> Vec<usize> {
        self.epilogue.map(|e| e.inputs()).unwrap_or_default()
    }
}

const BODY: &str = r#"#define KILN_BM $TILE
#define KILN_BN $TILE
#define KILN_BK 16
extern "C" __global__ void SYMBOL(
$PARAMS) {
  // (+1: the weight slice is stored along k, and a row of 64 would put a
  // warp's stores in two banks)
  __shared__ $T tile_w[KILN_BK][KILN_BM + 1];
  __shared__ $T tile_x[KILN_BK][KILN_BN];
  const long long cg = C / groups, kg = K / groups;
  const long long P = N * OH * OW, KR = cg * R * S;
  const long long tiles_m = (kg + KILN_BM - 1) / KILN_BM;
  const long long tiles_p = (P + KILN_BN - 1) / KILN_BN;
  const long long tiles = groups * tiles_m * tiles_p;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
$SCALARS  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const long long m_base = (tile / tiles_p) % tiles_m * KILN_BM;
    const long long p_base = tile % tiles_p * KILN_BN;
    const long long g = tile / (tiles_p * tiles_m);
    $T acc[4][4];
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) acc[i][j] = ($T)0;
    for (long long k0 = 0; k0 < KR; k0 += KILN_BK) {
      // weights: rows of KR contiguous elements, read along k
      for (int l = tid; l < KILN_BM * KILN_BK; l += 256) {
        const int kk = l % KILN_BK, mm = l / KILN_BK;
        const long long m = m_base + mm, kr = k0 + kk;
        tile_w[kk][mm] = (m < kg && kr < KR) ? cw[(g * kg + m) * KR + kr] : ($T)0;
      }
      // patches, read along output positions; padding reads as zero
      for (int l = tid; l < KILN_BK * KILN_BN; l += 256) {
        const int pp = l % KILN_BN, kk = l / KILN_BN;
        const long long p = p_base + pp, kr = k0 + kk;
        $T v = ($T)0;
        if (p < P && kr < KR) {
          const long long ow = p % OW, oh = p / OW % OH, n = p / (OW * OH);
          const long long s = kr % S, r = kr / S % R, ci = kr / (S * R);
          const long long ih = oh * stride_h - pad_h + r * dil_h;
          const long long iw = ow * stride_w - pad_w + s * dil_w;
          if (ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = cx[((n * C + g * cg + ci) * H + ih) * W + iw];
        }
        tile_x[kk][pp] = v;
      }
      __syncthreads();
      for (int kk = 0; kk < KILN_BK; kk++) {
        $T a[4], b[4];
        for (int i = 0; i < 4; i++) a[i] = tile_w[kk][ty + 16 * i];
        for (int j = 0; j < 4; j++) b[j] = tile_x[kk][tx + 16 * j];
        for (int i = 0; i < 4; i++)
          for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
      }
      __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
      const long long m = m_base + ty + 16 * i;
      if (m >= kg) continue;
      const long long i1 = g * kg + m;
      for (int j = 0; j < 4; j++) {
        const long long p = p_base + tx + 16 * j;
        if (p >= P) continue;
        const long long i3 = p % OW, i2 = p / OW % OH, i0 = p / (OW * OH);
        const long long oc = ((i0 * K + i1) * OH + i2) * OW + i3;
        const $T conv = acc[i][j]$BIAS;
$EPILOGUE      }
    }
  }
}
"#;

/// The conv kernel for `spec`; an error when the epilogue is not a rank-4
/// single-output pointwise kernel storing the conv's dtype.
pub fn conv_template(spec: &ConvSpec) -> Result<TemplateKernel, Error> {
    let dt = spec.dtype;
    let (t, out, input) = float_types("conv2d", "a CUDA conv", dt)?;
    let mut ptrs = vec![
        (format!("{t}* __restrict__ p0"), out),
        (format!("const {t}* __restrict__ cx"), input),
        (format!("const {t}* __restrict__ cw"), input),
    ];
    if spec.bias {
        ptrs.push((format!("const {t}* __restrict__ cb"), input));
    }
    let idx = ["i0", "i1", "i2", "i3"];
    let e = epilogue::emit("conv2d", spec.epilogue, dt, &idx, "conv", 4)?;
    let name = match spec.epilogue {
        Some(ep) => format!("conv2d+{}", ep.kernel.name),
        None => "conv2d".into(),
    };
    let bias = if spec.bias { " + cb[i1]" } else { "" };
    let parts = Parts {
        name,
        what: "implicit-GEMM convolution",
        body: BODY,
        t,
        ptrs,
        sizes: &GEOMETRY,
        extra: &[("$BIAS", bias)],
        block: CONV_BLOCK,
    };
    Ok(assemble(parts, e))
}
