//! Matrix products on a CUDA device as one generated kernel: a sum over `k`
//! of `a[.., m, k] * b[.., k, n]`, read in place through broadcast views
//! (`a` as `[.., m, 1, k]`, `b` transposed as `[.., 1, n, k]`), so the CUDA C
//! emitter and every backend that runs reductions run it. One block per
//! output element, its threads splitting `k`; no tiling yet (cuBLAS would be
//! the fast path on a real GPU).

use crate::ops::kernel::KernelCall;
use crate::Tensor;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result};

/// `ae [.., m, k] @ be [.., k, n]` (batch dims already equal) in `dt`.
pub(super) fn matmul_kernel(ae: &Tensor, be: &Tensor, dt: DType) -> Result<Tensor> {
    let r = ae.rank();
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
