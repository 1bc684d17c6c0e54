//! `conv2d_weight_grad`: the weight gradient of a 2-D convolution as one
//! extern kernel (what conv2d's backward rule calls, traced as one node).

use super::{compute_input, data, extern_try_out, float_dtype, op_scope};
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::conv::ConvParams;
use kiln_ir::op::Op;
use kiln_ir::{DType, Result};
use kiln_runtime::externs;

/// The gradient with respect to the weight `[C_out, C_in/groups, kH, kW]`
/// of `conv2d(x, weight, params)`, given the output gradient `grad`
/// (PyTorch's `torch.nn.grad.conv2d_weight`). `x` and `grad` are 4-D.
pub fn conv2d_weight_grad(
    x: &Tensor,
    grad: &Tensor,
    params: &ConvParams,
    kernel: [usize; 2],
) -> Result<Tensor> {
    let op = || Op::Conv2dWeightGrad {
        params: params.clone(),
        kernel,
    };
    trace::record(op, &[x, grad], || {
        let _p = op_scope("conv2d_weight_grad", &[x, grad]);
        trace::check_launch("conv2d_weight_grad", &[x, grad])?;
        let dt = float_dtype("conv2d_weight_grad", &[x, grad])?;
        let meta = op().infer(&[x.meta(), grad.meta()])?.remove(0);
        let g = kiln_ir::op::conv::conv_geometry(
            "conv2d_weight_grad",
            x.dims(),
            &meta.dims,
            None,
            params,
        )?;
        let (xc, gc) = (compute_input(x)?, compute_input(grad)?);
        if xc.device().is_cuda() || gc.device().is_cuda() {
            let gw = super::conv_kernel::conv_weight_grad_kernel(&g, &xc, &gc, dt.compute())?;
            let dims: Vec<i64> = meta.dims.iter().map(|&d| d as i64).collect();
            return gw.reshape(&dims)?.to_dtype(dt);
        }
        extern_try_out(
            "conv2d_weight_grad",
            &[&xc, &gc],
            &meta.dims,
            dt,
            |out| unsafe {
                dispatch_float!(dt, T => externs::conv_grad::conv2d_weight_grad::<T>(
                    &g, data(&xc), data(&gc), out.storage.as_mut_slice::<T>(),
                ))
            },
        )
    })
}
