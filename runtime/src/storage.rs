//! Storage: one dtype, a byte buffer on one device, shared by every view of it.

use crate::cuda::pinned::{self, HostMemory};
use crate::cuda::Buffer;
use crate::memory::{counters, Device};
use kiln_ir::{DType, Error, Result};
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::memory::{memory_allocated, memory_cached};

/// The pool's cached bytes and its cached blocks per size class
/// (`(block bytes, count)`, smallest first), for [`crate::memory`].
pub(crate) fn pool_state() -> (usize, Vec<(usize, usize)>) {
    let Ok(p) = pool().lock() else {
        return (0, vec![]);
    };
    let mut blocks: Vec<(usize, usize)> = p
        .free
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(&words, v)| (block_bytes(words), v.len()))
        .collect();
    blocks.sort_unstable();
    (p.cached_bytes, blocks)
}

/// A caching allocator for large buffers: a freed buffer is kept (by rounded
/// size) and handed to the next request of that size, so a loop allocating
/// the same activations every step neither calls the OS nor page-faults.
struct Pool {
    free: HashMap<usize, Vec<Vec<u128>>>,
    cached_bytes: usize,
}

/// Buffers below this are left to malloc, which already recycles them cheaply.
const POOL_MIN_WORDS: usize = 4096; // 64 KiB
/// The most the pool keeps; beyond it freed buffers go back to the OS.
const POOL_LIMIT_BYTES: usize = 1 << 30;
/// Sizes are rounded up to this many 16-byte words (4 KiB) so near sizes share buffers.
const POOL_GRAIN_WORDS: usize = 256;
/// Host storage starts on a cache line, so a 64-byte vector load at the
/// start of a row never straddles two lines (an AVX-512 loop over a
/// 16-byte-aligned buffer splits every load: a one-pass W1 loop ran 2.0-3.1
/// ms against 1.5-1.9 aligned). malloc aligns to 16 bytes (a large block
/// sits 16 bytes past a page), so each buffer carries this slack.
const LINE: usize = 64;
const SLACK_WORDS: usize = LINE / 16 - 1;

/// The bytes a buffer of `words` offers, its alignment slack left out (what
/// the memory statistics count as the block's size).
fn block_bytes(words: usize) -> usize {
    (words - SLACK_WORDS) * 16
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            free: HashMap::new(),
            cached_bytes: 0,
        })
    })
}

/// The 16-byte words (pool-rounded, plus the alignment slack) that hold `len` elements of `dtype`,
/// or an error when that size overflows.
fn host_words(dtype: DType, len: usize) -> Result<usize> {
    len.checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize - (POOL_GRAIN_WORDS * 16))
        .map(|b| pool_words(b.div_ceil(16)) + SLACK_WORDS)
        .ok_or_else(|| {
            Error::op(
                "alloc",
                format!("{len} elements of {dtype}: the byte size overflows"),
            )
        })
}

fn pool_words(words: usize) -> usize {
    if words < POOL_MIN_WORDS {
        words
    } else {
        words.div_ceil(POOL_GRAIN_WORDS) * POOL_GRAIN_WORDS
    }
}

/// `words` zeroed: a cached buffer cleared, or fresh zero pages from calloc
/// (which the OS hands out without touching them).
fn zeroed_words(words: usize) -> Result<Vec<u128>> {
    Ok(match take_cached(words) {
        Some(mut v) => {
            v.fill(0);
            v
        }
        None => crate::scratch::try_zeroed("alloc", words)?,
    })
}

fn take_cached(words: usize) -> Option<Vec<u128>> {
    if words < POOL_MIN_WORDS {
        return None;
    }
    let mut p = pool().lock().ok()?;
    let v = p.free.get_mut(&words).and_then(|b| b.pop());
    counters(Device::Cpu).on_pool_request(v.is_some());
    let v = v?;
    p.cached_bytes -= block_bytes(words);
    Some(v)
}

fn give_back(v: Vec<u128>) {
    let words = v.len();
    if words < POOL_MIN_WORDS {
        return;
    }
    if let Ok(mut p) = pool().lock() {
        if p.cached_bytes + block_bytes(words) <= POOL_LIMIT_BYTES {
            p.cached_bytes += block_bytes(words);
            p.free.entry(words).or_default().push(v);
        }
    }
}

/// A buffer of `len` elements of `dtype`, starting on a 64-byte cache line so
/// vector loads never split.
///
/// Tensors share it through `Arc<Storage>`; views alias it. Writes go through raw
/// pointers (kernels, in-place ops), so the frontend is responsible for ordering,
/// exactly as a PyTorch storage is. CPU storages live in host memory; CUDA
/// storages in device memory ([`crate::cuda::Buffer`]), which host code never
/// reads: [`Storage::ptr`] on one panics, [`Storage::to_device`] copies.
/// A pinned CPU storage ([`Storage::pin`]) keeps its bytes in
/// [`HostMemory`] instead of `data`, shared with the copies still reading it.
pub struct Storage {
    /// Unique per storage for the process's lifetime (see [`Storage::id`]).
    id: u64,
    dtype: DType,
    len: usize,
    data: UnsafeCell<Vec<u128>>,
    cuda: Option<(u8, Buffer)>,
    pinned: Option<Arc<HostMemory>>,
    /// Set for [`Storage::deferred`]: `data` is allocated on first access.
    deferred: Option<std::sync::Once>,
}

// Safety: kernels write disjoint regions; aliasing rules are the frontend's
// (PyTorch's) contract, not Rust's.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

/// The next [`Storage::id`].
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Storage {
    /// Zero-filled storage. Panics with [`Storage::try_zeros`]'s message when
    /// memory runs out (the fallible form is what tensor constructors use).
    pub fn zeros(dtype: DType, len: usize) -> Storage {
        Storage::try_zeros(dtype, len).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Zero-filled storage, or an error giving the bytes asked for when the
    /// size overflows or the host is out of memory.
    ///
    /// ```
    /// use kiln_runtime::Storage;
    /// assert_eq!(Storage::try_zeros(kiln_ir::DType::F32, 4).unwrap().nbytes(), 16);
    /// assert!(Storage::try_zeros(kiln_ir::DType::F32, 1 << 61).is_err());
    /// ```
    pub fn try_zeros(dtype: DType, len: usize) -> Result<Storage> {
        let words = host_words(dtype, len)?;
        Ok(Storage::with_data(dtype, len, zeroed_words(words)?))
    }

    /// Zero-filled storage whose buffer is allocated on first access
    /// ([`Storage::ptr`]): a stand-in with a tensor's size that is most
    /// likely never read, such as the results `compile_fn`'s replay script
    /// hands back instead of computing. Until then it holds no memory and
    /// the memory statistics do not count it.
    ///
    /// ```
    /// use kiln_runtime::Storage;
    /// let s = Storage::deferred(kiln_ir::DType::F32, 1 << 20).unwrap();
    /// assert_eq!(unsafe { s.as_slice::<f32>() }[12345], 0.0);
    /// ```
    pub fn deferred(dtype: DType, len: usize) -> Result<Storage> {
        host_words(dtype, len)?;
        Ok(Storage {
            id: next_id(),
            dtype,
            len,
            data: UnsafeCell::new(vec![]),
            cuda: None,
            pinned: None,
            deferred: Some(std::sync::Once::new()),
        })
    }

    /// Storage whose contents are unspecified (a recycled buffer, or zeros):
    /// for outputs that a kernel overwrites completely. Panics on out of
    /// memory, as [`Storage::zeros`].
    pub fn empty(dtype: DType, len: usize) -> Storage {
        Storage::try_empty(dtype, len).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fallible form of [`Storage::empty`].
    pub fn try_empty(dtype: DType, len: usize) -> Result<Storage> {
        let words = host_words(dtype, len)?;
        let data = match take_cached(words) {
            Some(v) => v,
            None => crate::scratch::try_zeroed("alloc", words)?,
        };
        Ok(Storage::with_data(dtype, len, data))
    }

    /// A deferred storage's first access: its zeroed buffer. Panics when
    /// memory has run out (the access has no error path: [`Storage::ptr`]).
    fn materialize(&self) {
        let words = host_words(self.dtype, self.len).expect("checked by Storage::deferred");
        let data = zeroed_words(words).unwrap_or_else(|e| panic!("{e}"));
        counters(Device::Cpu).on_alloc(self.nbytes(), block_bytes(data.len()));
        // SAFETY: inside the storage's `Once`: no other access to `data` runs
        // until it completes
        unsafe { *self.data.get() = data };
    }

    fn with_data(dtype: DType, len: usize, data: Vec<u128>) -> Storage {
        counters(Device::Cpu).on_alloc(len * dtype.size(), block_bytes(data.len()));
        Storage {
            id: next_id(),
            dtype,
            len,
            data: UnsafeCell::new(data),
            cuda: None,
            pinned: None,
            deferred: None,
        }
    }

    /// Zero-filled storage on `device`.
    pub fn zeros_on(device: Device, dtype: DType, len: usize) -> Result<Storage> {
        match device {
            Device::Cpu => Storage::try_zeros(dtype, len),
            Device::Cuda(n) => {
                let bytes = len.checked_mul(dtype.size()).ok_or_else(|| {
                    Error::op(
                        "alloc",
                        format!("{len} elements of {dtype}: the byte size overflows"),
                    )
                })?;
                let buf = crate::cuda::gpu(n)?.alloc(bytes)?;
                counters(device).on_alloc(len * dtype.size(), buf.bytes);
                Ok(Storage {
                    id: next_id(),
                    dtype,
                    len,
                    data: UnsafeCell::new(vec![]),
                    cuda: Some((n, buf)),
                    pinned: None,
                    deferred: None,
                })
            }
        }
    }

    /// Storage on `device` whose contents are unspecified (see [`Storage::empty`]).
    pub fn empty_on(device: Device, dtype: DType, len: usize) -> Result<Storage> {
        match device {
            Device::Cpu => Storage::try_empty(dtype, len),
            // device memory is zeroed by the allocation (one memset, stream-ordered)
            Device::Cuda(_) => Storage::zeros_on(device, dtype, len),
        }
    }

    pub fn device(&self) -> Device {
        match &self.cuda {
            None => Device::Cpu,
            Some((n, _)) => Device::Cuda(*n),
        }
    }

    /// The address kernels on this storage's device use (a device address on CUDA).
    pub fn device_ptr(&self) -> u64 {
        match &self.cuda {
            None => self.ptr() as u64,
            Some((_, b)) => b.ptr,
        }
    }

    /// A copy of the whole storage on `device`.
    pub fn to_device(&self, device: Device) -> Result<Storage> {
        let out = Storage::empty_on(device, self.dtype, self.len)?;
        let n = self.nbytes();
        match (&self.cuda, &out.cuda) {
            // SAFETY: both host buffers hold `n` bytes.
            (None, None) => unsafe { std::ptr::copy_nonoverlapping(self.ptr(), out.ptr(), n) },
            (None, Some((d, b))) => match &self.pinned {
                // a blocking copy: queued like a non-blocking one, then waited for
                Some(m) => {
                    pinned::copy_to_device(&*crate::cuda::gpu(*d)?, m, 0..n, b.ptr)?;
                    m.wait_for_copies()?;
                }
                None => {
                    // SAFETY: no kernel writes a host storage while it is copied.
                    let src = unsafe { self.bytes() };
                    crate::cuda::gpu(*d)?.copy_to_device(src, b.ptr)?;
                }
            },
            (Some((d, b)), None) => {
                // SAFETY: the fresh host buffer is ours alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr(), n) };
                crate::cuda::gpu(*d)?.copy_to_host(b.ptr, dst)?;
            }
            (Some((d, b)), Some((e, c))) if d == e => {
                crate::cuda::gpu(*d)?.copy_on_device(b.ptr, c.ptr, n)?;
            }
            (Some((d, b)), Some((e, c))) => {
                // between devices, through the host
                let mut tmp = vec![0u8; n];
                crate::cuda::gpu(*d)?.copy_to_host(b.ptr, &mut tmp)?;
                crate::cuda::gpu(*e)?.copy_to_device(&tmp, c.ptr)?;
            }
        }
        Ok(out)
    }

    /// A pinned CPU copy of elements `range` of this CPU storage
    /// (`tensor.pin_memory()`): page-locked memory from CUDA device 0, so
    /// copies from it to a device can run asynchronously
    /// ([`Storage::to_device_non_blocking`]). On the emulator the memory is
    /// ordinary but flagged pinned; with no CUDA device at all it is an error,
    /// as in PyTorch.
    pub fn pin(&self, range: Range<usize>) -> Result<Storage> {
        if let Some((n, _)) = &self.cuda {
            return Err(Error::op(
                "pin_memory",
                format!("cannot pin cuda:{n} memory: only CPU tensors can be pinned"),
            ));
        }
        let gpu = crate::cuda::gpu(0).map_err(|e| {
            Error::op(
                "pin_memory",
                format!("pinned memory needs a CUDA device: {e}"),
            )
        })?;
        assert!(range.end <= self.len, "pin range past the storage");
        let nbytes = range.len() * self.dtype.size();
        let m = gpu.alloc_pinned(nbytes)?;
        // SAFETY: both buffers hold the range; the new one is ours alone.
        unsafe {
            let src = self.ptr().add(range.start * self.dtype.size());
            std::ptr::copy_nonoverlapping(src, m.host_ptr(), nbytes);
        }
        counters(Device::Cpu).on_alloc(nbytes, m.len());
        Ok(Storage {
            id: next_id(),
            dtype: self.dtype,
            len: range.len(),
            data: UnsafeCell::new(vec![]),
            cuda: None,
            pinned: Some(Arc::new(m)),
            deferred: None,
        })
    }

    /// Whether this is a pinned CPU storage.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The pinned memory behind a pinned storage.
    pub fn pinned_memory(&self) -> Option<&Arc<HostMemory>> {
        self.pinned.as_ref()
    }

    /// A copy of elements `range` on CUDA `device` that does not wait for
    /// the copy (`.to(device, non_blocking=True)`): work queued after it on
    /// the device sees the data, this storage's memory stays alive until the
    /// copy is done even if it is dropped, and host access to it waits.
    /// Only pinned CPU storages can be read asynchronously; for any other
    /// source or destination, use [`Storage::to_device`].
    pub fn to_device_non_blocking(&self, device: Device, range: Range<usize>) -> Result<Storage> {
        let (Some(m), Device::Cuda(d)) = (&self.pinned, device) else {
            return Err(Error::op(
                "to_device_non_blocking",
                format!(
                    "needs a pinned CPU source and a CUDA destination, got {}{} to {device}",
                    if self.is_pinned() { "pinned " } else { "" },
                    self.device()
                ),
            ));
        };
        assert!(range.end <= self.len, "copy range past the storage");
        let out = Storage::empty_on(device, self.dtype, range.len())?;
        let size = self.dtype.size();
        let dst = out.device_ptr();
        pinned::copy_to_device(
            &*crate::cuda::gpu(d)?,
            m,
            range.start * size..range.end * size,
            dst,
        )?;
        Ok(out)
    }

    /// Storage holding a copy of `bytes` (little-endian elements of `dtype`).
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Storage {
        assert_eq!(
            bytes.len() % dtype.size(),
            0,
            "byte length is not a multiple of the {dtype} size"
        );
        let s = Storage::empty(dtype, bytes.len() / dtype.size());
        // Safety: freshly allocated, large enough.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), s.ptr(), bytes.len()) };
        s
    }

    /// A number no other storage of this process has, ever: unlike the
    /// storage's address, which the allocator hands to a new storage once
    /// this one is freed, it names this storage alone (the compiled
    /// executor's launch recorder tells a freed temporary from the storage
    /// that took its place by it).
    ///
    /// ```
    /// use kiln_runtime::Storage;
    /// let a = Storage::zeros(kiln_ir::DType::F32, 4).id();
    /// assert_ne!(a, Storage::zeros(kiln_ir::DType::F32, 4).id());
    /// ```
    pub fn id(&self) -> u64 {
        self.id
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

    /// Base pointer of the host buffer. Panics on a CUDA storage: host code
    /// reading device memory is a bug to catch here, not a wild read later.
    pub fn ptr(&self) -> *mut u8 {
        if let Some((n, _)) = &self.cuda {
            panic!(
                "host access to cuda:{n} memory ({} x {}): copy it to the CPU first \
                 (Tensor::to_device(Device::Cpu))",
                self.dtype, self.len
            );
        }
        if let Some(m) = &self.pinned {
            return m.host_ptr();
        }
        if let Some(once) = &self.deferred {
            once.call_once(|| self.materialize());
        }
        // Safety: only the pointer is taken; no reference to the Vec escapes.
        let base = unsafe { (*self.data.get()).as_mut_ptr() as *mut u8 };
        // still inside the buffer: the Vec is 16-byte aligned with SLACK_WORDS spare words
        base.wrapping_add(base.align_offset(LINE))
    }

    /// The raw bytes.
    ///
    /// # Safety
    /// No kernel may be writing the storage meanwhile.
    pub unsafe fn bytes(&self) -> &[u8] {
        std::slice::from_raw_parts(self.ptr(), self.nbytes())
    }

    /// Typed view of the elements. Panics when `T` does not match the dtype's size.
    ///
    /// # Safety
    /// No kernel may be writing the storage meanwhile.
    pub unsafe fn as_slice<T: Copy>(&self) -> &[T] {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        std::slice::from_raw_parts(self.ptr() as *const T, self.len)
    }

    /// Mutable typed view.
    ///
    /// # Safety
    /// The caller has exclusive access to the region it writes.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<T: Copy>(&self) -> &mut [T] {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        std::slice::from_raw_parts_mut(self.ptr() as *mut T, self.len)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some((_, b)) = &self.cuda {
            counters(self.device()).on_free(self.nbytes(), b.bytes);
            return;
        }
        if let Some(m) = &self.pinned {
            // the memory itself lives on while copies from it run (see `pinned`)
            counters(Device::Cpu).on_free(self.nbytes(), m.len());
            return;
        }
        if self.data.get_mut().is_empty() {
            // a deferred storage never accessed
            return;
        }
        let buffer_bytes = block_bytes(self.data.get_mut().len());
        counters(Device::Cpu).on_free(self.nbytes(), buffer_bytes);
        give_back(std::mem::take(self.data.get_mut()));
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Storage({} x {} on {}{})",
            self.dtype,
            self.len,
            self.device(),
            if self.is_pinned() { ", pinned" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_buffers_are_reused_and_zeros_stays_zero() {
        let n = 1 << 20;
        let a = Storage::empty(DType::F32, n);
        unsafe { a.as_mut_slice::<f32>().fill(7.0) };
        let ptr = a.ptr();
        drop(a);
        let b = Storage::zeros(DType::F32, n);
        assert_eq!(b.ptr(), ptr, "the cached buffer is handed out again");
        assert!(unsafe { b.as_slice::<f32>() }.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn a_deferred_storage_allocates_on_first_access() {
        let s = Storage::deferred(DType::F32, 5000).unwrap();
        assert!(
            unsafe { (*s.data.get()).is_empty() },
            "nothing allocated yet"
        );
        let p = s.ptr();
        assert_eq!(p as usize % LINE, 0);
        assert!(unsafe { s.as_slice::<f32>() }.iter().all(|&x| x == 0.0));
        unsafe { *(p as *mut f32).add(4999) = 2.5 };
        assert_eq!(s.ptr(), p, "allocated once");
        assert_eq!(unsafe { s.as_slice::<f32>() }[4999], 2.5);
        // never accessed: dropped without touching the statistics' blocks
        drop(Storage::deferred(DType::F32, 1 << 20).unwrap());
        assert!(Storage::deferred(DType::F32, 1 << 61).is_err());
    }

    #[test]
    fn host_storage_starts_on_a_cache_line() {
        for n in [0, 1, 5, 1000, 1 << 16, (1 << 20) + 3] {
            let s = Storage::empty(DType::F32, n);
            assert_eq!(s.ptr() as usize % LINE, 0, "{n} elements");
            // the whole range is inside the buffer
            let words = unsafe { (*s.data.get()).len() };
            assert!(
                s.ptr() as usize + n * 4
                    <= unsafe { (*s.data.get()).as_ptr() } as usize + words * 16
            );
        }
    }
}
