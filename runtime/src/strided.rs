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
