//! `matmul`, `bmm` and `linear`: the CPU's strided GEMM (or a device's
//! generated one), with two things a Linear layer's shapes need.
//!
//! - A right operand shared by the whole batch (`[B, S, K] @ w^T`) is one
//!   GEMM of `B*S` rows when the left operand's rows are evenly strided,
//!   not `B` products that each pack (and transpose) the weight again.
//! - A Linear's `w^T` is stored transposed, which the GEMM copies row-major
//!   first (`externs::gemm::row_major_copy`); a parameter's copy is kept
//!   per version once the version is used twice (inference), so training,
//!   which uses each version once, keeps none.

use super::*;
use crate::ops::fuse::Lazy;
use std::sync::Arc;

/// `torch.matmul` for every rank combination; strided operands (transposes,
/// broadcast batches) are read in place through their strides.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some((a, b)) = amp::cast_for(Policy::Lower, (a, b))? {
        return matmul(&a, &b);
    }
    trace::record(|| Op::Matmul, &[a, b], || matmul_eager(a, b, b, None))
}

/// `a @ b` where `b` views the tensor `owner` (a Linear's `weight.t()`):
/// `owner` says whether `b`'s row-major copy may be kept per version. With
/// `bias` (`n` elements of `b`'s dtype, CPU only, no gradient: see
/// [`linear`]), every output row starts from it.
fn matmul_eager(a: &Tensor, b: &Tensor, owner: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let _p = op_scope("matmul", &[a, b]);
    trace::check_launch("matmul", &[a, b])?;
    let dt = float_dtype("matmul", &[a, b])?;
    let plan = mm::matmul_plan(a.dims(), b.dims())?;
    let (a0, b0) = (a, b);
    let (a, b) = (
        a.detach().to_dtype(dt.compute())?,
        b.detach().to_dtype(dt.compute())?,
    );
    let a2 = if plan.a_vec { a.unsqueeze(0)? } else { a };
    let b2 = if plan.b_vec { b.unsqueeze(-1)? } else { b };
    let bl = plan.batch.len();
    let expand = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
        let mut d: Vec<usize> = plan.batch.to_vec();
        d.extend([r, c]);
        t.expand_to(&d)
    };
    let (ae, be) = (expand(&a2, plan.m, plan.k)?, expand(&b2, plan.k, plan.n)?);
    let mut full: Vec<usize> = plan.batch.to_vec();
    full.extend([plan.m, plan.n]);
    if ae.device().is_cuda() || be.device().is_cuda() {
        let out = matmul_kernel::matmul_kernel(&ae, &be, dt)?;
        return rules::matmul(a0, b0, out.reshape_dims(&plan.out)?);
    }
    let offsets = |t: &Tensor| -> Vec<usize> {
        let s: Vec<usize> = t.strides()[..bl].iter().map(|&x| x as usize).collect();
        externs::gemm::batch_offsets(&plan.batch, &s)
            .into_iter()
            .map(|o| o + t.offset())
            .collect()
    };
    let (ars, acs) = (ae.strides()[bl], ae.strides()[bl + 1]);
    let (brs, bcs) = (be.strides()[bl], be.strides()[bl + 1]);
    // the output is contiguous [batch.., m, n]: folded, [batch*m, n]
    let (m, ao, bo) = match folded_rows(&ae, &be, &plan.batch, plan.m) {
        Some(rows) => (rows, vec![ae.offset()], vec![be.offset()]),
        None => (plan.m, offsets(&ae), offsets(&be)),
    };
    let copy = kept_row_major(
        &be,
        owner,
        dt,
        (m, plan.k, plan.n),
        (acs, brs, bcs),
        bo.len(),
    );
    let bias = bias
        .map(|b| b.detach().to_dtype(dt.compute())?.contiguous())
        .transpose()?;
    // every element is written (the bias, or the product alone): no zeroing
    let out = Tensor::empty_for("matmul", &full, dt.compute(), kiln_runtime::Device::Cpu)?;
    let out = extern_fill("matmul", &[&a2, &b2], out, dt, |out| unsafe {
        match &copy {
            Some(c) => externs::gemm::batched_matmul_offsets::<f32>(
                m,
                plan.k,
                plan.n,
                ae.storage.as_slice::<f32>(),
                &ao,
                ars,
                acs,
                c,
                &vec![0; bo.len()],
                plan.n as isize,
                1,
                out.storage.as_mut_slice::<f32>(),
                bias.as_ref()
                    .map(|b| &b.storage.as_slice::<f32>()[b.offset()..][..plan.n]),
            ),
            None => dispatch_float!(dt, T => externs::gemm::batched_matmul_offsets::<T>(
                m, plan.k, plan.n,
                ae.storage.as_slice::<T>(), &ao, ars, acs,
                be.storage.as_slice::<T>(), &bo, brs, bcs,
                out.storage.as_mut_slice::<T>(),
                bias.as_ref().map(|b| &b.storage.as_slice::<T>()[b.offset()..][..plan.n]),
            )),
        }
        Ok(())
    })?;
    rules::matmul(a0, b0, out.reshape_dims(&plan.out)?)
}

/// The rows of one GEMM doing the whole batched product, when every batch
/// item shares `b` (its batch strides are 0) and `a`'s batch and row dims
/// walk its rows at one stride: `[B, S, K] @ [K, N]` is `[B*S, K] @ [K, N]`.
fn folded_rows(a: &Tensor, b: &Tensor, batch: &[usize], m: usize) -> Option<usize> {
    let bl = batch.len();
    if bl == 0
        || b.strides()[..bl]
            .iter()
            .zip(batch)
            .any(|(&s, &d)| s != 0 && d != 1)
    {
        return None;
    }
    let row = a.strides()[bl];
    let mut rows = m;
    for (&s, &d) in a.strides()[..bl].iter().zip(batch).rev() {
        if d != 1 && s != row * rows as isize {
            return None;
        }
        rows *= d;
    }
    Some(rows)
}

/// The row-major copy of `b` (`k x n`, strides `(rs, cs)`, stored
/// transposed) kept for this version of `owner` (a parameter's, or a
/// compiled graph's stable hoisted value), when `b` is f32 in `owner`'s
/// storage and big enough for the copy to pay; None on the first use of a
/// version (the GEMM transposes into scratch for that call). Only `b`s
/// shared by the whole batch (`batch` offsets all one) are kept, and none
/// for an `m`-row product the skinny dot products take (`a`'s column stride
/// `a_cs`): they read `b` as stored, and a copy would change the summation
/// order, so a small batch would differ from the same batch without it.
fn kept_row_major(
    b: &Tensor,
    owner: &Tensor,
    dt: DType,
    (m, k, n): (usize, usize, usize),
    (a_cs, rs, cs): (isize, isize, isize),
    batch: usize,
) -> Option<Arc<Vec<f32>>> {
    let shared = batch == 1 || b.strides()[..b.dims().len() - 2].iter().all(|&s| s == 0);
    let keyed = owner.requires_grad() && owner.is_leaf() || externs::packed::is_stable(&b.storage);
    if dt.compute() != DType::F32
        || !shared
        || !keyed
        || !Arc::ptr_eq(&b.storage, &owner.storage)
        || !externs::gemm::wants_row_major_copy(k, n, rs, cs)
        || externs::gemm::skinny_takes(m, a_cs)
    {
        return None;
    }
    // the view's shape and column stride: another view of the same elements
    // with other strides is another copy
    let view = [k, n, cs as usize];
    let key = externs::packed::WeightKey {
        storage: &b.storage,
        offset: b.offset(),
        dims: &view,
        version: owner.version(),
    };
    externs::packed::packed_on_reuse(key, "gemm-rhs-row-major", || {
        // SAFETY: `b` is an f32 view of its storage (dt checked above)
        let data = unsafe { b.storage.as_slice::<f32>() };
        externs::gemm::row_major_copy(&data[b.offset()..], k, n, cs as usize)
    })
}

/// `torch.bmm`: (B, M, K) @ (B, K, N), no broadcasting; traced as `matmul`.
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    mm::bmm_shape(a.dims(), b.dims())?;
    matmul(a, b)
}

/// `F.linear(x, weight, bias)`: x @ weight^T + bias, any leading dims.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::Lower, (x, weight, bias))? {
        return linear(&x, &w, b.as_ref());
    }
    trace::record(
        || Op::Linear,
        &ins(&[Some(x), Some(weight), bias]),
        || {
            let _p = op_scope("linear", &[x, weight]);
            // with a gradient to record, the primitives (transpose, matmul,
            // add) record graph nodes while tracing: their backward rules save
            // `weight.t()`, which must be a graph value of a joint trace
            let inline = crate::autograd::needs_grad(&ins(&[Some(x), Some(weight), bias]))
                .then(trace::inline_decomposition);
            let shape = mm::linear_shape(x.dims(), weight.dims(), bias.map(|b| b.dims()))?;
            if let (Some(b), None) = (bias, inline.as_ref()) {
                if x.device().is_cuda() && !trace::is_tracing() {
                    // inference on a device: the bias is added by the GEMM's one launch
                    let add_bias = |v: &Tensor, view: &dyn Fn(&Tensor) -> Result<Tensor>| {
                        use kiln_passes::decompose::Builder;
                        crate::ops::fuse::Fuser.binary(
                            kiln_ir::BinaryOp::Add,
                            &Lazy::tensor(v),
                            &Lazy::tensor(&view(b)?),
                        )
                    };
                    let w = weight.detach().t()?;
                    if let Some(y) = matmul_with_epilogue_on_device(&x.detach(), &w, &add_bias)? {
                        return y.reshape_dims(&shape);
                    }
                }
            }
            let wt = weight.t()?;
            // without a gradient the GEMM starts from the bias (PyTorch's
            // addmm): no second output beside the product, no second pass
            let into_gemm = bias.filter(|b| {
                inline.is_none()
                    && !crate::autograd::needs_grad(&ins(&[Some(x), Some(weight), bias]))
                    && !x.device().is_cuda()
                    && weight.dims().len() == 2
                    && b.dims() == &weight.dims()[..1]
                    && b.dtype() == x.dtype()
                    && b.dtype() == weight.dtype()
            });
            let y = trace::record(
                || Op::Matmul,
                &[x, &wt],
                || matmul_eager(x, &wt, weight, into_gemm),
            )?;
            let y = match bias {
                Some(b) if into_gemm.is_none() => y.add(b)?,
                _ => y,
            };
            y.reshape_dims(&shape)
        },
    )
}
