//! Memory accounting per device, in the spirit of `torch.cuda.memory_*`:
//! live bytes, their peak, what the caching allocator holds, and a readable
//! summary.
//!
//! * **allocated**: bytes of all live storages (`numel * dtype size`, every
//!   view counted once, since views share their storage);
//! * **peak**: the most `allocated` has been since the start or the last
//!   [`reset_peak_memory_stats`] (updated with `fetch_max` on every
//!   allocation);
//! * **reserved**: bytes of buffers taken from the OS and not given back: the
//!   live storages' buffers (rounded up to 16 bytes, large ones to the pool's
//!   4 KiB grain) plus the buffers cached by the caching allocator;
//! * **cached**: the caching allocator's free buffers (`reserved - live buffers`).
//!
//! The free functions report on the default device ([`Device::Cpu`]), like
//! PyTorch's `device=None`; `Device::Cuda(0).memory_stats()` and friends name
//! the device explicitly (each CUDA device has its own counters; its caching
//! is the driver's stream-ordered memory pool, so `cached` is 0 there).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A device whose memory is accounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    #[default]
    Cpu,
    /// A CUDA device by ordinal (at most [`MAX_CUDA_DEVICES`]); see [`crate::cuda`].
    Cuda(u8),
}

/// CUDA ordinals kiln accounts for.
pub const MAX_CUDA_DEVICES: usize = 8;

impl Device {
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A snapshot of one device's counters ([`memory_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub device: Device,
    /// Bytes of live storages.
    pub allocated: usize,
    /// Peak of `allocated` since the start or the last [`reset_peak_memory_stats`].
    pub peak: usize,
    /// Live storages' buffers plus the cached buffers.
    pub reserved: usize,
    /// Bytes of freed buffers the caching allocator keeps for reuse.
    pub cached: usize,
    /// Number of live storages (live tensors, views of one storage counted once).
    pub live_storages: usize,
    /// Storages created since the start.
    pub allocations: usize,
    /// Storages freed since the start.
    pub frees: usize,
    /// Large-buffer requests served from the caching allocator.
    pub pool_hits: usize,
    /// Large-buffer requests the pool could not serve (fresh buffer from the OS).
    pub pool_misses: usize,
    /// Cached blocks per size class: `(block bytes, count)`, smallest first.
    pub cached_blocks: Vec<(usize, usize)>,
}

/// Per-device counters, updated lock-free by the storage layer.
pub(crate) struct Counters {
    live: AtomicUsize,
    peak: AtomicUsize,
    live_buffers: AtomicUsize,
    live_storages: AtomicUsize,
    allocations: AtomicUsize,
    frees: AtomicUsize,
    pool_hits: AtomicUsize,
    pool_misses: AtomicUsize,
}

impl Counters {
    const fn new() -> Counters {
        Counters {
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            live_buffers: AtomicUsize::new(0),
            live_storages: AtomicUsize::new(0),
            allocations: AtomicUsize::new(0),
            frees: AtomicUsize::new(0),
            pool_hits: AtomicUsize::new(0),
            pool_misses: AtomicUsize::new(0),
        }
    }

    /// A storage of `bytes` in a buffer of `buffer_bytes` came to life.
    pub(crate) fn on_alloc(&self, bytes: usize, buffer_bytes: usize) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.live_buffers.fetch_add(buffer_bytes, Ordering::Relaxed);
        self.live_storages.fetch_add(1, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// A storage of `bytes` in a buffer of `buffer_bytes` was dropped.
    pub(crate) fn on_free(&self, bytes: usize, buffer_bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
        self.live_buffers.fetch_sub(buffer_bytes, Ordering::Relaxed);
        self.live_storages.fetch_sub(1, Ordering::Relaxed);
        self.frees.fetch_add(1, Ordering::Relaxed);
    }

    /// A large-buffer request was served from the pool (`hit`) or not.
    pub(crate) fn on_pool_request(&self, hit: bool) {
        let c = if hit {
            &self.pool_hits
        } else {
            &self.pool_misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

static CPU: Counters = Counters::new();
static CUDA: [Counters; MAX_CUDA_DEVICES] = [const { Counters::new() }; MAX_CUDA_DEVICES];

/// The counters of `device`.
pub(crate) fn counters(device: Device) -> &'static Counters {
    match device {
        Device::Cpu => &CPU,
        // ordinals past the last are refused when the device is opened
        Device::Cuda(n) => &CUDA[n as usize % MAX_CUDA_DEVICES],
    }
}

impl Device {
    /// Bytes held by live storages on this device.
    pub fn memory_allocated(self) -> usize {
        counters(self).live.load(Ordering::Relaxed)
    }

    /// Peak of [`Device::memory_allocated`] since the start or the last reset.
    pub fn max_memory_allocated(self) -> usize {
        counters(self).peak.load(Ordering::Relaxed)
    }

    /// Restarts peak tracking from the bytes allocated now.
    pub fn reset_peak_memory_stats(self) {
        let c = counters(self);
        c.peak
            .store(c.live.load(Ordering::Relaxed), Ordering::Relaxed);
        // an allocation racing with the store still raises the peak
        c.peak
            .fetch_max(c.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Bytes of freed buffers cached for reuse by the caching allocator.
    pub fn memory_cached(self) -> usize {
        match self {
            Device::Cpu => crate::storage::pool_state().0,
            Device::Cuda(_) => 0,
        }
    }

    /// Live storages' buffers plus the cached ones.
    pub fn memory_reserved(self) -> usize {
        counters(self).live_buffers.load(Ordering::Relaxed) + self.memory_cached()
    }

    /// A snapshot of every counter.
    pub fn memory_stats(self) -> MemoryStats {
        let c = counters(self);
        let (cached, cached_blocks) = match self {
            Device::Cpu => crate::storage::pool_state(),
            Device::Cuda(_) => (0, vec![]),
        };
        let allocated = c.live.load(Ordering::Relaxed);
        MemoryStats {
            device: self,
            allocated,
            peak: c.peak.load(Ordering::Relaxed).max(allocated),
            reserved: c.live_buffers.load(Ordering::Relaxed) + cached,
            cached,
            live_storages: c.live_storages.load(Ordering::Relaxed),
            allocations: c.allocations.load(Ordering::Relaxed),
            frees: c.frees.load(Ordering::Relaxed),
            pool_hits: c.pool_hits.load(Ordering::Relaxed),
            pool_misses: c.pool_misses.load(Ordering::Relaxed),
            cached_blocks,
        }
    }

    /// A readable table of [`Device::memory_stats`] (`torch.cuda.memory_summary()`).
    pub fn memory_summary(self) -> String {
        self.memory_stats().summary()
    }
}

/// Bytes held by live storages (all tensors, all views counted once).
pub fn memory_allocated() -> usize {
    Device::default().memory_allocated()
}

/// Peak of [`memory_allocated`] since the start or the last [`reset_peak_memory_stats`].
pub fn max_memory_allocated() -> usize {
    Device::default().max_memory_allocated()
}

/// Restarts peak tracking (`torch.cuda.reset_peak_memory_stats()`).
pub fn reset_peak_memory_stats() {
    Device::default().reset_peak_memory_stats()
}

/// Bytes held by the caching allocator for reuse (freed, not returned to the OS).
pub fn memory_cached() -> usize {
    Device::default().memory_cached()
}

/// Bytes taken from the OS and not returned: live buffers plus cached ones.
pub fn memory_reserved() -> usize {
    Device::default().memory_reserved()
}

/// A snapshot of the default device's counters.
pub fn memory_stats() -> MemoryStats {
    Device::default().memory_stats()
}

/// The default device's memory as a readable table.
pub fn memory_summary() -> String {
    Device::default().memory_summary()
}

/// `1536` -> `1.50 KiB`.
pub fn format_bytes(b: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

const WIDTH: usize = 72;

impl MemoryStats {
    /// The table printed by [`memory_summary`].
    pub fn summary(&self) -> String {
        let rule = |c: char| format!("|{}|\n", c.to_string().repeat(WIDTH));
        let row = |s: &mut String, name: &str, value: String| {
            let _ = writeln!(s, "| {name:<26}{value:>width$} |", width = WIDTH - 28);
        };
        let bytes = |b: usize| format!("{} ({b} bytes)", format_bytes(b));
        let mut s = rule('=');
        let title = format!("kiln memory summary, device: {}", self.device);
        let _ = writeln!(s, "|{title:^WIDTH$}|");
        s += &rule('-');
        row(&mut s, "Allocated memory", bytes(self.allocated));
        row(&mut s, "Peak allocated memory", bytes(self.peak));
        row(&mut s, "Reserved memory", bytes(self.reserved));
        row(&mut s, "Cached (free, in pool)", bytes(self.cached));
        s += &rule('-');
        row(
            &mut s,
            "Live tensors (storages)",
            self.live_storages.to_string(),
        );
        row(&mut s, "Allocations", self.allocations.to_string());
        row(&mut s, "Frees", self.frees.to_string());
        s += &rule('-');
        row(&mut s, "Pool hits", self.pool_hits.to_string());
        row(&mut s, "Pool misses", self.pool_misses.to_string());
        let blocks: usize = self.cached_blocks.iter().map(|b| b.1).sum();
        row(&mut s, "Cached blocks", blocks.to_string());
        for &(size, n) in &self.cached_blocks {
            row(
                &mut s,
                &format!("  {}", format_bytes(size)),
                format!("x {n}"),
            );
        }
        if self.device == Device::Cpu {
            // the JIT's machine code, bounded for long-running processes
            let k = crate::launch::kernel_cache();
            s += &rule('-');
            row(&mut s, "JIT kernels cached", k.kernels.to_string());
            row(&mut s, "JIT code", bytes(k.code_bytes));
            row(&mut s, "JIT code bound", bytes(k.limit));
            row(
                &mut s,
                "JIT generations / evicted",
                format!("{} / {}", k.generations, k.evicted),
            );
        }
        s += &rule('=');
        s
    }
}

impl std::fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_formatted_with_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 20), "3.00 MiB");
    }

    #[test]
    fn summary_lists_every_counter() {
        let st = MemoryStats {
            allocated: 1000,
            peak: 5000,
            reserved: 70000,
            cached: 65536,
            live_storages: 3,
            allocations: 9,
            frees: 6,
            pool_hits: 2,
            pool_misses: 1,
            cached_blocks: vec![(65536, 1)],
            ..MemoryStats::default()
        };
        let s = st.summary();
        for want in [
            "device: cpu",
            "(1000 bytes)",
            "(5000 bytes)",
            "(70000 bytes)",
            "64.00 KiB",
            "x 1",
        ] {
            assert!(s.contains(want), "{want:?} missing from\n{s}");
        }
        assert!(s.lines().all(|l| l.chars().count() == WIDTH + 2), "{s}");
    }
}
