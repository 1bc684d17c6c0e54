//! Shape inference and argument checks for `embedding`.

use crate::shape::{fmt_dims, Dims};
use crate::{bail, DType, Result};

/// Output shape of `embedding(indices, weight)`: `indices.shape + [embedding_dim]`.
/// `weight` must be 2-D `[num_embeddings, embedding_dim]` and `indices` of an
/// integer dtype.
///
/// ```
/// use kiln_ir::{op::embedding::embedding_shape, DType};
/// let s = embedding_shape(&[10, 4], &[2, 3], DType::I64).unwrap();
/// assert_eq!(s.as_slice(), &[2, 3, 4]);
/// ```
pub fn embedding_shape(weight: &[usize], indices: &[usize], indices_dtype: DType) -> Result<Dims> {
    let op = "embedding";
    if weight.len() != 2 {
        bail!(
            op,
            "weight {} must be 2-D [num_embeddings, embedding_dim]",
            fmt_dims(weight)
        );
    }
    if !indices_dtype.is_int() {
        bail!(
            op,
            "indices {} must have an integer dtype (i64 or i32), got {indices_dtype}",
            fmt_dims(indices)
        );
    }
    let mut out: Dims = Dims::from_slice(indices);
    out.push(weight[1]);
    Ok(out)
}

/// Checks `padding_idx` against the table size (negative counts from the end,
/// as in PyTorch) and returns it resolved.
pub fn resolve_padding_idx(weight: &[usize], padding_idx: Option<i64>) -> Result<Option<usize>> {
    let Some(p) = padding_idx else {
        return Ok(None);
    };
    let rows = weight.first().copied().unwrap_or(0) as i64;
    if p >= rows || p < -rows {
        bail!(
            "embedding",
            "padding_idx {p} is out of range for weight {} ({rows} rows)",
            fmt_dims(weight)
        );
    }
    Ok(Some(if p < 0 {
        (p + rows) as usize
    } else {
        p as usize
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_errors() {
        assert_eq!(
            embedding_shape(&[10, 4], &[], DType::I32)
                .unwrap()
                .as_slice(),
            &[4]
        );
        assert_eq!(
            embedding_shape(&[10, 4], &[5], DType::I64)
                .unwrap()
                .as_slice(),
            &[5, 4]
        );
        assert_eq!(
            embedding_shape(&[10, 4, 2], &[5], DType::I64)
                .unwrap_err()
                .to_string(),
            "embedding: weight [10,4,2] must be 2-D [num_embeddings, embedding_dim]"
        );
        assert_eq!(
            embedding_shape(&[10, 4], &[5], DType::F32)
                .unwrap_err()
                .to_string(),
            "embedding: indices [5] must have an integer dtype (i64 or i32), got f32"
        );
        assert_eq!(resolve_padding_idx(&[10, 4], Some(-1)).unwrap(), Some(9));
        assert!(resolve_padding_idx(&[10, 4], Some(10)).is_err());
    }
}
