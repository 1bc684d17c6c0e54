//! The fused attention family as CUDA templates (the CPU kernels are
//! `kiln_runtime::externs::attention`): the forward, with an online softmax
//! over the keys (one exp per score, the `[L, S]` scores never stored) and
//! each row's logsumexp; and the backward in two launches that recompute
//! the probabilities from that logsumexp: the query gradient (and each
//! row's `D = dO . O`) per query row, then the key and value gradients per
//! key, over every query head of its GQA group.
//!
//! One thread owns one row (forward, dq) or one key (dk, dv) and keeps its
//! accumulators in registers, so the head dims are capped at [`MAX_HEAD_DIM`]
//! (the caller runs the composite beyond). Conventions are the CPU
//! kernel's: a NaN or `+inf` score makes its row NaN; a row with no visible
//! key gives zeros with a mask (NaN without) and passes no gradient.
//!
//! Parameters, in order (all 8 bytes): the kernel's pointers (see
//! [`attention_templates`]), then `N H HK L S E EV causal mask_kind m0 m1
//! m2 m3` (`mask_kind`: 0 none, 1 bool, 2 float; `m*`: the mask's strides
//! over `[N, H, L, S]`) and `scale` (a double).
//!
//! ```
//! use kiln_codegen::cuda::attention::attention_templates;
//! let [fwd, dq, dkv] = attention_templates(kiln_ir::DType::F32).unwrap();
//! assert!(fwd.source.contains("__global__") && dq.name == "attention_dq_f32");
//! assert_eq!(dkv.params.len(), fwd.params.len() + 3);
//! ```

use super::template::{float_types, Param, TemplateKernel};
use kiln_ir::{DType, Error};

/// The largest E and Ev the templates take (their per-thread accumulators).
pub const MAX_HEAD_DIM: usize = 256;

/// Threads per block of every attention template.
pub const ATTENTION_BLOCK: u32 = 128;

/// The size parameters after the pointers, in order.
pub const SIZES: [&str; 13] = [
    "N",
    "H",
    "HK",
    "L",
    "S",
    "E",
    "EV",
    "causal",
    "mask_kind",
    "m0",
    "m1",
    "m2",
    "m3",
];

const PRELUDE: &str = r#"#ifndef KILN_ATTN_PRELUDE
#define KILN_ATTN_PRELUDE
#define KILN_MAX_D $MAXD
#define KILN_INF __longlong_as_double(0x7ff0000000000000LL)
#define KILN_NAN __longlong_as_double(0x7ff8000000000000LL)
#define KILN_SCORE(qi, kj, n, h, i, j) kiln_attn_score(qi, kj, E, scale, n, h, i, j, causal, mask_kind, maskb, maskf, m0, m1, m2, m3)
#define KILN_ROWS(count) for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < (count); t += (long long)gridDim.x * blockDim.x)
#endif
// q_i . k_j * scale, then the causal triangle and the mask
__device__ __forceinline__ $T kiln_attn_score(
    const $T* __restrict__ qi, const $T* __restrict__ kj, const long long E, const $T scale,
    const long long n, const long long h, const long long i, const long long j,
    const long long causal, const long long mask_kind,
    const unsigned char* __restrict__ maskb, const $T* __restrict__ maskf,
    const long long m0, const long long m1, const long long m2, const long long m3) {
  if (causal && j > i) return (-($T)KILN_INF);
  $T s = ($T)0;
  for (long long x = 0; x < E; x++) s += qi[x] * kj[x];
  s *= scale;
  const long long at = n * m0 + h * m1 + i * m2 + j * m3;
  if (mask_kind == 1 && !maskb[at]) return (-($T)KILN_INF);
  if (mask_kind == 2) s += maskf[at];
  return s;
}
"#;

const FORWARD: &str = r#"extern "C" __global__ void SYMBOL(
$PARAMS) {
  const $T scale = ($T)scale_d;
  KILN_ROWS(N * H * L) {
    const long long i = t % L, head = t / L, n = head / H, h = head % H;
    const long long kv = n * HK + h / (H / HK);
    const $T* qi = q + t * E;
    $T acc[KILN_MAX_D];
    for (long long y = 0; y < EV; y++) acc[y] = ($T)0;
    $T m = (-($T)KILN_INF), l = ($T)0;
    bool nan = false;
    const long long keys = causal ? (i + 1 < S ? i + 1 : S) : S;
    for (long long j = 0; j < keys; j++) {
      const $T s = KILN_SCORE(qi, k + (kv * S + j) * E, n, h, i, j);
      if (s != s || s == (($T)KILN_INF)) { nan = true; continue; }
      if (s == (-($T)KILN_INF)) continue;
      const $T* vj = v + (kv * S + j) * EV;
      if (s > m) {
        // a new max: rescale what was summed (exp(-inf) = 0 the first time)
        const $T a = exp(m - s);
        l = l * a + ($T)1;
        for (long long y = 0; y < EV; y++) acc[y] = acc[y] * a + vj[y];
        m = s;
      } else {
        const $T p = exp(s - m);
        l += p;
        for (long long y = 0; y < EV; y++) acc[y] += p * vj[y];
      }
    }
    $T* o = out + t * EV;
    if (nan) {
      for (long long y = 0; y < EV; y++) o[y] = (($T)KILN_NAN);
      lse[t] = (($T)KILN_NAN);
    } else if (m == (-($T)KILN_INF)) {
      for (long long y = 0; y < EV; y++) o[y] = mask_kind ? ($T)0 : (($T)KILN_NAN);
      lse[t] = mask_kind ? (-($T)KILN_INF) : (($T)KILN_NAN);
    } else {
      for (long long y = 0; y < EV; y++) o[y] = acc[y] / l;
      lse[t] = m + log(l);
    }
  }
}
"#;

const DQ: &str = r#"extern "C" __global__ void SYMBOL(
$PARAMS) {
  const $T scale = ($T)scale_d;
  KILN_ROWS(N * H * L) {
    const long long i = t % L, head = t / L, n = head / H, h = head % H;
    const long long kv = n * HK + h / (H / HK);
    const $T* qi = q + t * E;
    const $T* gi = gout + t * EV;
    $T d = ($T)0;
    for (long long y = 0; y < EV; y++) d += gi[y] * out[t * EV + y];
    delta[t] = d;
    $T acc[KILN_MAX_D];
    for (long long x = 0; x < E; x++) acc[x] = ($T)0;
    const $T ls = lse[t];
    const long long keys = ls == (-($T)KILN_INF) ? 0 : causal ? (i + 1 < S ? i + 1 : S) : S;
    for (long long j = 0; j < keys; j++) {
      const $T* kj = k + (kv * S + j) * E;
      const $T p = exp(KILN_SCORE(qi, kj, n, h, i, j) - ls);
      if (p == ($T)0) continue;
      $T dp = ($T)0;
      for (long long y = 0; y < EV; y++) dp += gi[y] * v[(kv * S + j) * EV + y];
      const $T ds = p * (dp - d) * scale;
      for (long long x = 0; x < E; x++) acc[x] += ds * kj[x];
    }
    for (long long x = 0; x < E; x++) dq[t * E + x] = acc[x];
  }
}
"#;

const DKV: &str = r#"extern "C" __global__ void SYMBOL(
$PARAMS) {
  const $T scale = ($T)scale_d;
  const long long group = H / HK;
  KILN_ROWS(N * HK * S) {
    const long long j = t % S, kvh = t / S, n = kvh / HK, g = kvh % HK;
    const $T* kj = k + t * E;
    const $T* vj = v + t * EV;
    $T ak[KILN_MAX_D], av[KILN_MAX_D];
    for (long long x = 0; x < E; x++) ak[x] = ($T)0;
    for (long long y = 0; y < EV; y++) av[y] = ($T)0;
    for (long long h = g * group; h < (g + 1) * group; h++) {
      for (long long i = causal ? j : 0; i < L; i++) {
        const long long r = (n * H + h) * L + i;
        const $T ls = lse[r];
        if (ls == (-($T)KILN_INF)) continue;
        const $T p = exp(KILN_SCORE(q + r * E, kj, n, h, i, j) - ls);
        if (p == ($T)0) continue;
        const $T* gi = gout + r * EV;
        $T dp = ($T)0;
        for (long long y = 0; y < EV; y++) dp += gi[y] * vj[y];
        const $T ds = p * (dp - delta[r]) * scale;
        for (long long y = 0; y < EV; y++) av[y] += p * gi[y];
        for (long long x = 0; x < E; x++) ak[x] += ds * q[r * E + x];
      }
    }
    for (long long x = 0; x < E; x++) dk[t * E + x] = ak[x];
    for (long long y = 0; y < EV; y++) dv[t * EV + y] = av[y];
  }
}
"#;

fn template(name: &str, body: &str, t: &str, ptrs: &[(&str, bool)]) -> TemplateKernel {
    let (out, input) = match t {
        "double" => (Param::Ptr("double*"), Param::Ptr("const double*")),
        _ => (Param::Ptr("float*"), Param::Ptr("const float*")),
    };
    let mut decl: Vec<(String, Param)> = ptrs
        .iter()
        .map(|&(p, mutable)| {
            let ty = if mutable {
                t.to_string()
            } else {
                format!("const {t}")
            };
            (
                format!("{ty}* __restrict__ {p}"),
                if mutable { out } else { input },
            )
        })
        .collect();
    decl.push((
        "const unsigned char* __restrict__ maskb".into(),
        Param::Ptr("const unsigned char*"),
    ));
    decl.push((format!("const {t}* __restrict__ maskf"), input));
    decl.extend(
        SIZES
            .iter()
            .map(|s| (format!("const long long {s}"), Param::Int)),
    );
    decl.push(("const double scale_d".into(), Param::F64));
    let (decl, params): (Vec<String>, Vec<Param>) = decl.into_iter().unzip();
    let src = format!("// generated by kiln-codegen (cuda): fused attention\n{PRELUDE}{body}")
        .replace("$PARAMS", &format!("    {}", decl.join(",\n    ")))
        .replace("$MAXD", &MAX_HEAD_DIM.to_string())
        .replace("$T", t);
    TemplateKernel::new(name, &src, params, ATTENTION_BLOCK)
}

/// The forward, dq and dk/dv templates in `dt` (f32 or f64). Their
/// pointers: forward `out, lse, q, k, v`; dq `dq, delta, q, k, v, out,
/// lse, gout`; dk/dv `dk, dv, q, k, v, delta, lse, gout`; each then `maskb,
/// maskf` (null when unused).
pub fn attention_templates(dt: DType) -> Result<[TemplateKernel; 3], Error> {
    let (t, _, _) = float_types("scaled_dot_product_attention", "the CUDA attention", dt)?;
    let names = |s: &str| format!("{s}_{dt}");
    let c = |p: &'static str| (p, false);
    let m = |p: &'static str| (p, true);
    Ok([
        template(
            &names("attention"),
            FORWARD,
            t,
            &[m("out"), m("lse"), c("q"), c("k"), c("v")],
        ),
        template(
            &names("attention_dq"),
            DQ,
            t,
            &[
                m("dq"),
                m("delta"),
                c("q"),
                c("k"),
                c("v"),
                c("out"),
                c("lse"),
                c("gout"),
            ],
        ),
        template(
            &names("attention_dkv"),
            DKV,
            t,
            &[
                m("dk"),
                m("dv"),
                c("q"),
                c("k"),
                c("v"),
                c("delta"),
                c("lse"),
                c("gout"),
            ],
        ),
    ])
}
