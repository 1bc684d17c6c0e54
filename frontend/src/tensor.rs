//! The strided tensor: a shared storage plus a layout (sizes, strides, offset).

use crate::compile::trace;
use kiln_ir::op::Layout;
use kiln_ir::shape::{fmt_dims, Dims, Strides};
use kiln_ir::{bail, DType, Result};
use kiln_runtime::{Storage, View};
use std::sync::Arc;

/// An n-dimensional array of one dtype, like `torch.Tensor`.
///
/// Cloning a `Tensor` is cheap and aliases the same data (as assigning a
/// tensor in Python does). Views (`view`, `permute`, `narrow`, ...) share the
/// storage; [`Tensor::contiguous`] and [`Tensor::reshape`] copy only when they must.
///
/// ```
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
/// let t = x.t().unwrap();
/// assert_eq!(t.dims(), &[3, 2]);
/// assert!(!t.is_contiguous());
/// assert!(t.shares_storage(&x));
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    /// Autograd state (None for tensors that never took part in autograd).
    pub(crate) autograd: Option<Arc<crate::autograd::AutogradMeta>>,
    /// Version counter shared by every view of the storage (bumped by in-place ops).
    pub(crate) version: Arc<crate::autograd::Version>,
}

/// Rust element types that map onto a [`DType`].
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, i64 => I64, i32 => I32, i16 => I16, i8 => I8, u8 => U8, bool => Bool,
         half::f16 => F16, half::bf16 => BF16);

impl Tensor {
    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout) -> Tensor {
        Tensor {
            storage,
            layout,
            autograd: None,
            version: Arc::default(),
        }
    }

    /// A fresh contiguous tensor (zero-filled). Panics with
    /// [`Tensor::try_zeros`]'s error when the shape overflows or memory runs out.
    pub fn zeros(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::try_zeros(dims, dtype).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fresh contiguous tensor whose contents are unspecified (for outputs
    /// that are about to be overwritten; like `torch.empty`). Panics as
    /// [`Tensor::zeros`] does; [`Tensor::try_empty`] returns the error.
    pub fn empty(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::try_empty(dims, dtype).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Takes ownership of `data` laid out row-major in `dims`.
    pub fn from_vec<T: Element>(data: Vec<T>, dims: &[usize]) -> Result<Tensor> {
        let n = kiln_ir::shape::checked_numel("from_vec", dims)?;
        if n != data.len() {
            bail!(
                "from_vec",
                "{} elements cannot fill shape {} ({n} elements)",
                data.len(),
                fmt_dims(dims)
            );
        }
        let bytes = unsafe {
            std::slice::from_raw_parts(
                data.as_ptr() as *const u8,
                std::mem::size_of_val(data.as_slice()),
            )
        };
        Ok(Tensor::from_bytes(T::DTYPE, dims, bytes))
    }

    /// A tensor holding a copy of `bytes` (little-endian elements of `dtype`).
    pub fn from_bytes(dtype: DType, dims: &[usize], bytes: &[u8]) -> Tensor {
        Tensor::from_parts(
            Arc::new(Storage::from_bytes(dtype, bytes)),
            Layout::contiguous(dims),
        )
    }

    /// A 0-dim tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_vec(vec![v], &[]).expect("one element")
    }

    /// `torch.full` (a host-side fill: nothing for a tracer to record).
    /// Panics as [`Tensor::zeros`] does; [`Tensor::try_full`] returns the error.
    pub fn full(dims: &[usize], value: f64, dtype: DType) -> Tensor {
        Tensor::try_full(dims, value, dtype).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `torch.ones`; see [`Tensor::full`].
    pub fn ones(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::full(dims, 1.0, dtype)
    }

    /// `torch.arange(n)` as `dtype`.
    pub fn arange(n: usize, dtype: DType) -> Tensor {
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        Tensor::from_vec(v, &[n])
            .expect("sized")
            .to_dtype(dtype)
            .expect("cast")
    }

    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    pub fn dims(&self) -> &[usize] {
        &self.layout.dims
    }
    pub fn strides(&self) -> &[isize] {
        &self.layout.strides
    }
    /// Storage offset in elements.
    pub fn offset(&self) -> usize {
        self.layout.offset
    }
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    /// Whether both tensors are views of one storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
    /// Size of `dim` (negative counts from the end).
    pub fn size(&self, dim: i64) -> Result<usize> {
        Ok(self.layout.dims[kiln_ir::shape::norm_dim("size", dim, self.rank())?])
    }
    pub fn meta(&self) -> kiln_ir::op::Meta {
        kiln_ir::op::Meta {
            dtype: self.dtype(),
            dims: self.layout.dims.clone(),
        }
    }

    /// The runtime's view of this tensor (storage + layout), as kernels take it.
    pub fn runtime_view(&self) -> View<'_> {
        View {
            storage: &self.storage,
            layout: &self.layout,
        }
    }

    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            autograd: None,
            version: self.version.clone(),
        }
    }

    /// Copies the elements out in row-major order as `T` (which must match the dtype).
    /// While tracing, reading a traced value is a graph break.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        trace::read_value("to_vec", self)?;
        if T::DTYPE != self.dtype() {
            bail!(
                "to_vec",
                "tensor is {} but {} was requested",
                self.dtype(),
                T::DTYPE
            );
        }
        if self.device().is_cuda() {
            return self.on_host()?.to_vec();
        }
        // not `contiguous()`: a host read is no op of the traced function
        let c = if self.is_contiguous() {
            self.clone()
        } else {
            self.copy_eager()?
        };
        let s = unsafe { c.storage.as_slice::<T>() };
        Ok(s[c.layout.offset..c.layout.offset + c.numel()].to_vec())
    }

    /// The elements converted to f64, row-major (handy in tests).
    ///
    /// It cannot fail, so while tracing, reading a traced value marks the
    /// trace broken (the graph break is reported when tracing ends) and the
    /// values are still returned.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        if trace::is_tracing() {
            let _ = trace::read_value("to_f64_vec", self);
            return self.host_copy(DType::F64).to_vec::<f64>().expect("f64");
        }
        self.to_dtype(DType::F64)
            .and_then(|t| t.to_vec::<f64>())
            .expect("any dtype converts to f64")
    }

    /// A contiguous copy converted to `dtype` on the host: no kernel, nothing
    /// recorded (for reads while tracing).
    fn host_copy(&self, dtype: DType) -> Tensor {
        let out = Tensor::empty(self.dims(), dtype);
        let src = self.on_host().expect("a copy to the host");
        kiln_runtime::convert(src.runtime_view(), out.runtime_view());
        out
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            bail!(
                "item",
                "a tensor with {} elements (shape {}) cannot be converted to a scalar",
                self.numel(),
                fmt_dims(self.dims())
            );
        }
        trace::read_value("item", self)?;
        Ok(self.to_f64_vec()[0])
    }

    /// Raw little-endian bytes of the elements in row-major order.
    /// While tracing, reading a traced value marks the trace broken (as
    /// [`Tensor::to_f64_vec`] does).
    pub fn to_bytes(&self) -> Vec<u8> {
        let c = if trace::is_tracing() {
            let _ = trace::read_value("to_bytes", self);
            if self.is_contiguous() {
                self.clone()
            } else {
                self.host_copy(self.dtype())
            }
        } else {
            self.contiguous().expect("contiguous copy")
        };
        let c = c.on_host().expect("a copy to the host");
        let sz = c.dtype().size();
        let b = unsafe { c.storage.bytes() };
        b[c.layout.offset * sz..(c.layout.offset + c.numel()) * sz].to_vec()
    }

    /// A contiguous copy in a new storage (always copies).
    /// Traced as the same value as `self` (no node).
    pub fn copy(&self) -> Result<Tensor> {
        trace::record_same(self, || self.copy_eager())
    }

    fn copy_eager(&self) -> Result<Tensor> {
        let out = Tensor::empty_on(self.dims(), self.dtype(), self.device())?;
        crate::ops::pointwise::copy_into(self, &out)?;
        crate::autograd::rules::view::view("clone", self, out, |g, _| Ok(g.clone()))
    }

    /// `self` if already contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            Ok(self.clone())
        } else {
            self.copy()
        }
    }

    pub(crate) fn strides_vec(&self) -> Strides {
        self.layout.strides.clone()
    }
    pub(crate) fn dims_vec(&self) -> Dims {
        self.layout.dims.clone()
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {}", self.dtype(), fmt_dims(self.dims()))?;
        if self.numel() <= 16 {
            write!(f, " {:?}", self.to_f64_vec())?;
        }
        write!(f, ")")
    }
}
