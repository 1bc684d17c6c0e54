//! 2-D pooling: max (values and PyTorch's flat indices), average and the
//! adaptive variants, traced as graph nodes and run by the CPU externs or
//! the device kernels (`pool_kernel.rs`).

use super::*;

fn pool_with_indices(
    op: &'static str,
    x: &Tensor,
    g: &Pool2dGeometry,
    run: &dyn Fn(&Pool2dGeometry, &Tensor, &Tensor, &Tensor, DType),
) -> Result<(Tensor, Tensor)> {
    let _p = op_scope(op, &[x]);
    trace::check_launch(op, &[x])?;
    let dt = float_dtype(op, &[x])?;
    let xc = compute_input(x)?;
    if x.device().is_cuda() {
        let adaptive = op == "adaptive_max_pool2d";
        let (y, idx) = pool_kernel::max_pool_kernel(g, adaptive, &xc)?;
        let (y, idx) = (
            y.reshape_dims(&g.out_shape())?,
            idx.reshape_dims(&g.out_shape())?,
        );
        return Ok((rules::max_pool(op, *g, x, &idx, y.to_dtype(dt)?)?, idx));
    }
    // every index is written by the kernel: no zero fill
    let idx = Tensor::empty_for(op, &g.out_shape(), DType::I64, x.device())?;
    let out = extern_out(op, &[&xc], &g.out_shape(), dt, |out| {
        run(g, &xc, out, &idx, dt)
    })?;
    Ok((rules::max_pool(op, *g, x, &idx, out)?, idx))
}

/// `F.max_pool2d(..., return_indices=True)`: values and flat h*W+w indices.
pub fn max_pool2d(x: &Tensor, p: &Pool2dParams) -> Result<(Tensor, Tensor)> {
    pair(trace::record_multi(
        || Op::MaxPool2d(*p),
        &[x],
        || {
            let g = pool::pool2d_geometry("max_pool2d", x.dims(), p)?;
            unpair(pool_with_indices(
                "max_pool2d",
                x,
                &g,
                &|g, xc: &Tensor, out: &Tensor, idx: &Tensor, dt| unsafe {
                    dispatch_float!(dt, T => externs::pool::max_pool2d::<T>(g, data(xc), out.storage.as_mut_slice::<T>(), Some(idx.storage.as_mut_slice::<i64>())))
                },
            ))
        },
    ))
}

/// `F.max_pool2d` without `return_indices`: the values. On the CPU, outside
/// a trace and with no backward to feed, no indices are computed (the
/// separable values-only kernel runs); otherwise this is
/// `max_pool2d(x, p).0`.
///
/// ```
/// use kiln_frontend::{functional as F, nn::Pool2dParams, Tensor};
/// let x = Tensor::from_vec(vec![1.0, 5.0, 3.0, 2.0], &[1, 1, 2, 2]).unwrap();
/// let y = F::max_pool2d_values(&x, &Pool2dParams::new([2, 2])).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![5.0]);
/// ```
pub fn max_pool2d_values(x: &Tensor, p: &Pool2dParams) -> Result<Tensor> {
    // a trace or a guard's replay must see the graph op itself
    let needs_indices = trace::is_tracing()
        || trace::probe::replaying()
        || x.device().is_cuda()
        || (crate::autograd::is_grad_enabled() && x.requires_grad());
    if needs_indices {
        return Ok(max_pool2d(x, p)?.0);
    }
    let op = "max_pool2d";
    let g = pool::pool2d_geometry(op, x.dims(), p)?;
    let _p = op_scope(op, &[x]);
    trace::check_launch(op, &[x])?;
    let dt = float_dtype(op, &[x])?;
    let xc = compute_input(x)?;
    extern_out(op, &[&xc], &g.out_shape(), dt, |out| unsafe {
        dispatch_float!(dt, T => externs::pool::max_pool2d_values::<T>(&g, data(&xc), out.storage.as_mut_slice::<T>()))
    })
}

/// The (values, indices) of a two-result op.
fn pair(r: Result<Vec<Tensor>>) -> Result<(Tensor, Tensor)> {
    let mut v = r?.into_iter();
    match (v.next(), v.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => bail!("compile", "a two-result op gave fewer results"),
    }
}

fn unpair(r: Result<(Tensor, Tensor)>) -> Result<Vec<Tensor>> {
    r.map(|(a, b)| vec![a, b])
}

/// `F.adaptive_max_pool2d(..., return_indices=True)`.
pub fn adaptive_max_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<(Tensor, Tensor)> {
    let node = || Op::AdaptiveMaxPool2d(output_size);
    pair(trace::record_multi(node, &[x], || {
        let g = pool::adaptive_pool2d_geometry("adaptive_max_pool2d", x.dims(), output_size)?;
        unpair(pool_with_indices(
            "adaptive_max_pool2d",
            x,
            &g,
            &|g, xc: &Tensor, out: &Tensor, idx: &Tensor, dt| unsafe {
                dispatch_float!(dt, T => externs::pool::adaptive_max_pool2d::<T>(g, data(xc), out.storage.as_mut_slice::<T>(), Some(idx.storage.as_mut_slice::<i64>())))
            },
        ))
    }))
}

/// `F.avg_pool2d` (count_include_pad, ceil_mode, divisor_override).
pub fn avg_pool2d(
    x: &Tensor,
    p: &Pool2dParams,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    if let (Some(d), true) = (divisor_override, trace::is_recording()) {
        // the graph op has no divisor: trace the padded average rescaled
        return super::pool_nd::avg_pool2d_divisor(x, p, d);
    }
    let node = || Op::AvgPool2d {
        params: *p,
        count_include_pad,
    };
    trace::record(node, &[x], || {
        avg_pool2d_eager(x, p, count_include_pad, divisor_override)
    })
}

fn avg_pool2d_eager(
    x: &Tensor,
    p: &Pool2dParams,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    let _p = op_scope("avg_pool2d", &[x]);
    trace::check_launch("avg_pool2d", &[x])?;
    let dt = float_dtype("avg_pool2d", &[x])?;
    pool::check_divisor_override("avg_pool2d", divisor_override)?;
    let g = pool::pool2d_geometry("avg_pool2d", x.dims(), p)?;
    let xc = compute_input(x)?;
    if x.device().is_cuda() {
        let y = pool_kernel::avg_pool_kernel(&g, false, count_include_pad, divisor_override, &xc)?;
        let y = y.reshape_dims(&g.out_shape())?.to_dtype(dt)?;
        return rules::avg_pool(
            "avg_pool2d",
            g,
            false,
            count_include_pad,
            divisor_override,
            x,
            y,
        );
    }
    let y = extern_out("avg_pool2d", &[&xc], &g.out_shape(), dt, |out| unsafe {
        dispatch_float!(dt, T => externs::pool::avg_pool2d::<T>(&g, data(&xc), out.storage.as_mut_slice::<T>(), count_include_pad, divisor_override))
    })?;
    rules::avg_pool(
        "avg_pool2d",
        g,
        false,
        count_include_pad,
        divisor_override,
        x,
        y,
    )
}

/// `F.adaptive_avg_pool2d`.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    let node = || Op::AdaptiveAvgPool2d(output_size);
    trace::record(node, &[x], || adaptive_avg_pool2d_eager(x, output_size))
}

fn adaptive_avg_pool2d_eager(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    let _p = op_scope("adaptive_avg_pool2d", &[x]);
    trace::check_launch("adaptive_avg_pool2d", &[x])?;
    let dt = float_dtype("adaptive_avg_pool2d", &[x])?;
    let g = pool::adaptive_pool2d_geometry("adaptive_avg_pool2d", x.dims(), output_size)?;
    let xc = compute_input(x)?;
    if x.device().is_cuda() {
        let y = pool_kernel::avg_pool_kernel(&g, true, false, None, &xc)?;
        let y = y.reshape_dims(&g.out_shape())?.to_dtype(dt)?;
        return rules::avg_pool("adaptive_avg_pool2d", g, true, false, None, x, y);
    }
    let y = extern_out(
        "adaptive_avg_pool2d",
        &[&xc],
        &g.out_shape(),
        dt,
        |out| unsafe {
            dispatch_float!(dt, T => externs::pool::adaptive_avg_pool2d::<T>(&g, data(&xc), out.storage.as_mut_slice::<T>()))
        },
    )?;
    rules::avg_pool("adaptive_avg_pool2d", g, true, false, None, x, y)
}
