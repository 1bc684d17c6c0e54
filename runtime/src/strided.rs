//! Walking a strided layout element by element, for the few host-side loops
//! (f16/bf16 conversion, gathers) that are not generated kernels.

use kiln_ir::op::Layout;

/// Calls `f(i, offset)` for every element of `l` in row-major order, where `i`
/// is the linear index and `offset` the element offset into the storage.
pub fn for_each_offset(l: &Layout, mut f: impl FnMut(usize, usize)) {
    let n = l.numel();
    if n == 0 {
        return;
    }
    let r = l.rank();
    let mut idx = vec![0usize; r];
    let mut off = l.offset as isize;
    for i in 0..n {
        f(i, off as usize);
        for d in (0..r).rev() {
            idx[d] += 1;
            off += l.strides[d];
            if idx[d] < l.dims[d] {
                break;
            }
            off -= l.strides[d] * l.dims[d] as isize;
            idx[d] = 0;
        }
    }
}

/// Calls `f(offset_in_a, offset_in_b)` for every element of two layouts of
/// equal dims, in row-major order (a strided copy between them).
pub fn for_each_offset_pair(a: &Layout, b: &Layout, mut f: impl FnMut(usize, usize)) {
    debug_assert_eq!(a.dims, b.dims, "paired layouts have equal dims");
    let n = a.numel();
    if n == 0 {
        return;
    }
    let r = a.rank();
    let mut idx = vec![0usize; r];
    let (mut oa, mut ob) = (a.offset as isize, b.offset as isize);
    for _ in 0..n {
        f(oa as usize, ob as usize);
        for d in (0..r).rev() {
            idx[d] += 1;
            oa += a.strides[d];
            ob += b.strides[d];
            if idx[d] < a.dims[d] {
                break;
            }
            oa -= a.strides[d] * a.dims[d] as isize;
            ob -= b.strides[d] * b.dims[d] as isize;
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_a_transpose() {
        let l = kiln_ir::op::view::transpose(&Layout::contiguous(&[2, 3]), 0, 1).unwrap();
        let mut offs = vec![];
        for_each_offset(&l, |_, o| offs.push(o));
        assert_eq!(offs, vec![0, 3, 1, 4, 2, 5]);
    }
}
