//! Pinned (page-locked) host memory, and host→device copies from it that
//! return before the copy is done (`tensor.to(device, non_blocking=True)`).
//!
//! On the driver, pinned memory comes from `cuMemHostAlloc` and a copy from
//! it is a DMA transfer queued on the device's stream: the call returns at
//! once and the device reads the host buffer later. Two things could then go
//! wrong, and both are made impossible here rather than left to the user:
//!
//! - **the source freed too early.** Every queued copy registers its source
//!   [`HostMemory`] (an `Arc`) in an in-flight list, which keeps it alive
//!   after the tensor that owned it is dropped, until the copy's [`Fence`]
//!   (an event recorded after the copy) has passed. The list is pruned at
//!   each new copy and at `Device::synchronize`.
//! - **the source overwritten too early.** Every host access to pinned
//!   memory goes through [`HostMemory::host_ptr`], which first waits for the
//!   copies still reading it. Reads wait too: host access is one pointer, so
//!   reads and writes cannot be told apart, and a read racing a DMA read is
//!   harmless but rare.
//!
//! Device→host copies always synchronise before the host sees the result
//! (a host tensor whose contents are still being written would be unsound to
//! read), so there is no asynchronous direction to guard there.
//!
//! Devices whose copies complete before returning (the emulator, and the
//! default methods of [`Gpu`]) hand out ordinary host memory flagged pinned
//! and fences that have already passed, but the bookkeeping above is the
//! same code, so CPU-only tests exercise it.

use super::driver::DriverGpu;
use super::Gpu;
use cudarc::driver::{result, sys, CudaEvent, PinnedHostSlice};
use kiln_ir::{Error, Result};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Tells when a queued copy has finished reading its source.
pub trait Fence: Send + Sync {
    /// Whether the copy is done, without waiting.
    fn done(&self) -> Result<bool>;
    /// Blocks until the copy is done.
    fn wait(&self) -> Result<()>;
}

/// The fence of a copy that completed before its call returned.
pub struct Finished;

impl Fence for Finished {
    fn done(&self) -> Result<bool> {
        Ok(true)
    }
    fn wait(&self) -> Result<()> {
        Ok(())
    }
}

/// An event recorded on the device stream right after a copy.
struct EventFence {
    event: CudaEvent,
    ordinal: u8,
}

impl Fence for EventFence {
    fn done(&self) -> Result<bool> {
        self.event
            .try_is_complete()
            .map_err(|e| fail(self.ordinal, "querying a copy's event", e))
    }
    fn wait(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(|e| fail(self.ordinal, "waiting for a copy", e))
    }
}

fn fail(ordinal: u8, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::op("cuda", format!("cuda:{ordinal}: {what}: {e:?}"))
}

/// What owns the bytes; dropped (freed) only after every copy from them passed.
/// (Held only to be freed when dropped.)
#[allow(dead_code)]
enum Bytes {
    PageLocked(PinnedHostSlice<u8>),
    Ordinary(Vec<u128>),
}

/// Host memory of a pinned storage: page-locked on a real device, else
/// ordinary memory that is only flagged pinned. See the module docs for the
/// rules that make asynchronous copies from it safe.
pub struct HostMemory {
    ptr: *mut u8,
    bytes: usize,
    /// The copies still reading this memory.
    pending: Mutex<Vec<Box<dyn Fence>>>,
    /// `pending.len()`, so host access without pending copies takes no lock.
    n_pending: AtomicUsize,
    owner: Option<Bytes>,
}

// SAFETY: the pointer is owned by `owner`; concurrent access to the bytes
// follows the storage's contract (the frontend orders kernels and copies), and
// the pending list is behind a mutex.
unsafe impl Send for HostMemory {}
unsafe impl Sync for HostMemory {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HostMemory {
    /// `bytes` of zeroed ordinary host memory, 16-byte aligned like every storage.
    pub fn ordinary(bytes: usize) -> HostMemory {
        let mut v = vec![0u128; bytes.div_ceil(16).max(1)];
        let ptr = v.as_mut_ptr() as *mut u8;
        HostMemory::new(ptr, bytes, Bytes::Ordinary(v))
    }

    fn new(ptr: *mut u8, bytes: usize, owner: Bytes) -> HostMemory {
        HostMemory {
            ptr,
            bytes,
            pending: Mutex::new(vec![]),
            n_pending: AtomicUsize::new(0),
            owner: Some(owner),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Whether the memory is really page-locked (false on the emulator).
    pub fn page_locked(&self) -> bool {
        matches!(self.owner, Some(Bytes::PageLocked(_)))
    }

    /// The base address for host code, once the copies still reading the
    /// memory are done (so a host write cannot corrupt them).
    ///
    /// Panics when waiting fails: the device faulted, and handing out the
    /// pointer could let the host overwrite bytes a copy still reads.
    pub fn host_ptr(&self) -> *mut u8 {
        if let Err(e) = self.wait_for_copies() {
            panic!("host access to pinned memory: {e}");
        }
        self.ptr
    }

    /// Blocks until every copy queued from this memory is done.
    pub fn wait_for_copies(&self) -> Result<()> {
        if self.n_pending.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut p = lock(&self.pending);
        for f in p.iter() {
            f.wait()?;
        }
        p.clear();
        self.n_pending.store(0, Ordering::Release);
        Ok(())
    }

    /// How many queued copies may still be reading this memory.
    pub fn pending_copies(&self) -> usize {
        self.n_pending.load(Ordering::Acquire)
    }

    /// Forgets the fences that passed; the number still pending.
    fn prune(&self) -> usize {
        let mut p = lock(&self.pending);
        // A fence whose query fails stays: keeping memory is safe, freeing it is not.
        p.retain(|f| !f.done().unwrap_or(false));
        self.n_pending.store(p.len(), Ordering::Release);
        p.len()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // Only the in-flight list drops memory with copies pending, after they
        // passed; this wait is a second line of defence.
        if self.wait_for_copies().is_err() {
            // The device faulted mid-copy: leaking the pages beats freeing
            // memory a DMA transfer may still read.
            std::mem::forget(self.owner.take());
        }
    }
}

/// Sources of copies that may still be running, kept alive until they pass.
static IN_FLIGHT: Mutex<Vec<Arc<HostMemory>>> = Mutex::new(vec![]);

/// Queues a copy of bytes `range` of `src` to the device address `dst` on
/// `gpu` and returns at once; `src` stays alive and host access to it waits
/// until the copy is done.
pub fn copy_to_device(
    gpu: &dyn Gpu,
    src: &Arc<HostMemory>,
    range: Range<usize>,
    dst: u64,
) -> Result<()> {
    assert!(range.end <= src.bytes, "copy range past the pinned buffer");
    retire();
    {
        let mut pending = lock(&src.pending);
        // SAFETY: the range lies in the buffer; the buffer outlives the copy (it joins
        // IN_FLIGHT below) and host access waits for the fence pushed here. The
        // pending lock is held so no concurrent wait sees the list without it.
        let fence = unsafe {
            let bytes = std::slice::from_raw_parts(src.ptr.add(range.start), range.len());
            gpu.copy_to_device_async(bytes, dst)?
        };
        pending.push(fence);
        src.n_pending.store(pending.len(), Ordering::Release);
    }
    lock(&IN_FLIGHT).push(src.clone());
    Ok(())
}

/// Releases the sources of copies that have finished.
pub fn retire() {
    lock(&IN_FLIGHT).retain(|m| m.prune() > 0);
}

/// Bytes of pinned memory held only because copies from it may still run
/// (each buffer counted once).
pub fn in_flight_bytes() -> usize {
    let v = lock(&IN_FLIGHT);
    let mut seen: Vec<*mut u8> = v.iter().map(|m| m.ptr).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.iter()
        .filter_map(|p| v.iter().find(|m| m.ptr == *p))
        .map(|m| m.bytes)
        .sum()
}

impl DriverGpu {
    /// `bytes` of zeroed page-locked memory, usable from every context
    /// (`CU_MEMHOSTALLOC_PORTABLE`; not write-combined, which would make host
    /// reads of a pinned tensor crawl).
    pub(crate) fn alloc_page_locked(&self, bytes: usize) -> Result<HostMemory> {
        let o = self.ordinal;
        // SAFETY: the memory is uninitialised until the write_bytes below, and
        // nothing reads it before then.
        let slice = unsafe {
            self.ctx
                .alloc_pinned_with_flags::<u8>(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .map_err(|e| fail(o, &format!("allocating {bytes} bytes of pinned memory"), e))?;
        // No copy was ever recorded on the slice's own event, so this does not wait.
        let ptr = slice.as_ptr().map_err(|e| fail(o, "pinned memory", e))? as *mut u8;
        // SAFETY: `ptr` is the start of `bytes.max(1)` freshly allocated bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(HostMemory::new(ptr, bytes, Bytes::PageLocked(slice)))
    }

    /// Queues `src` → `dst` on the stream and records the event that says
    /// when the DMA has read `src`.
    ///
    /// # Safety
    /// `src` is page-locked and stays alive and unwritten until the fence passes.
    pub(crate) unsafe fn copy_page_locked(&self, src: &[u8], dst: u64) -> Result<Box<dyn Fence>> {
        let o = self.ordinal;
        self.ctx.bind_to_thread().map_err(|e| fail(o, "bind", e))?;
        // SAFETY: `dst` has room for `src` (the destination storage was sized for it);
        // the caller keeps `src` alive and unchanged until the event below passes.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| fail(o, "copy to device", e))?;
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| fail(o, "recording a copy's event", e))?;
        Ok(Box::new(EventFence { event, ordinal: o }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Device;
    use crate::Storage;
    use kiln_ir::DType;

    /// One test, because the in-flight list is global: another test's copy
    /// would prune it between the steps checked here.
    #[test]
    fn async_copies_keep_their_source_alive_and_host_access_waits() {
        if !kiln_codegen::cuda::shim::compiler_present() {
            eprintln!("no c++ compiler: the emulator cannot open; skipped");
            return;
        }
        super::super::use_emulator();
        let dev = Device::cuda(0).unwrap();
        let vals: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let host = Storage::from_bytes(DType::F32, &bytes);
        assert!(!host.is_pinned());
        let pinned = host.pin(0..1000).unwrap();
        assert!(pinned.is_pinned() && pinned.device() == Device::Cpu);
        let mem = Arc::downgrade(pinned.pinned_memory().unwrap());

        // The source dropped right after the copy is queued stays alive.
        let d = pinned.to_device_non_blocking(dev, 10..1000).unwrap();
        assert_eq!(mem.upgrade().unwrap().pending_copies(), 1);
        drop(pinned);
        assert!(mem.upgrade().is_some(), "in flight: kept alive");
        assert!(in_flight_bytes() >= 4000);
        let back = d.to_device(Device::Cpu).unwrap();
        assert_eq!(unsafe { back.as_slice::<f32>() }, &vals[10..]);
        dev.synchronize().unwrap();
        assert!(
            mem.upgrade().is_none(),
            "released once the device passed it"
        );

        // Host access (a write here) waits for the copies reading the memory.
        let p = host.pin(0..1000).unwrap();
        let _d = p.to_device_non_blocking(dev, 0..1000).unwrap();
        let m = p.pinned_memory().unwrap().clone();
        assert_eq!(m.pending_copies(), 1);
        unsafe { p.as_mut_slice::<f32>()[0] = -1.0 };
        assert_eq!(m.pending_copies(), 0);
        assert!(!m.page_locked(), "the emulator flags ordinary memory");
    }
}
