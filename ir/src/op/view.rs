//! Layout arithmetic of views: what `view`, `permute`, `expand`, slicing and
//! friends do to sizes, strides and the storage offset. No data moves here.

use crate::shape::{fmt_dims, norm_dim, Dims, Strides};
use crate::{bail, Result};

/// A strided layout over a storage: sizes, strides (elements) and offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub dims: Dims,
    pub strides: Strides,
    pub offset: usize,
}

impl Layout {
    pub fn contiguous(dims: &[usize]) -> Layout {
        Layout {
            dims: dims.into(),
            strides: crate::shape::contiguous_strides(dims),
            offset: 0,
        }
    }
    pub fn numel(&self) -> usize {
        // a zero dim first: the other dims' product may overflow (it is only
        // checked for layouts that hold elements)
        if self.dims.contains(&0) {
            0
        } else {
            self.dims.iter().product()
        }
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    pub fn is_contiguous(&self) -> bool {
        crate::shape::is_contiguous(&self.dims, &self.strides)
    }
}

/// Resolves a requested shape with at most one `-1` against `numel`.
pub fn infer_size(op: &str, shape: &[i64], numel: usize, from: &[usize]) -> Result<Dims> {
    let mut infer = None;
    let mut known = 1usize;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                bail!(op, "only one dimension can be inferred (-1) in {:?}", shape);
            }
            infer = Some(i);
        } else if s < 0 {
            bail!(op, "invalid size {s} in {:?}", shape);
        } else {
            known = match known.checked_mul(s as usize) {
                Some(k) => k,
                None => bail!(
                    op,
                    "shape {:?} has too many elements: the element count overflows",
                    shape
                ),
            };
        }
    }
    let mut out: Dims = shape.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) if known != 0 && numel.is_multiple_of(known) => out[i] = numel / known,
        None if known == numel => {}
        _ => bail!(
            op,
            "shape {:?} is invalid for input of size {numel} (shape {})",
            shape,
            fmt_dims(from)
        ),
    }
    Ok(out)
}

/// Strides for viewing `l` as `new` without copying, or None when the memory
/// layout does not allow it (PyTorch's `computeStride`).
pub fn view_strides(l: &Layout, new: &[usize]) -> Option<Strides> {
    let old_d = &l.dims;
    let old_s = &l.strides;
    let numel: usize = old_d.iter().product();
    let mut out: Strides = smallvec::smallvec![0; new.len()];
    if numel == 0 || old_d.is_empty() {
        return Some(crate::shape::contiguous_strides(new));
    }
    let mut view_d = new.len() as isize - 1;
    let mut chunk_base_stride = *old_s.last().unwrap_or(&1);
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..old_d.len()).rev() {
        tensor_numel *= old_d[tensor_d];
        if tensor_d == 0
            || (old_d[tensor_d - 1] != 1
                && old_s[tensor_d - 1] != tensor_numel as isize * chunk_base_stride)
        {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                out[view_d as usize] = view_numel as isize * chunk_base_stride;
                view_numel *= new[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_s[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(out)
}

/// `view(shape)`: fails (suggesting `reshape`) when strides do not allow it.
pub fn view(l: &Layout, shape: &[i64]) -> Result<Layout> {
    let dims = infer_size("view", shape, l.numel(), &l.dims)?;
    match view_strides(l, &dims) {
        Some(strides) => Ok(Layout { dims, strides, offset: l.offset }),
        None => bail!(
            "view",
            "size {} with strides {:?} is not compatible with the requested shape {}: the data is not laid out contiguously for it; use .reshape(...) instead",
            fmt_dims(&l.dims),
            l.strides.as_slice(),
            fmt_dims(&dims)
        ),
    }
}

pub fn permute(l: &Layout, perm: &[i64]) -> Result<Layout> {
    let r = l.rank();
    if perm.len() != r {
        bail!(
            "permute",
            "got {} dims {:?} for a tensor of shape {}",
            perm.len(),
            perm,
            fmt_dims(&l.dims)
        );
    }
    let mut seen = vec![false; r];
    let mut out = l.clone();
    for (i, &p) in perm.iter().enumerate() {
        let d = norm_dim("permute", p, r)?;
        if seen[d] {
            bail!(
                "permute",
                "dim {d} repeats in {:?} (input shape {})",
                perm,
                fmt_dims(&l.dims)
            );
        }
        seen[d] = true;
        out.dims[i] = l.dims[d];
        out.strides[i] = l.strides[d];
    }
    Ok(out)
}

pub fn transpose(l: &Layout, d0: i64, d1: i64) -> Result<Layout> {
    let r = l.rank();
    if r == 0 {
        return Ok(l.clone());
    }
    let (a, b) = (norm_dim("transpose", d0, r)?, norm_dim("transpose", d1, r)?);
    let mut out = l.clone();
    out.dims.swap(a, b);
    out.strides.swap(a, b);
    Ok(out)
}

/// `expand(sizes)`: -1 keeps a dim; only size-1 dims (or new leading dims) grow, with stride 0.
pub fn expand(l: &Layout, sizes: &[i64]) -> Result<Layout> {
    let r = l.rank();
    if sizes.len() < r {
        bail!(
            "expand",
            "the number of sizes {:?} must be at least the rank of {}",
            sizes,
            fmt_dims(&l.dims)
        );
    }
    let lead = sizes.len() - r;
    let mut out = Layout {
        dims: Dims::new(),
        strides: Strides::new(),
        offset: l.offset,
    };
    for (i, &s) in sizes.iter().enumerate() {
        if i < lead {
            if s < 0 {
                bail!(
                    "expand",
                    "size -1 is not allowed for a new leading dim in {:?}",
                    sizes
                );
            }
            out.dims.push(s as usize);
            out.strides.push(0);
            continue;
        }
        let (d, st) = (l.dims[i - lead], l.strides[i - lead]);
        if s == -1 || s as usize == d {
            out.dims.push(d);
            out.strides.push(st);
        } else if d == 1 {
            out.dims.push(s as usize);
            out.strides.push(0);
        } else {
            bail!(
                "expand",
                "the expanded size {s} must match the existing size {d} at non-singleton dim {i}: shape {} to {:?}",
                fmt_dims(&l.dims),
                sizes
            );
        }
    }
    crate::shape::checked_numel("expand", &out.dims)?;
    Ok(out)
}

/// Broadcast view of `l` to `shape` (which must be a valid broadcast target).
pub fn broadcast_to(l: &Layout, shape: &[usize]) -> Result<Layout> {
    let sizes: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    expand(l, &sizes)
}

/// `x[start:stop:step]` along `dim` (Python semantics: negatives count from the end, clamped).
pub fn slice(
    l: &Layout,
    dim: i64,
    start: Option<i64>,
    stop: Option<i64>,
    step: i64,
) -> Result<Layout> {
    let d = norm_dim("slice", dim, l.rank())?;
    if step <= 0 {
        bail!("slice", "step must be positive, got {step}");
    }
    let n = l.dims[d] as i64;
    let clamp = |v: i64| -> i64 {
        let v = if v < 0 { v + n } else { v };
        v.clamp(0, n)
    };
    let s = start.map(clamp).unwrap_or(0);
    let e = stop.map(clamp).unwrap_or(n).max(s);
    let mut out = l.clone();
    out.offset = (l.offset as isize + s as isize * l.strides[d]) as usize;
    out.dims[d] = ((e - s + step - 1) / step) as usize;
    out.strides[d] = l.strides[d] * step as isize;
    Ok(out)
}

/// `narrow(dim, start, length)`: like slicing but out-of-range is an error.
pub fn narrow(l: &Layout, dim: i64, start: i64, length: usize) -> Result<Layout> {
    let d = norm_dim("narrow", dim, l.rank())?;
    let n = l.dims[d] as i64;
    let s = if start < 0 { start + n } else { start };
    if s < 0 || s + length as i64 > n {
        bail!(
            "narrow",
            "start {start} + length {length} exceeds dim {d} of size {n} (shape {})",
            fmt_dims(&l.dims)
        );
    }
    slice(l, d as i64, Some(s), Some(s + length as i64), 1)
}

/// `select(dim, index)`: removes `dim`.
pub fn select(l: &Layout, dim: i64, index: i64) -> Result<Layout> {
    let d = norm_dim("select", dim, l.rank())?;
    let n = l.dims[d] as i64;
    let i = if index < 0 { index + n } else { index };
    if i < 0 || i >= n {
        bail!(
            "select",
            "index {index} is out of range for dim {d} of size {n} (shape {})",
            fmt_dims(&l.dims)
        );
    }
    let mut out = l.clone();
    out.offset = (l.offset as isize + i as isize * l.strides[d]) as usize;
    out.dims.remove(d);
    out.strides.remove(d);
    Ok(out)
}

/// `diagonal(offset, dim1, dim2)`: both dims removed, the diagonal
/// (`j - i == offset`) appended as the last dim, stride `s1 + s2`.
pub fn diagonal(l: &Layout, offset: i64, dim1: i64, dim2: i64) -> Result<Layout> {
    let d1 = norm_dim("diagonal", dim1, l.rank())?;
    let d2 = norm_dim("diagonal", dim2, l.rank())?;
    if d1 == d2 {
        bail!(
            "diagonal",
            "dim1 and dim2 are both {d1} (shape {})",
            fmt_dims(&l.dims)
        );
    }
    let (n1, n2) = (l.dims[d1] as i64, l.dims[d2] as i64);
    let len = if offset >= 0 {
        n1.min(n2 - offset)
    } else {
        (n1 + offset).min(n2)
    }
    .max(0);
    let mut out = l.clone();
    if len > 0 {
        let start = if offset >= 0 {
            offset * l.strides[d2] as i64
        } else {
            -offset * l.strides[d1] as i64
        };
        out.offset = (l.offset as i64 + start) as usize;
    }
    let step = l.strides[d1] + l.strides[d2];
    for d in [d1.max(d2), d1.min(d2)] {
        out.dims.remove(d);
        out.strides.remove(d);
    }
    out.dims.push(len as usize);
    out.strides.push(step);
    Ok(out)
}

/// `x.unfold(dim, size, step)`: dim `dim` becomes the window count, a new
/// last dim of `size` walks one window (windows overlap when `step < size`).
pub fn unfold(l: &Layout, dim: i64, size: usize, step: usize) -> Result<Layout> {
    let d = norm_dim("unfold", dim, l.rank())?;
    let n = l.dims.get(d).copied().unwrap_or(1);
    if size > n || step == 0 {
        bail!(
            "unfold",
            "size {size} (at most {n}) and step {step} (positive) do not fit dim {d} of shape {}",
            fmt_dims(&l.dims)
        );
    }
    let mut out = l.clone();
    let s = l.strides.get(d).copied().unwrap_or(1);
    if l.rank() == 0 {
        out.dims.push(size);
        out.strides.push(1);
        return Ok(out);
    }
    out.dims[d] = (n - size) / step + 1;
    out.strides[d] = s * step as isize;
    out.dims.push(size);
    out.strides.push(s);
    Ok(out)
}

pub fn unsqueeze(l: &Layout, dim: i64) -> Result<Layout> {
    let d = norm_dim("unsqueeze", dim, l.rank() + 1)?;
    let mut out = l.clone();
    let st = if d < l.rank() {
        l.strides[d] * l.dims[d] as isize
    } else {
        1
    };
    out.dims.insert(d, 1);
    out.strides.insert(d, st);
    Ok(out)
}

/// `squeeze(dims)`: removes the listed size-1 dims (all size-1 dims when `None`).
pub fn squeeze(l: &Layout, dims: Option<&[i64]>) -> Result<Layout> {
    let r = l.rank();
    let mut drop = vec![false; r];
    match dims {
        None => (0..r).for_each(|i| drop[i] = l.dims[i] == 1),
        Some(ds) => {
            for &d in ds {
                let d = norm_dim("squeeze", d, r)?;
                drop[d] = l.dims[d] == 1;
            }
        }
    }
    let mut out = Layout {
        dims: Dims::new(),
        strides: Strides::new(),
        offset: l.offset,
    };
    for i in 0..r {
        if !drop[i] {
            out.dims.push(l.dims[i]);
            out.strides.push(l.strides[i]);
        }
    }
    Ok(out)
}

/// Shape of `flatten(start, end)`.
pub fn flatten_shape(dims: &[usize], start: i64, end: i64) -> Result<Vec<i64>> {
    if dims.is_empty() {
        return Ok(vec![1]);
    }
    let (s, e) = (
        norm_dim("flatten", start, dims.len())?,
        norm_dim("flatten", end, dims.len())?,
    );
    if s > e {
        bail!(
            "flatten",
            "start_dim {start} comes after end_dim {end} for shape {}",
            fmt_dims(dims)
        );
    }
    let mut out: Vec<i64> = dims[..s].iter().map(|&d| d as i64).collect();
    out.push(dims[s..=e].iter().product::<usize>() as i64);
    out.extend(dims[e + 1..].iter().map(|&d| d as i64));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_of_transpose_fails_with_hint() {
        let l = Layout::contiguous(&[4, 6]);
        let t = transpose(&l, 0, 1).unwrap();
        let e = view(&t, &[-1]).unwrap_err().to_string();
        assert!(
            e.starts_with("view: size [6,4]") && e.contains("reshape"),
            "{e}"
        );
    }

    #[test]
    fn view_splits_and_merges() {
        let l = Layout::contiguous(&[4, 6]);
        let v = view(&l, &[2, -1, 3]).unwrap();
        assert_eq!(v.dims.as_slice(), &[2, 4, 3]);
        assert_eq!(v.strides.as_slice(), &[12, 3, 1]);
        // a column slice can still split its row dim
        let s = slice(&l, 1, Some(0), Some(3), 1).unwrap();
        assert!(view(&s, &[2, 2, 3]).is_ok());
        assert!(view(&s, &[12]).is_err());
    }

    #[test]
    fn slicing_with_steps_and_negatives() {
        let l = Layout::contiguous(&[10]);
        let s = slice(&l, 0, Some(-8), None, 3).unwrap();
        assert_eq!((s.dims[0], s.strides[0], s.offset), (3, 3, 2));
    }
}
