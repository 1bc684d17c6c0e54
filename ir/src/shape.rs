//! Shapes, strides and broadcasting.

use crate::{bail, Result};
use smallvec::SmallVec;

/// Sizes of a tensor, outermost first.
pub type Dims = SmallVec<[usize; 6]>;
/// Strides in elements (may be 0 for broadcast dims; never negative in kiln).
pub type Strides = SmallVec<[isize; 6]>;

/// `[2,3,4]`, the form every error message and dump uses.
pub fn fmt_dims(d: &[usize]) -> String {
    let inner: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", inner.join(","))
}

pub fn numel(d: &[usize]) -> usize {
    if d.contains(&0) {
        0
    } else {
        d.iter().product()
    }
}

/// The element count of `dims`, or an error naming `op` and the shape when
/// it does not fit in an `isize` (no buffer that large can exist, and a
/// wrapped count would make a tiny buffer look big enough).
///
/// ```
/// use kiln_ir::shape::checked_numel;
/// assert_eq!(checked_numel("zeros", &[2, 3]).unwrap(), 6);
/// let e = checked_numel("zeros", &[1 << 32, 1 << 32]).unwrap_err();
/// assert!(e.to_string().starts_with("zeros: shape [4294967296,4294967296]"));
/// ```
pub fn checked_numel(op: &str, dims: &[usize]) -> Result<usize> {
    let n = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize);
    match n {
        Some(n) => Ok(n),
        // a zero anywhere makes the count 0 even when the rest overflow
        None if dims.contains(&0) => Ok(0),
        None => bail!(
            op,
            "shape {} has too many elements: the element count overflows (storage size calculation overflowed)",
            fmt_dims(dims)
        ),
    }
}

/// The byte size of `dims` elements of `elem_size` bytes, checked as
/// [`checked_numel`] is.
///
/// ```
/// use kiln_ir::shape::checked_nbytes;
/// assert_eq!(checked_nbytes("empty", &[4, 4], 8).unwrap(), 128);
/// assert!(checked_nbytes("empty", &[1 << 62], 8).is_err());
/// ```
pub fn checked_nbytes(op: &str, dims: &[usize], elem_size: usize) -> Result<usize> {
    let n = checked_numel(op, dims)?;
    match n.checked_mul(elem_size) {
        Some(b) if b <= isize::MAX as usize => Ok(b),
        _ => bail!(
            op,
            "shape {} of {elem_size}-byte elements has a byte size that overflows",
            fmt_dims(dims)
        ),
    }
}

/// Row-major strides of a contiguous tensor. The products wrap instead of
/// overflowing: a shape too big to exist is refused by [`checked_numel`]
/// before any storage backs it.
pub fn contiguous_strides(d: &[usize]) -> Strides {
    let mut s: Strides = SmallVec::from_elem(0, d.len());
    let mut acc = 1isize;
    for i in (0..d.len()).rev() {
        s[i] = acc;
        acc = acc.wrapping_mul(d[i].max(1) as isize);
    }
    s
}

/// Whether a layout is row-major contiguous (size-1 dims may have any stride).
pub fn is_contiguous(d: &[usize], s: &[isize]) -> bool {
    let mut expected = 1isize;
    for i in (0..d.len()).rev() {
        if d[i] == 1 {
            continue;
        }
        if s[i] != expected {
            return false;
        }
        expected = expected.wrapping_mul(d[i] as isize);
    }
    true
}

/// Broadcasts two shapes with NumPy's rules, naming `op` in the error.
///
/// ```
/// use kiln_ir::shape::broadcast_shapes;
/// assert_eq!(broadcast_shapes("add", &[32, 1], &[32]).unwrap().as_slice(), &[32, 32]);
/// let e = broadcast_shapes("add", &[2, 3], &[4]).unwrap_err();
/// assert_eq!(e.to_string(), "add: shapes [2,3] and [4] cannot broadcast at dim 1 (3 vs 4)");
/// ```
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let mut out: Dims = SmallVec::from_elem(1, n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => bail!(
                op,
                "shapes {} and {} cannot broadcast at dim {i} ({x} vs {y})",
                fmt_dims(a),
                fmt_dims(b)
            ),
        };
    }
    Ok(out)
}

/// Broadcasts any number of shapes.
pub fn broadcast_all(op: &str, shapes: &[&[usize]]) -> Result<Dims> {
    let mut out: Dims = SmallVec::new();
    for s in shapes {
        out = broadcast_shapes(op, &out, s)?;
    }
    Ok(out)
}

/// Resolves a possibly negative dim against `rank`, naming `op` on error.
pub fn norm_dim(op: &str, dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        bail!(
            op,
            "dim {dim} out of range for a tensor of rank {rank} (expected {}..={})",
            -r,
            r - 1
        );
    }
    Ok(if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_error_names_dim() {
        let e = broadcast_shapes("add", &[2, 3], &[4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "add: shapes [2,3] and [4] cannot broadcast at dim 1 (3 vs 4)"
        );
    }

    #[test]
    fn contiguity() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[1, 3], &[99, 1]));
        assert_eq!(contiguous_strides(&[2, 3, 4]).as_slice(), &[12, 4, 1]);
    }
}
