//! `scaled_dot_product_attention` through the fused kernel family
//! (`Op::Attention` / `Op::AttentionBackward`, `kiln_runtime::externs::attention`
//! on the CPU): the `[L, S]` scores are never stored, forward or backward.
//!
//! [`prepare`] decides where it applies: f32/f64 operands of rank 2 to 4 on
//! one device (the CPU, or a CUDA device with head dims up to
//! `kiln_codegen::cuda::attention::MAX_HEAD_DIM`), no dropout, key and value sharing the query's batch (their head
//! dim equal to the query's, 1, or a divisor of it with `enable_gqa`), a
//! bool mask or a float mask of the query's dtype that needs no gradient,
//! broadcastable to `[N, H, L, S]`, and no empty dim. Everything else runs
//! the composite of `attention.rs`.

use super::*;
use kiln_ir::op::attention::{attention_dims, AttentionParams, MaskKind};
use kiln_ir::op::Float;
use kiln_runtime::cuda::attention::{self as cuda_attn, DeviceMask};
use kiln_runtime::externs::attention::{self as attn, AttnCall, MaskRef, Strided};

/// The fused kernel's operands: rank-4 views of the caller's tensors.
pub(super) struct Prepared {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub mask: Option<Tensor>,
    pub params: AttentionParams,
    /// The result's dims (the query's batch dims, then `[L, Ev]`).
    pub out_dims: Vec<usize>,
}

/// `KILN_SDPA=math` sends every call to the composite (for A/B timing).
fn forced_math() -> bool {
    static MATH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MATH.get_or_init(|| std::env::var("KILN_SDPA").is_ok_and(|v| v == "math"))
}

fn to_rank4(t: &Tensor) -> Result<Tensor> {
    let mut t = t.clone();
    while t.rank() < 4 {
        t = t.unsqueeze(0)?;
    }
    Ok(t)
}

/// The fused kernel's operands for this call, or `None` where the composite
/// must run (see the module docs). The caller has checked the shapes.
pub(super) fn prepare(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    is_causal: bool,
    enable_gqa: bool,
) -> Result<Option<Prepared>> {
    let r = q.rank();
    let dt = q.dtype();
    let float_ok = matches!(dt, DType::F32 | DType::F64) && k.dtype() == dt && v.dtype() == dt;
    let dev = q.device();
    let one_device = [k, v]
        .iter()
        .chain(mask.as_ref())
        .all(|t| t.device() == dev);
    let max_dim = kiln_codegen::cuda::attention::MAX_HEAD_DIM;
    let dims_ok = !dev.is_cuda() || (q.dims()[r - 1] <= max_dim && v.dims()[r - 1] <= max_dim);
    if forced_math()
        || !float_ok
        || !one_device
        || !dims_ok
        || r > 4
        || q.numel() == 0
        || k.numel() == 0
    {
        return Ok(None);
    }
    let (q4, k4, v4) = (to_rank4(q)?, to_rank4(k)?, to_rank4(v)?);
    let (n, h, l) = (q4.dims()[0], q4.dims()[1], q4.dims()[2]);
    let (hk, s) = (k4.dims()[1], k4.dims()[2]);
    let heads_ok = hk == h || hk == 1 || (enable_gqa && hk > 0 && h % hk == 0);
    let batch_ok = k4.dims()[0] == n && v4.dims()[..3] == k4.dims()[..3];
    if !heads_ok || !batch_ok || v4.dims()[3] == 0 {
        return Ok(None);
    }
    let (mask4, kind) = match mask {
        None => (None, MaskKind::None),
        Some(m) => {
            let kind = match m.dtype() {
                DType::Bool => MaskKind::Bool,
                d if d == dt && !m.requires_grad() => MaskKind::Float,
                _ => return Ok(None),
            };
            if m.rank() > 4 {
                return Ok(None);
            }
            let Ok(m4) = to_rank4(m)?.expand_to(&[n, h, l, s]) else {
                return Ok(None);
            };
            (Some(m4), kind)
        }
    };
    let mut out_dims = q.dims()[..r - 1].to_vec();
    out_dims.push(v4.dims()[3]);
    Ok(Some(Prepared {
        q: q4,
        k: k4,
        v: v4,
        mask: mask4,
        params: AttentionParams {
            scale: Float(scale),
            is_causal,
            mask: kind,
        },
        out_dims,
    }))
}

/// The operands of a node: query, key, value, then the mask if any.
fn operands<'a>(
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    m: Option<&'a Tensor>,
) -> Vec<&'a Tensor> {
    [q, k, v].into_iter().chain(m).collect()
}

/// Runs the fused forward on prepared operands: `(out, logsumexp)`, with
/// its backward recorded when an operand needs a gradient.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: AttentionParams,
) -> Result<(Tensor, Tensor)> {
    let ins = operands(q, k, v, mask);
    let mut outs = trace::record_multi(
        || Op::Attention(p),
        &ins,
        || {
            let (out, lse) = attention_eager(q, k, v, mask, p)?;
            let out = crate::autograd::rules::nn::attention(q, k, v, mask, p, &lse, out)?;
            Ok(vec![out, lse])
        },
    )?
    .into_iter();
    match (outs.next(), outs.next()) {
        (Some(o), Some(l)) => Ok((o, l)),
        _ => bail!(
            "attention",
            "the fused attention gave fewer than two results"
        ),
    }
}

/// The mask as the kernel reads it: its storage from its offset, through
/// its strides (0 along broadcast dims).
fn mask_ref<'a, T: Copy>(m: &'a Tensor) -> Strided<'a, T> {
    let st = m.strides();
    Strided {
        // SAFETY: the storage holds T (checked by the caller's dtype match)
        data: unsafe { &m.storage.as_slice::<T>()[m.offset()..] },
        strides: [
            st[0] as usize,
            st[1] as usize,
            st[2] as usize,
            st[3] as usize,
        ],
    }
}

fn device_mask(m: Option<&Tensor>, kind: MaskKind) -> DeviceMask<'_> {
    match (m, kind) {
        (Some(m), MaskKind::Bool) => DeviceMask::Bool(m.runtime_view()),
        (Some(m), MaskKind::Float) => DeviceMask::Float(m.runtime_view()),
        _ => DeviceMask::None,
    }
}

/// A mask view with no negative stride (a flipped mask is copied).
fn readable_mask(m: Option<&Tensor>) -> Result<Option<Tensor>> {
    m.map(|m| {
        let m = m.detach();
        if m.strides().iter().any(|&s| s < 0) {
            m.contiguous()
        } else {
            Ok(m)
        }
    })
    .transpose()
}

fn call_of(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: AttentionParams,
) -> Result<AttnCall> {
    let metas: Vec<_> = operands(q, k, v, mask).iter().map(|t| t.meta()).collect();
    let dims = attention_dims("scaled_dot_product_attention", &p, &metas)?;
    Ok(AttnCall {
        dims,
        scale: p.scale.0,
        is_causal: p.is_causal,
    })
}

fn attention_eager(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: AttentionParams,
) -> Result<(Tensor, Tensor)> {
    let name = "scaled_dot_product_attention";
    let ins = operands(q, k, v, mask);
    let _p = op_scope(name, &ins);
    trace::check_launch(name, &ins)?;
    let call = call_of(q, k, v, mask, p)?;
    let d = call.dims;
    let dt = q.dtype();
    let (qc, kc, vc) = (compute_input(q)?, compute_input(k)?, compute_input(v)?);
    let m = readable_mask(mask)?;
    let out = Tensor::empty_for(name, &[d.n, d.h, d.l, d.ev], dt, q.device())?;
    let lse = Tensor::empty_for(name, &[d.n, d.h, d.l], dt, q.device())?;
    if q.device().is_cuda() {
        let views = [qc.runtime_view(), kc.runtime_view(), vc.runtime_view()];
        let dm = device_mask(m.as_ref(), p.mask);
        cuda_attn::attention_forward(&call, views, dm, out.runtime_view(), lse.runtime_view())?;
        return Ok((out, lse));
    }
    let _k = profiler::scope("attention", Category::Extern)
        .shapes(|| shapes(&ins))
        .bytes(|| ins.iter().chain([&&out]).map(|t| nbytes(t)).sum());
    unsafe {
        dispatch_float!(dt, T => {
            let mr = match (&m, p.mask) {
                (Some(m), MaskKind::Bool) => MaskRef::Bool(mask_ref::<u8>(m)),
                (Some(m), MaskKind::Float) => MaskRef::Float(mask_ref::<T>(m)),
                _ => MaskRef::None,
            };
            attn::attention_forward::<T>(&call, data(&qc), data(&kc), data(&vc), &mr,
                out.storage.as_mut_slice::<T>(), lse.storage.as_mut_slice::<T>())
        })
    }
    Ok((out, lse))
}

/// The gradients of query, key and value of the fused attention, from the
/// saved out and logsumexp and the output gradient `g` (one graph node).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    (out, lse, g): (&Tensor, &Tensor, &Tensor),
    p: AttentionParams,
) -> Result<Vec<Tensor>> {
    let mut ins = operands(q, k, v, mask);
    ins.extend([out, lse, g]);
    trace::record_multi(
        || Op::AttentionBackward(p),
        &ins,
        || attention_backward_eager(&ins, p),
    )
}

fn attention_backward_eager(ins: &[&Tensor], p: AttentionParams) -> Result<Vec<Tensor>> {
    let name = "scaled_dot_product_attention_backward";
    let _p = op_scope(name, ins);
    trace::check_launch(name, ins)?;
    let metas: Vec<_> = ins.iter().map(|t| t.meta()).collect();
    Op::AttentionBackward(p).infer(&metas)?;
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    let mask = p.mask.present().then(|| ins[3]);
    let base = 3 + p.mask.present() as usize;
    let call = call_of(q, k, v, mask, p)?;
    let dt = q.dtype();
    let c: Vec<Tensor> = [q, k, v, ins[base], ins[base + 1], ins[base + 2]]
        .iter()
        .map(|t| compute_input(t))
        .collect::<Result<_>>()?;
    let m = readable_mask(mask)?;
    let grads: Vec<Tensor> = [q, k, v]
        .iter()
        .map(|t| Tensor::empty_for(name, t.dims(), dt, q.device()))
        .collect::<Result<_>>()?;
    if q.device().is_cuda() {
        let delta = Tensor::empty_for(name, ins[base + 1].dims(), dt, q.device())?;
        let v3 = |i: usize| c[i].runtime_view();
        let outs = [&grads[0], &grads[1], &grads[2], &delta].map(|t| t.runtime_view());
        let dm = device_mask(m.as_ref(), p.mask);
        cuda_attn::attention_backward(
            &call,
            [v3(0), v3(1), v3(2)],
            dm,
            [v3(3), v3(4), v3(5)],
            outs,
        )?;
        return Ok(grads);
    }
    let _k = profiler::scope("attention_backward", Category::Extern).shapes(|| shapes(ins));
    unsafe {
        dispatch_float!(dt, T => {
            let mr = match (&m, p.mask) {
                (Some(m), MaskKind::Bool) => MaskRef::Bool(mask_ref::<u8>(m)),
                (Some(m), MaskKind::Float) => MaskRef::Float(mask_ref::<T>(m)),
                _ => MaskRef::None,
            };
            attn::attention_backward::<T>(
                &call,
                (data(&c[0]), data(&c[1]), data(&c[2])),
                &mr,
                (data(&c[3]), data(&c[4]), data(&c[5])),
                grads[0].storage.as_mut_slice::<T>(),
                grads[1].storage.as_mut_slice::<T>(),
                grads[2].storage.as_mut_slice::<T>(),
            )
        })
    }
    Ok(grads)
}

/// Runs an `attention` graph node (the compiled plan's extern step).
pub(crate) fn run_attention_node(p: AttentionParams, ins: &[Tensor]) -> Result<Vec<Tensor>> {
    let mask = p.mask.present().then(|| &ins[3]);
    let (o, l) = attention(&ins[0], &ins[1], &ins[2], mask, p)?;
    Ok(vec![o, l])
}

/// Runs an `attention_backward` graph node.
pub(crate) fn run_attention_backward_node(
    p: AttentionParams,
    ins: &[Tensor],
) -> Result<Vec<Tensor>> {
    let base = 3 + p.mask.present() as usize;
    if ins.len() != base + 3 {
        bail!(
            "attention_backward",
            "expected {} inputs, got {}",
            base + 3,
            ins.len()
        );
    }
    let mask = p.mask.present().then(|| &ins[3]);
    attention_backward(
        (&ins[0], &ins[1], &ins[2]),
        mask,
        (&ins[base], &ins[base + 1], &ins[base + 2]),
        p,
    )
}
