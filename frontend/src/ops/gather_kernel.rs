//! Indexing ops on a CUDA device. `gather` is one generated reduction: for
//! each output position, the sum over `j` of `index == j ? x[.., j, ..] : 0`
//! along the indexed dim, with `x` and `index` read in place through
//! broadcast views and `j` from an `arange`. It reads the indexed dim whole
//! for every output, which is what a class dimension (cross-entropy's
//! gather) costs anyway. Its backward, `scatter_add`, is the same reduction
//! turned round. `index_select` (and `embedding`) pick whole rows, so they
//! use the take kernel instead, which reads each element once.

use crate::ops::kernel::KernelCall;
use crate::ops::pointwise::copy_into;
use crate::Tensor;
use kiln_ir::op::Layout;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result};

/// `x.gather(d, index)` (index i64, same rank, checked by the caller) on `x`'s device.
pub(crate) fn gather_kernel(x: &Tensor, d: usize, index: &Tensor) -> Result<Tensor> {
    check_bounds("gather", index, d, x.dims(), "input shape")?;
    pick_along("gather", x, d, index)
}

/// `x.index_select(d, index)` (index a 1-D integer tensor, on any device)
/// on `x`'s device as one launch of the take kernel, after the bounds check.
pub(crate) fn index_select_kernel(x: &Tensor, d: usize, index: &Tensor) -> Result<Tensor> {
    let idx = index
        .to_dtype(DType::I64)?
        .to_device(x.device())?
        .contiguous()?;
    check_bounds("index_select", &idx, d, x.dims(), "shape")?;
    take_rows(x, d, &idx)
}

/// The rows `idx` (i64, contiguous, in range) of `x` along dim `d`, as one
/// launch of the take kernel (`kiln_runtime::cuda::take`): each output
/// element read once, where a generated kernel would scan the whole dim.
pub(crate) fn take_rows(x: &Tensor, d: usize, idx: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (outer, inner): (usize, usize) =
        (dims[..d].iter().product(), dims[d + 1..].iter().product());
    let k = idx.numel();
    // the dims before and after d merge into one stride each unless the view forbids it
    let x3 = x.reshape(&[outer as i64, dims[d] as i64, inner as i64])?;
    let out = Tensor::empty_on(&[outer, k, inner], x.dtype(), x.device())?;
    let flat = idx.reshape(&[k as i64])?;
    kiln_runtime::cuda::take::take(x3.runtime_view(), flat.runtime_view(), out.runtime_view())?;
    let mut od = dims.to_vec();
    od[d] = k;
    out.reshape_dims(&od)
}

/// The rows `idx` (in range, checked by the caller) of the host tensor `x`
/// along dim `d`, copied on the host in one pass: `x` as `[outer, n, inner]`
/// (contiguous), each picked row a run of `inner` elements. One launch per
/// index would cost a kernel call per row, and the traced backward of a
/// narrow gathers a whole tensor one element per row (786432 rows for one
/// of GPT-2's q/k/v slices): that made a compiled GPT-2 step 9x slower than
/// eager.
pub(crate) fn take_rows_host(x: &Tensor, d: usize, idx: &[i64]) -> Result<Tensor> {
    let dims = x.dims();
    let (outer, inner): (usize, usize) =
        (dims[..d].iter().product(), dims[d + 1..].iter().product());
    let (n, k) = (dims[d], idx.len());
    let mut od = dims.to_vec();
    od[d] = k;
    let out = Tensor::empty_on(&od, x.dtype(), x.device())?;
    let _p =
        kiln_runtime::profiler::scope("index_select", kiln_runtime::profiler::Category::Kernel)
            .bytes(|| 2 * (out.numel() * x.dtype().size()) as u64);
    if out.numel() == 0 {
        return Ok(out);
    }
    let xc = x.contiguous()?;
    let es = x.dtype().size();
    let row = inner * es;
    // SAFETY: `xc` is contiguous with `outer * n * inner` elements from its
    // offset, `out` is fresh with `outer * k * inner`, every index is in
    // `0..n` (checked by the caller), and the two storages are distinct.
    unsafe {
        let src = xc.storage.ptr().add(xc.offset() * es) as *const u8;
        let dst = out.storage.ptr();
        for o in 0..outer {
            let (s0, d0) = (src.add(o * n * row), dst.add(o * k * row));
            for (j, &i) in idx.iter().enumerate() {
                std::ptr::copy_nonoverlapping(s0.add(i as usize * row), d0.add(j * row), row);
            }
        }
    }
    Ok(out)
}

/// The host paths' out-of-range error for any element of `index` outside
/// `0..n`, `n` the size of dim `d` of `dims` (a min and a max, read back):
/// negative indices do not wrap, as in PyTorch.
fn check_bounds(op: &str, index: &Tensor, d: usize, dims: &[usize], shape: &str) -> Result<()> {
    let n = dims[d] as i64;
    if index.numel() == 0 {
        return Ok(());
    }
    let lo = index.amin(None, false)?.item()? as i64;
    let hi = index.amax(None, false)?.item()? as i64;
    if lo < 0 || hi >= n {
        let bad = if lo < 0 { lo } else { hi };
        if op == "gather" {
            bail!(
                op,
                "index {bad} is out of bounds for dimension {d} with size {n} ({shape} {})",
                fmt_dims(dims)
            );
        }
        bail!(
            op,
            "index {bad} is out of range for dim {d} of size {n} ({shape} {})",
            fmt_dims(dims)
        );
    }
    Ok(())
}

/// `out[p] = x[p with dim d replaced by index[p]]` over `index`'s dims, as
/// one reduction named `name`; indices are in range, negative ones wrap.
fn pick_along(name: &str, x: &Tensor, d: usize, index: &Tensor) -> Result<Tensor> {
    let n = x.dims()[d];
    let mut loop_dims = index.dims().to_vec();
    loop_dims.push(n);
    // x over [index dims.., j]: its own strides, dim d broadcast, j along dim d
    let mut xs: Vec<isize> = x.strides().to_vec();
    xs[d] = 0;
    xs.push(x.strides()[d]);
    let xv = x.with_layout(Layout {
        dims: loop_dims.iter().copied().collect(),
        strides: xs.into_iter().collect(),
        offset: x.offset(),
    });
    let iv = index.unsqueeze(-1)?.expand_to(&loop_dims)?;
    let j = Tensor::arange(n, DType::I64).to_device(x.device())?;
    let dt = x.dtype();
    let mut k = KernelCall::new();
    let v = where_index_is(&mut k, (&xv, dt), &iv, &j, n);
    k.reduce(name, ReduceKind::Sum, v, &loop_dims, dt, |_, acc| vec![acc])
}

/// `index == at (or at - n, a negative index counting from the end) ? x : 0`
/// in `x`'s compute dtype, all three read through their views.
fn where_index_is(
    k: &mut KernelCall,
    (x, dt): (&Tensor, DType),
    index: &Tensor,
    at: &Tensor,
    n: usize,
) -> kiln_codegen::ValueId {
    let xval = k.input(x, dt.compute());
    let ival = k.input(index, DType::I64);
    let aval = k.input(at, DType::I64);
    let hit = k.binary(BinaryOp::Eq, ival, aval, DType::I64);
    let nv = k.scalar(n as f64, DType::I64);
    let aneg = k.binary(BinaryOp::Sub, aval, nv, DType::I64);
    let hit_neg = k.binary(BinaryOp::Eq, ival, aneg, DType::I64);
    let hit = k.binary(BinaryOp::Or, hit, hit_neg, DType::Bool);
    let zero = k.scalar(0.0, dt.compute());
    k.select(hit, xval, zero, dt.compute())
}

/// `zeros(dims).scatter_add(d, index, src)` (index i64 of `src`'s shape, in
/// range; `src` no larger than `dims` off `d`) on `src`'s device, as one
/// reduction: each output position sums, over `j` along `d`, `src` where
/// `index == position`. It reads `src`'s dim `d` whole for every output
/// position (`dims[d] * src.dims()[d]` per line: an embedding gradient costs
/// vocabulary x tokens x width) but is deterministic and needs no atomics.
pub(crate) fn scatter_add_kernel(
    dims: &[usize],
    d: usize,
    index: &Tensor,
    src: &Tensor,
) -> Result<Tensor> {
    let (sd, n) = (src.dims().to_vec(), dims[d]);
    let mut kept = sd.clone();
    kept[d] = n;
    let mut loop_dims = kept.clone();
    loop_dims.push(sd[d]);
    // src and index over [kept.., j]: dim d broadcast, j along their dim d
    let along = |t: &Tensor| {
        let mut st: Vec<isize> = t.strides().to_vec();
        let sj = st[d];
        st[d] = 0;
        st.push(sj);
        t.with_layout(Layout {
            dims: loop_dims.iter().copied().collect(),
            strides: st.into_iter().collect(),
            offset: t.offset(),
        })
    };
    let (sv, iv) = (along(src), along(&index.expand_to(&sd)?));
    let mut at = vec![1usize; loop_dims.len()];
    at[d] = n;
    let pos = Tensor::arange(n, DType::I64)
        .reshape_dims(&at)?
        .to_device(src.device())?;
    let dt = src.dtype();
    let mut k = KernelCall::new();
    let v = where_index_is(&mut k, (&sv, dt), &iv, &pos, n);
    let out = k.reduce(
        "scatter_add",
        ReduceKind::Sum,
        v,
        &loop_dims,
        dt,
        |_, acc| vec![acc],
    )?;
    if kept == dims {
        return Ok(out);
    }
    let full = Tensor::zeros_on(dims, dt, src.device())?;
    let mut region = full.clone();
    for (k, &e) in kept.iter().enumerate() {
        region = region.narrow(k as i64, 0, e)?;
    }
    copy_into(&out, &region)?;
    Ok(full)
}
