//! CPU storage: one dtype, a byte buffer, shared by every view of it.

use kiln_ir::DType;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes currently held by live storages (all tensors, all views counted once).
pub fn memory_allocated() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// A buffer of `len` elements of `dtype`, 16-byte aligned so vector loads never split.
///
/// Tensors share it through `Arc<Storage>`; views alias it. Writes go through raw
/// pointers (kernels, in-place ops), so the frontend is responsible for ordering,
/// exactly as a PyTorch storage is.
pub struct Storage {
    dtype: DType,
    len: usize,
    data: UnsafeCell<Vec<u128>>,
}

// Safety: kernels write disjoint regions; aliasing rules are the frontend's
// (PyTorch's) contract, not Rust's.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// Zero-filled storage.
    pub fn zeros(dtype: DType, len: usize) -> Storage {
        let bytes = len * dtype.size();
        LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
        Storage { dtype, len, data: UnsafeCell::new(vec![0u128; bytes.div_ceil(16)]) }
    }

    /// Storage holding a copy of `bytes` (little-endian elements of `dtype`).
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Storage {
        assert_eq!(bytes.len() % dtype.size(), 0, "byte length is not a multiple of the {dtype} size");
        let s = Storage::zeros(dtype, bytes.len() / dtype.size());
        // Safety: freshly allocated, large enough.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), s.ptr(), bytes.len()) };
        s
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn nbytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Base pointer of the buffer.
    pub fn ptr(&self) -> *mut u8 {
        // Safety: only the pointer is taken; no reference to the Vec escapes.
        unsafe { (*self.data.get()).as_mut_ptr() as *mut u8 }
    }

    /// The raw bytes. Safety: no kernel may be writing the storage meanwhile.
    pub unsafe fn bytes(&self) -> &[u8] {
        std::slice::from_raw_parts(self.ptr(), self.nbytes())
    }

    /// Typed view of the elements. Panics when `T` does not match the dtype's size.
    /// Safety: no kernel may be writing the storage meanwhile.
    pub unsafe fn as_slice<T: Copy>(&self) -> &[T] {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        std::slice::from_raw_parts(self.ptr() as *const T, self.len)
    }

    /// Mutable typed view. Safety: the caller has exclusive access to the region it writes.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<T: Copy>(&self) -> &mut [T] {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        std::slice::from_raw_parts_mut(self.ptr() as *mut T, self.len)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.nbytes(), Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({} x {})", self.dtype, self.len)
    }
}
