//! Inference for [`Op::QuantizedLinear`]: a dynamically quantized Linear's
//! operands are checked here once, for the eager call, the tracer and the
//! verifier alike.

use super::infer::Meta;
use crate::shape::fmt_dims;
use crate::{bail, DType, Result};

/// The result type of `quantized_linear(x, weight, weight_scale[, bias])`:
/// x f32 `[..., in]`, weight i8 `[out, in]`, weight_scale f32 `[1]` (per
/// tensor) or `[out]` (per channel), bias f32 `[out]`; the result is f32
/// `[..., out]`.
///
/// ```
/// use kiln_ir::op::quantized::quantized_linear_meta;
/// use kiln_ir::op::Meta;
/// use kiln_ir::DType;
/// let ins = [Meta::new(DType::F32, &[5, 8]), Meta::new(DType::I8, &[3, 8]), Meta::new(DType::F32, &[1])];
/// assert_eq!(quantized_linear_meta(&ins).unwrap(), Meta::new(DType::F32, &[5, 3]));
/// let bad = [Meta::new(DType::F32, &[5, 7]), ins[1].clone(), ins[2].clone()];
/// assert!(quantized_linear_meta(&bad).unwrap_err().to_string().contains("[5,7]"));
/// ```
pub fn quantized_linear_meta(ins: &[Meta]) -> Result<Meta> {
    let op = "quantized_linear";
    if !(3..=4).contains(&ins.len()) {
        bail!(
            op,
            "expected x, weight, weight_scale and an optional bias, got {} tensors",
            ins.len()
        );
    }
    let (x, w, s) = (&ins[0], &ins[1], &ins[2]);
    let [n, k] = match w.dims.as_slice() {
        [n, k] if w.dtype == DType::I8 => [*n, *k],
        d => bail!(
            op,
            "weight must be i8 [out, in], got {} {}",
            w.dtype,
            fmt_dims(d)
        ),
    };
    if x.dtype != DType::F32 {
        bail!(
            op,
            "input must be f32, got {} {} (weight {})",
            x.dtype,
            fmt_dims(&x.dims),
            fmt_dims(&w.dims)
        );
    }
    if x.dims.last() != Some(&k) {
        bail!(
            op,
            "input {} does not end in in_features {k} (weight {})",
            fmt_dims(&x.dims),
            fmt_dims(&w.dims)
        );
    }
    let ns: usize = s.dims.iter().product();
    if s.dtype != DType::F32 || s.dims.len() != 1 || !(ns == 1 || ns == n) {
        bail!(
            op,
            "weight_scale must be f32 [1] or [{n}], got {} {}",
            s.dtype,
            fmt_dims(&s.dims)
        );
    }
    if let Some(b) = ins.get(3) {
        if b.dtype != DType::F32 || b.dims.as_slice() != [n] {
            bail!(
                op,
                "bias must be f32 [{n}], got {} {}",
                b.dtype,
                fmt_dims(&b.dims)
            );
        }
    }
    let mut dims = x.dims.clone();
    *dims.last_mut().expect("rank >= 1") = n;
    Ok(Meta {
        dtype: DType::F32,
        dims,
    })
}
