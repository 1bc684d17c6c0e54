//! Batched matrix product as one tiled CUDA kernel over strided operands:
//! `out[b, m, n] = sum_k a[b, m, k] * w[b, k, n]`, where `a` and `w` are any
//! views (a transposed weight, a broadcast batch: stride 0) and `out` is
//! contiguous `[B, M, N]`.
//!
//! The tiling is the conv template's (`super::conv`): 256 threads compute a
//! 64 x 64 tile, 4 x 4 per thread, over 16-deep shared-memory slices; blocks
//! loop over `B * tiles`. Each slice is read along whichever of its two dims
//! has stride 1, so a row-major or a transposed operand is read coalesced.
//! Each output's sum runs over `k` in order.
//!
//! A compiled graph's pointwise epilogue (a bias, an activation) is applied
//! before the store (`super::epilogue`).
//!
//! Parameters, in order (all 8 bytes): `p0`, `pa`, `pw`, the epilogue's
//! inputs, `B M N K sa_b sa_m sa_k sw_b sw_k sw_n`, then the epilogue's
//! strides over `[B, M, N]` and scalars.

use super::epilogue::{self, Epilogue};
use super::template::{assemble, float_types, Parts, TemplateKernel};
use kiln_ir::{DType, Error};

/// Threads per block of the GEMM kernel.
pub const GEMM_BLOCK: u32 = 256;

/// The size and stride parameters, in the kernel's order.
pub const SIZES: [&str; 10] = [
    "B", "M", "N", "K", "sa_b", "sa_m", "sa_k", "sw_b", "sw_k", "sw_n",
];

const BODY: &str = r#"#define KILN_BM $TILE
#define KILN_BN $TILE
#define KILN_BK 16
extern "C" __global__ void SYMBOL(
$PARAMS) {
  // (+1: a slice stored along k would put a warp's stores in two banks)
  __shared__ $T tile_a[KILN_BK][KILN_BM + 1];
  __shared__ $T tile_w[KILN_BK][KILN_BN + 1];
  const long long tiles_m = (M + KILN_BM - 1) / KILN_BM;
  const long long tiles_n = (N + KILN_BN - 1) / KILN_BN;
  const long long tiles = B * tiles_m * tiles_n;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
$SCALARS  // read each slice along its unit-stride dim (uniform across the block)
  const bool a_along_k = sa_k == 1 && sa_m != 1;
  const bool w_along_k = sw_k == 1 && sw_n != 1;
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const long long n_base = tile % tiles_n * KILN_BN;
    const long long m_base = tile / tiles_n % tiles_m * KILN_BM;
    const long long b = tile / (tiles_n * tiles_m);
    const $T* __restrict__ ab = pa + b * sa_b;
    const $T* __restrict__ wb = pw + b * sw_b;
    $T acc[4][4];
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) acc[i][j] = ($T)0;
    for (long long k0 = 0; k0 < K; k0 += KILN_BK) {
      for (int l = tid; l < KILN_BM * KILN_BK; l += 256) {
        const int kk = a_along_k ? l % KILN_BK : l / KILN_BM;
        const int mm = a_along_k ? l / KILN_BK : l % KILN_BM;
        const long long m = m_base + mm, k = k0 + kk;
        tile_a[kk][mm] = (m < M && k < K) ? ab[m * sa_m + k * sa_k] : ($T)0;
      }
      for (int l = tid; l < KILN_BK * KILN_BN; l += 256) {
        const int kk = w_along_k ? l % KILN_BK : l / KILN_BN;
        const int nn = w_along_k ? l / KILN_BK : l % KILN_BN;
        const long long n = n_base + nn, k = k0 + kk;
        tile_w[kk][nn] = (n < N && k < K) ? wb[k * sw_k + n * sw_n] : ($T)0;
      }
      __syncthreads();
      for (int kk = 0; kk < KILN_BK; kk++) {
        $T x[4], y[4];
        for (int i = 0; i < 4; i++) x[i] = tile_a[kk][ty + 16 * i];
        for (int j = 0; j < 4; j++) y[j] = tile_w[kk][tx + 16 * j];
        for (int i = 0; i < 4; i++)
          for (int j = 0; j < 4; j++) acc[i][j] += x[i] * y[j];
      }
      __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
      const long long m = m_base + ty + 16 * i;
      if (m >= M) continue;
      for (int j = 0; j < 4; j++) {
        const long long n = n_base + tx + 16 * j;
        if (n >= N) continue;
        const long long oc = (b * M + m) * N + n;
        const $T value = acc[i][j];
$EPILOGUE      }
    }
  }
}
"#;

/// What a GEMM kernel is specialised on (sizes and strides are parameters).
#[derive(Debug, Clone, Copy)]
pub struct GemmSpec<'a> {
    /// f32 or f64: both operands and the product.
    pub dtype: DType,
    /// Applied to each product element before it is stored; a rank-3
    /// kernel over `[B, M, N]`.
    pub epilogue: Option<Epilogue<'a>>,
}

/// The GEMM kernel for `spec`.
pub fn gemm_template(spec: &GemmSpec) -> Result<TemplateKernel, Error> {
    let dt = spec.dtype;
    let (t, out, input) = float_types("matmul", "the CUDA GEMM", dt)?;
    let ptrs = vec![
        (format!("{t}* __restrict__ p0"), out),
        (format!("const {t}* __restrict__ pa"), input),
        (format!("const {t}* __restrict__ pw"), input),
    ];
    let e = epilogue::emit("matmul", spec.epilogue, dt, &["b", "m", "n"], "value", 4)?;
    let name = match spec.epilogue {
        Some(ep) => format!("matmul_{dt}+{}", ep.kernel.name),
        None => format!("matmul_{dt}"),
    };
    let parts = Parts {
        name,
        what: "batched GEMM over strided operands",
        body: BODY,
        t,
        ptrs,
        sizes: &SIZES,
        extra: &[],
        block: GEMM_BLOCK,
    };
    Ok(assemble(parts, e))
}
