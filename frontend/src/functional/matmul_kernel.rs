//! Matrix products on a CUDA device. In f32 and f64 (every float dtype's
//! compute dtype but f16/bf16 operands themselves) one launch of the tiled
//! GEMM template (`kiln_runtime::cuda::gemm`), reading the operands in place
//! through their strides. Otherwise one generated reduction: a sum over `k`
//! of `a[.., m, k] * b[.., k, n]` read through broadcast views (`a` as
//! `[.., m, 1, k]`, `b` transposed as `[.., 1, n, k]`), one block per output
//! element.

use crate::ops::kernel::KernelCall;
use crate::Tensor;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result};

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
        kiln_runtime::cuda::gemm::gemm(a.view(), b.view(), out.view())?;
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
