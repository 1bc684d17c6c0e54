//! `quantized_linear`: a dynamically quantized Linear as one op
//! ([`Op::QuantizedLinear`]), so that a quantized model traces into one
//! graph: the kernel reads its input's range itself instead of the host.

use super::{data, extern_try_out, op_scope};
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::{bail, Result};
use kiln_runtime::externs::packed::WeightKey;
use kiln_runtime::externs::qgemm::{self, Isa, QLinearCall};

/// A tile epilogue: called with the output and a row range `(row0, rows)`
/// of its `[m, n]` flattening once the kernel has written those rows.
pub type RowTileEpilogue<'a> = &'a (dyn Fn(&Tensor, usize, usize) -> Result<()> + Sync);

/// `torch.ops.quantized.linear_dynamic` (fbgemm): `x` (f32 `[..., in]`)
/// quantized per call to uint8 over its whole range (`reduce_range`), times
/// the int8 `weight` (`[out, in]`, symmetric, packed once per version),
/// accumulated in int32, scaled back with `weight_scale` (`[1]` or `[out]`)
/// and the input's scale, plus `bias`, then ReLU when `relu`. Records one
/// graph node while tracing. CPU only; no gradient.
///
/// ```
/// use kiln_frontend::{functional as F, DType, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap();
/// let w = Tensor::from_vec(vec![64i8, -32, 127, 0], &[2, 2]).unwrap();
/// let s = Tensor::from_vec(vec![1.0f32 / 127.0], &[1]).unwrap();
/// let y = F::quantized_linear(&x, &w, &s, None, true).unwrap();
/// assert_eq!(y.dims(), &[1, 2]);
/// assert!(y.to_vec::<f32>().unwrap()[1] > 0.99);
/// let bad = Tensor::ones(&[1, 3], DType::F32);
/// let e = F::quantized_linear(&bad, &w, &s, None, false).unwrap_err().to_string();
/// assert!(e.contains("quantized_linear") && e.contains("[1,3]"), "{e}");
/// ```
pub fn quantized_linear(
    x: &Tensor,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
) -> Result<Tensor> {
    let mut ins = vec![x, weight, weight_scale];
    ins.extend(bias);
    trace::record(
        || Op::QuantizedLinear { relu },
        &ins,
        || quantized_linear_with(x, weight, weight_scale, bias, relu, Isa::detect(), None),
    )
}

/// [`quantized_linear`] without recording, with an explicit kernel choice
/// and an optional epilogue applied to each output tile of
/// [`qgemm::TILE_ROWS`] rows while it is in cache (how a compiled graph runs
/// a following pointwise chain).
pub fn quantized_linear_with(
    x: &Tensor,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
    isa: Isa,
    epilogue: Option<RowTileEpilogue>,
) -> Result<Tensor> {
    let op = "quantized_linear";
    let mut ins = vec![x, weight, weight_scale];
    ins.extend(bias);
    let _p = op_scope(op, &ins);
    let metas: Vec<_> = ins.iter().map(|t| t.meta()).collect();
    let out_meta = Op::QuantizedLinear { relu }.infer(&metas)?.remove(0);
    if let Some(t) = ins.iter().find(|t| t.device().is_cuda()) {
        bail!(
            op,
            "not supported on {}: the int8 kernels run on the CPU (input {}, weight {}); \
             run the quantized model on the CPU",
            t.device(),
            kiln_ir::shape::fmt_dims(x.dims()),
            kiln_ir::shape::fmt_dims(weight.dims())
        );
    }
    trace::check_launch(op, &ins)?;
    let (n, k) = (weight.dims()[0], weight.dims()[1]);
    let xc = x.detach().contiguous()?;
    // SAFETY: `xc` is a contiguous f32 tensor (checked by the inference above).
    let xs = unsafe { data::<f32>(&xc) };
    if let Some(i) = xs.iter().position(|v| !v.is_finite()) {
        bail!(
            op,
            "input {} element {i} is {}: a non-finite value has no quantized form",
            kiln_ir::shape::fmt_dims(x.dims()),
            xs[i]
        );
    }
    let scales = weight_scale.detach().to_vec::<f32>()?;
    if let Some(i) = scales.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
        bail!(
            op,
            "weight_scale[{i}] is {} (scales must be finite and positive)",
            scales[i]
        );
    }
    let b = bias.map(|b| b.detach().to_vec::<f32>()).transpose()?;
    let wc = weight.detach().contiguous()?;
    // a view of the weight's own storage is known by it and its version;
    // a copy made just now has nothing to be remembered by
    let key = weight.shares_storage(&wc).then(|| WeightKey {
        storage: &wc.storage,
        offset: wc.offset(),
        dims: wc.dims(),
        version: wc.version(),
    });
    // SAFETY: `wc` is a contiguous i8 tensor of n * k elements.
    let packed = qgemm::packed_weights(key, unsafe { data::<i8>(&wc) }, n, k);
    let m: usize = x.dims()[..x.rank() - 1].iter().product();
    let call = QLinearCall {
        packed: &packed,
        w_scale: &scales,
        bias: b.as_deref(),
        relu,
        isa,
    };
    let failed = std::sync::Mutex::new(None);
    extern_try_out(op, &ins, &out_meta.dims, out_meta.dtype, |out| {
        let tile = |r0: usize, rows: usize| {
            if let Some(Err(e)) = epilogue.map(|f| f(out, r0, rows)) {
                let mut slot = failed.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(e);
            }
        };
        // SAFETY: `out` is a fresh contiguous f32 [m, n] tensor only this call writes.
        let dst = unsafe { &mut out.storage.as_mut_slice::<f32>()[..m * n] };
        qgemm::qlinear_into(xs, m, &call, dst, Some(&tile));
        match failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}
