//! View ops (no data moves: new sizes/strides/offset over the same storage)
//! and the data-movement ops built on them: cat, stack, chunk, split,
//! index_select, gather.

use crate::autograd::rules::view as rules;
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::view as lv;
use kiln_ir::op::Op;
use kiln_ir::shape::{fmt_dims, norm_dim};
use kiln_ir::{bail, promote_types, DType, Result};
use kiln_runtime::strided::for_each_offset;

impl Tensor {
    /// `view(shape)`, as PyTorch names it: shares storage; errors (suggesting
    /// `reshape`) when the strides do not allow it. One size may be `-1`.
    ///
    /// ```
    /// let x = kiln_frontend::Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3]).unwrap();
    /// assert_eq!(x.view(&[3, -1]).unwrap().dims(), &[3, 2]);
    /// assert!(x.t().unwrap().view(&[-1]).is_err()); // not contiguous: use reshape
    /// ```
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        trace::record(
            || Op::View(shape.to_vec()),
            &[self],
            || {
                let y = self.with_layout(lv::view(&self.layout, shape)?);
                rules::reshape_like("view", self, y)
            },
        )
    }

    /// `reshape(shape)`: a view when possible, otherwise a contiguous copy.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        trace::record(
            || Op::View(shape.to_vec()),
            &[self],
            || {
                let dims = lv::infer_size("reshape", shape, self.numel(), self.dims())?;
                match lv::view_strides(&self.layout, &dims) {
                    Some(strides) => {
                        let y = self.with_layout(kiln_ir::op::Layout {
                            dims,
                            strides,
                            offset: self.layout.offset,
                        });
                        rules::reshape_like("reshape", self, y)
                    }
                    None => self.copy()?.view(shape),
                }
            },
        )
    }

    /// `reshape` with `usize` dims.
    pub fn reshape_dims(&self, dims: &[usize]) -> Result<Tensor> {
        let s: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        self.reshape(&s)
    }

    pub fn permute(&self, perm: &[i64]) -> Result<Tensor> {
        trace::record(
            || Op::Permute(perm.to_vec()),
            &[self],
            || self.permute_eager(perm),
        )
    }

    fn permute_eager(&self, perm: &[i64]) -> Result<Tensor> {
        let y = self.with_layout(lv::permute(&self.layout, perm)?);
        let rank = self.rank() as i64;
        let p: Vec<usize> = perm
            .iter()
            .map(|&d| (if d < 0 { d + rank } else { d }) as usize)
            .collect();
        rules::view("permute", self, y, move |g, _| {
            let mut inv = vec![0i64; p.len()];
            for (i, &d) in p.iter().enumerate() {
                inv[d] = i as i64;
            }
            g.permute(&inv)
        })
    }

    pub fn transpose(&self, d0: i64, d1: i64) -> Result<Tensor> {
        let node = || {
            // the op succeeded, so both dims are valid
            let r = self.rank() as i64;
            let norm = |d: i64| if d < 0 { d + r.max(1) } else { d };
            let mut p: Vec<i64> = (0..r).collect();
            if r > 0 {
                p.swap(norm(d0) as usize, norm(d1) as usize);
            }
            Op::Permute(p)
        };
        trace::record(node, &[self], || {
            let y = self.with_layout(lv::transpose(&self.layout, d0, d1)?);
            rules::view("transpose", self, y, move |g, _| g.transpose(d0, d1))
        })
    }

    /// `t()`: transpose of a matrix (0-D and 1-D tensors are returned as is).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() > 2 {
            bail!(
                "t",
                "expects a tensor with <= 2 dims, but got shape {}",
                fmt_dims(self.dims())
            );
        }
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(0, 1)
    }

    /// `expand(sizes)`; -1 keeps a dim.
    pub fn expand(&self, sizes: &[i64]) -> Result<Tensor> {
        trace::record(
            || Op::Expand(sizes.to_vec()),
            &[self],
            || {
                let y = self.with_layout(lv::expand(&self.layout, sizes)?);
                rules::view("expand", self, y, |g, _| Ok(g.clone()))
            },
        )
    }

    pub fn expand_to(&self, dims: &[usize]) -> Result<Tensor> {
        let node = || Op::Expand(dims.iter().map(|&d| d as i64).collect());
        trace::record(node, &[self], || {
            let y = self.with_layout(lv::broadcast_to(&self.layout, dims)?);
            rules::view("expand", self, y, |g, _| Ok(g.clone()))
        })
    }

    /// `narrow(dim, start, length)`; traced as the slice `[start:start+length]`.
    pub fn narrow(&self, dim: i64, start: i64, length: usize) -> Result<Tensor> {
        let node = || {
            // the op succeeded, so `dim` is valid and a negative start wraps once
            let d = norm_dim("narrow", dim, self.rank()).unwrap_or(0);
            let size = self.dims().get(d).copied().unwrap_or(0) as i64;
            let s = if start < 0 { start + size } else { start };
            Op::Slice {
                dim,
                start: Some(s),
                stop: Some(s + length as i64),
                step: 1,
            }
        };
        trace::record(node, &[self], || {
            let y = self.with_layout(lv::narrow(&self.layout, dim, start, length)?);
            rules::region("narrow", self, y, move |z| z.narrow(dim, start, length))
        })
    }

    /// `x[start:stop:step]` along `dim`.
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        let node = || Op::Slice {
            dim,
            start,
            stop,
            step,
        };
        trace::record(node, &[self], || {
            let y = self.with_layout(lv::slice(&self.layout, dim, start, stop, step)?);
            rules::region("slice", self, y, move |z| z.slice(dim, start, stop, step))
        })
    }

    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        trace::record(
            || Op::Select { dim, index },
            &[self],
            || {
                let y = self.with_layout(lv::select(&self.layout, dim, index)?);
                rules::region("select", self, y, move |z| z.select(dim, index))
            },
        )
    }

    /// `unsqueeze(dim)`; traced as a `view` to the new shape.
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        self.reshape_view("unsqueeze", lv::unsqueeze(&self.layout, dim))
    }

    /// `squeeze()` (all size-1 dims) or `squeeze(dims)`; traced as a `view`.
    pub fn squeeze(&self, dims: Option<&[i64]>) -> Result<Tensor> {
        self.reshape_view("squeeze", lv::squeeze(&self.layout, dims))
    }

    /// A view with `layout` (same elements, new shape), traced as `view(shape)`.
    fn reshape_view(
        &self,
        name: &'static str,
        layout: Result<kiln_ir::op::Layout>,
    ) -> Result<Tensor> {
        let layout = layout?;
        let node = || Op::View(layout.dims.iter().map(|&d| d as i64).collect());
        trace::record(node, &[self], || {
            rules::reshape_like(name, self, self.with_layout(layout.clone()))
        })
    }

    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        let shape = lv::flatten_shape(self.dims(), start, end)?;
        self.reshape(&shape)
    }

    /// `split(size, dim)`: pieces of `size` along `dim` (the last may be smaller); views.
    pub fn split(&self, size: usize, dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("split", dim, self.rank())?;
        if size == 0 {
            bail!(
                "split",
                "split_size must be positive, got 0 for shape {}",
                fmt_dims(self.dims())
            );
        }
        let n = self.dims()[d];
        (0..n.div_ceil(size).max(1))
            .map(|i| self.narrow(d as i64, (i * size) as i64, size.min(n - i * size)))
            .collect()
    }

    /// `split([sizes], dim)`: sizes must sum to the dim.
    pub fn split_sizes(&self, sizes: &[usize], dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("split", dim, self.rank())?;
        if sizes.iter().sum::<usize>() != self.dims()[d] {
            bail!(
                "split",
                "sizes {:?} do not sum to dim {d} of shape {}",
                sizes,
                fmt_dims(self.dims())
            );
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let t = self.narrow(d as i64, start as i64, s);
                start += s;
                t
            })
            .collect()
    }

    /// `chunk(n, dim)`: PyTorch's rule, pieces of ceil(size/n).
    pub fn chunk(&self, n: usize, dim: i64) -> Result<Vec<Tensor>> {
        let d = norm_dim("chunk", dim, self.rank())?;
        if n == 0 {
            bail!("chunk", "number of chunks must be positive");
        }
        self.split(self.dims()[d].div_ceil(n).max(1), d as i64)
    }

    /// `torch.cat(tensors, dim)` with type promotion.
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        trace::record(
            || Op::Cat { dim },
            tensors,
            || Tensor::cat_eager(tensors, dim),
        )
    }

    fn cat_eager(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            bail!("cat", "expected a non-empty list of tensors")
        };
        let d = norm_dim("cat", dim, first.rank())?;
        let mut dims = first.dims_vec();
        let mut dtype = first.dtype();
        for (i, t) in tensors.iter().enumerate().skip(1) {
            let ok = t.rank() == first.rank()
                && (0..first.rank()).all(|k| k == d || t.dims()[k] == first.dims()[k]);
            if !ok {
                bail!(
                    "cat",
                    "tensor {i} has shape {} but tensor 0 has shape {}: sizes must match except in dim {d}",
                    fmt_dims(t.dims()),
                    fmt_dims(first.dims())
                );
            }
            dims[d] += t.dims()[d];
            dtype = promote_types(dtype, t.dtype());
        }
        let out = Tensor::empty_on(
            &dims,
            dtype,
            crate::device::device_of(tensors.iter().copied()),
        )?;
        let mut at = 0;
        for t in tensors {
            let n = t.dims()[d];
            let dst = out.with_layout(lv::narrow(&out.layout, d as i64, at as i64, n)?);
            crate::ops::pointwise::copy_into(t, &dst)?;
            at += n;
        }
        crate::autograd::rules::view::cat(tensors, d, out)
    }

    /// `torch.stack(tensors, dim)`: all shapes equal; a new dim at `dim`.
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            bail!("stack", "expected a non-empty list of tensors")
        };
        for (i, t) in tensors.iter().enumerate() {
            if t.dims() != first.dims() {
                bail!(
                    "stack",
                    "tensor {i} has shape {} but tensor 0 has shape {}: all must be equal",
                    fmt_dims(t.dims()),
                    fmt_dims(first.dims())
                );
            }
        }
        let d = norm_dim("stack", dim, first.rank() + 1)?;
        let us = tensors
            .iter()
            .map(|t| t.unsqueeze(d as i64))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&us.iter().collect::<Vec<_>>(), d as i64)
    }

    /// `index_select(dim, index)` with a 1-D integer index.
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        trace::record(
            || Op::IndexSelect { dim },
            &[self, index],
            || self.index_select_eager(dim, index),
        )
    }

    fn index_select_eager(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let d = norm_dim("index_select", dim, self.rank())?;
        if index.rank() > 1 || index.dtype().is_float() {
            bail!(
                "index_select",
                "index must be a 1-D integer tensor, got {} {}",
                index.dtype(),
                fmt_dims(index.dims())
            );
        }
        if self.device().is_cuda() {
            let out = super::gather_kernel::index_select_kernel(&self.detach(), d, index)?;
            return crate::autograd::rules::index::index_select(self, d, index, out);
        }
        let idx = index.to_dtype(DType::I64)?.to_vec::<i64>()?;
        let n = self.dims()[d] as i64;
        for &i in &idx {
            // negative indices are out of range, as in PyTorch (no wrapping)
            if i < 0 || i >= n {
                bail!(
                    "index_select",
                    "index {i} is out of range for dim {d} of size {n} (shape {})",
                    fmt_dims(self.dims())
                );
            }
        }
        let out = super::gather_kernel::take_rows_host(&self.detach(), d, &idx)?;
        crate::autograd::rules::index::index_select(self, d, index, out)
    }

    /// `gather(dim, index)`: out[..i..] = self[..index[..i..]..] along `dim`.
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        trace::record(
            || Op::Gather { dim },
            &[self, index],
            || self.gather_eager(dim, index),
        )
    }

    fn gather_eager(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        // a device kernel when both are on one device
        let on_device = self.device().is_cuda() && index.device() == self.device();
        if on_device && self.dtype() == DType::Bool {
            // the kernel sums its one hit, which bool cannot: gather bytes
            let bytes = self.detach().to_dtype(DType::U8)?;
            return bytes.gather_eager(dim, index)?.to_dtype(DType::Bool);
        }
        if !on_device {
            if let Some(r) =
                crate::device::via_host("gather", &[self, index], |h| h[0].gather_eager(dim, &h[1]))
            {
                return r;
            }
        }
        let d = norm_dim("gather", dim, self.rank())?;
        if index.rank() != self.rank() || index.dtype() != DType::I64 {
            bail!(
                "gather",
                "index must be an i64 tensor of the same rank as the input: input {} {}, index {} {}",
                self.dtype(),
                fmt_dims(self.dims()),
                index.dtype(),
                fmt_dims(index.dims())
            );
        }
        for k in 0..self.rank() {
            if k != d && index.dims()[k] > self.dims()[k] {
                bail!(
                    "gather",
                    "index shape {} exceeds input shape {} at dim {k}",
                    fmt_dims(index.dims()),
                    fmt_dims(self.dims())
                );
            }
        }
        if on_device {
            let out = super::gather_kernel::gather_kernel(&self.detach(), d, index)?;
            return crate::autograd::rules::index::gather(self, d, index, out);
        }
        let idx = index.contiguous()?.to_vec::<i64>()?;
        let out = Tensor::empty(index.dims(), self.dtype());
        let sz = self.dtype().size();
        let n = self.dims()[d] as i64;
        // Walk the index's positions; the source offset is the input's layout at
        // the same position, with dim `d` replaced by the index value.
        let l = kiln_ir::op::Layout {
            dims: index.dims_vec(),
            strides: self.strides_vec(),
            offset: self.offset(),
        };
        let mut offs = Vec::with_capacity(idx.len());
        for_each_offset(&l, |_, o| offs.push(o));
        let mut pos = vec![0usize; index.rank()];
        let src = self.storage.ptr();
        let dst = out.storage.ptr();
        for (lin, (&o, &iv)) in offs.iter().zip(&idx).enumerate() {
            // PyTorch's rule and words: negative indices do not wrap
            if iv < 0 || iv >= n {
                bail!(
                    "gather",
                    "index {iv} is out of bounds for dimension {d} with size {n} (input shape {}, index shape {})",
                    fmt_dims(self.dims()),
                    fmt_dims(index.dims())
                );
            }
            let so = o as isize + (iv - pos[d] as i64) as isize * self.strides()[d];
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(so as usize * sz), dst.add(lin * sz), sz)
            };
            for k in (0..pos.len()).rev() {
                pos[k] += 1;
                if pos[k] < index.dims()[k] {
                    break;
                }
                pos[k] = 0;
            }
        }
        crate::autograd::rules::index::gather(self, d, index, out)
    }
}
