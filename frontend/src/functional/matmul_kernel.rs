//! Matrix products on a CUDA device. In f32 and f64 (every float dtype's
//! compute dtype but f16/bf16 operands themselves) one launch of the tiled
//! GEMM template (`kiln_runtime::cuda::gemm`), reading the operands in place
//! through their strides. Otherwise one generated reduction: a sum over `k`
//! of `a[.., m, k] * b[.., k, n]` read through broadcast views (`a` as
//! `[.., m, 1, k]`, `b` transposed as `[.., 1, n, k]`), one block per output
//! element.

use crate::ops::fuse::Lazy;
use crate::ops::kernel::KernelCall;
use crate::Tensor;
use kiln_ir::op::matmul as mm;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result};
use kiln_runtime::cuda::epilogue::EpilogueViews;

/// `ae [.., m, k] @ be [.., k, n]` (batch dims already equal) in `dt`.
pub(super) fn matmul_kernel(ae: &Tensor, be: &Tensor, dt: DType) -> Result<Tensor> {
    let r = ae.rank();
    let c = dt.compute();
    if matches!(c, DType::F32 | DType::F64) && ae.dtype() == c && be.dtype() == c {
        let batch: usize = ae.dims()[..r - 2].iter().product();
        let (m, k, n) = (ae.dims()[r - 2], ae.dims()[r - 1], be.dims()[r - 1]);
        // batch dims merge into one stride unless the views forbid it (then a copy)
        let a = ae.reshape(&[batch as i64, m as i64, k as i64])?;
        let b = be.reshape(&[batch as i64, k as i64, n as i64])?;
        let out = Tensor::empty_on(&[batch, m, n], c, ae.device())?;
        kiln_runtime::cuda::gemm::gemm(
            a.runtime_view(),
            b.runtime_view(),
            out.runtime_view(),
            None,
        )?;
        let mut dims = ae.dims()[..r - 2].to_vec();
        dims.extend([m, n]);
        return out.reshape_dims(&dims)?.to_dtype(dt);
    }
    let mut loop_dims = ae.dims()[..r - 1].to_vec();
    loop_dims.push(be.dims()[r - 1]);
    loop_dims.push(ae.dims()[r - 1]);
    let a = ae.unsqueeze(-2)?.expand_to(&loop_dims)?;
    let b = be.transpose(-1, -2)?.unsqueeze(-3)?.expand_to(&loop_dims)?;
    let mut k = KernelCall::new();
    let x = k.load(&a);
    let y = k.load(&b);
    let p = k.binary(BinaryOp::Mul, x, y, dt.compute());
    k.reduce("matmul", ReduceKind::Sum, p, &loop_dims, dt, |_, acc| {
        vec![acc]
    })
}

/// Builds an epilogue's expression over the product `v` (see
/// [`matmul_with_epilogue_on_device`]); the second argument views a tensor
/// of the product's shape as `v`'s dims.
pub type DeviceEpilogue<'a> =
    dyn Fn(&Tensor, &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<Lazy> + 'a;

/// `a @ b` on a CUDA device with a compiled graph's pointwise epilogue in
/// the same launch (no autograd). `epilogue(v, view)` builds the expression
/// over `v`, which stands for the product as `[B, M, N]`; `view` maps a
/// tensor of the product's shape to those dims. None where the product has
/// no such form in one launch (a 1-D operand, a half dtype): the caller
/// runs the matmul and its epilogue apart.
pub fn matmul_with_epilogue_on_device(
    a: &Tensor,
    b: &Tensor,
    epilogue: &DeviceEpilogue<'_>,
) -> Result<Option<Tensor>> {
    let dt = super::float_dtype("matmul", &[a, b])?;
    if !matches!(dt, DType::F32 | DType::F64) || a.rank() < 2 || b.rank() < 2 {
        return Ok(None);
    }
    let _p = super::op_scope("matmul", &[a, b]);
    let plan = mm::matmul_plan(a.dims(), b.dims())?;
    let batch: usize = plan.batch.iter().product();
    let (m, k, n) = (plan.m, plan.k, plan.n);
    let in3 = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
        let mut d = plan.batch.to_vec();
        d.extend([r, c]);
        t.detach()
            .to_dtype(dt)?
            .expand_to(&d)?
            .reshape(&[batch as i64, r as i64, c as i64])
    };
    let (a3, b3) = (in3(a, m, k)?, in3(b, k, n)?);
    let out = Tensor::empty_on(&[batch, m, n], dt, a.device())?;
    let view = |t: &Tensor| {
        t.expand_to(&plan.out)?
            .reshape(&[batch as i64, m as i64, n as i64])
    };
    let expr = epilogue(&out, &view)?;
    expr.materialize_into_with(&out, |kernel, views, scalars| {
        let e = EpilogueViews {
            kernel,
            views,
            scalars,
        };
        kiln_runtime::cuda::gemm::gemm(
            a3.runtime_view(),
            b3.runtime_view(),
            out.runtime_view(),
            Some(&e),
        )
    })?;
    Ok(Some(out.reshape_dims(&plan.out)?))
}
