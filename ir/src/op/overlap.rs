//! Memory overlap of strided layouts, for PyTorch's in-place write rules:
//! a destination whose elements alias each other (an expanded view) cannot
//! be written, and a source that partly overlaps its destination (the
//! shifted copy `a[1:].copy_(a[:-1])`) would read values it has already
//! overwritten. Both are errors in PyTorch, with the messages below.

use super::Layout;

/// PyTorch's message for a destination with aliased elements.
pub const INTERNAL_OVERLAP: &str = "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.";

/// PyTorch's message for a source partly overlapping its destination.
pub const PARTIAL_OVERLAP: &str = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.";

/// Whether two elements of `l` share a memory location for certain: a
/// stride-0 dim of size above 1 (an expanded view), as PyTorch's
/// `has_internal_overlap` answers YES.
///
/// ```
/// use kiln_ir::op::{overlap::has_internal_overlap, view, Layout};
/// let e = view::expand(&Layout::contiguous(&[1, 3]), &[2, 3]).unwrap();
/// assert!(has_internal_overlap(&e));
/// assert!(!has_internal_overlap(&Layout::contiguous(&[2, 3])));
/// ```
pub fn has_internal_overlap(l: &Layout) -> bool {
    l.dims
        .iter()
        .zip(&l.strides)
        .any(|(&d, &s)| d > 1 && s == 0)
}

/// Whether `a` and `b` (views of one storage) partly overlap: both cover a
/// dense range of memory (contiguous up to a permutation of dims), the
/// ranges intersect, and they are not the very same elements. Layouts that
/// are not dense are not judged (PyTorch's TOO_HARD), so interleaved views
/// such as two columns of one matrix are allowed.
///
/// ```
/// use kiln_ir::op::{overlap::partial_overlap, view, Layout};
/// let a = Layout::contiguous(&[5]);
/// let head = view::slice(&a, 0, Some(0), Some(4), 1).unwrap();
/// let tail = view::slice(&a, 0, Some(1), Some(5), 1).unwrap();
/// assert!(partial_overlap(&tail, &head));
/// assert!(!partial_overlap(&a, &a));
/// ```
pub fn partial_overlap(a: &Layout, b: &Layout) -> bool {
    if a.numel() == 0 || b.numel() == 0 {
        return false;
    }
    let (Some(ra), Some(rb)) = (dense_range(a), dense_range(b)) else {
        return false;
    };
    if ra == rb {
        // the same elements, whatever the order: PyTorch's FULL overlap
        // (allowed for the same layout; a permuted one is left alone too)
        return false;
    }
    ra.0 < rb.1 && rb.0 < ra.1
}

/// The element range `[start, end)` a dense layout covers, or `None` when the
/// layout has gaps or aliases (not contiguous in any dim order).
fn dense_range(l: &Layout) -> Option<(usize, usize)> {
    let mut dims: Vec<(usize, isize)> = l
        .dims
        .iter()
        .zip(&l.strides)
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    dims.sort_by_key(|&(_, s)| s);
    let mut expected = 1isize;
    for &(d, s) in &dims {
        if s != expected {
            return None;
        }
        expected = expected.checked_mul(d as isize)?;
    }
    Some((l.offset, l.offset + expected as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::view;

    #[test]
    fn columns_and_transposes_are_not_judged_but_shifts_are() {
        let m = Layout::contiguous(&[3, 4]);
        let c0 = view::select(&m, 1, 0).unwrap();
        let c1 = view::select(&m, 1, 1).unwrap();
        assert!(!partial_overlap(&c0, &c1), "interleaved columns");
        let t = view::transpose(&m, 0, 1).unwrap();
        assert!(!partial_overlap(&t, &m), "same elements, permuted");
        let r0 = view::slice(&m, 0, Some(0), Some(2), 1).unwrap();
        let r1 = view::slice(&m, 0, Some(1), Some(3), 1).unwrap();
        assert!(partial_overlap(&r0, &r1));
        let r2 = view::slice(&m, 0, Some(2), Some(3), 1).unwrap();
        assert!(!partial_overlap(&r0, &r2), "disjoint rows");
    }
}
