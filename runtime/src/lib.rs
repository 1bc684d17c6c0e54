//! kiln-runtime: CPU storage, launching generated kernels through the kernel
//! cache, and extern kernels (GEMM, convolution, pooling, embedding).

pub mod atomic_file;
pub mod cache_dir;
pub mod cuda;
pub mod deterministic;
pub mod externs;
pub mod launch;
pub mod memory;
pub mod par;
pub mod profiler;
pub mod scratch;
pub mod storage;
pub mod strided;

pub use launch::{cache_stats, convert, launch, log_enabled, record_kernels, CacheStats, View};
pub use memory::{
    max_memory_allocated, memory_allocated, memory_cached, memory_reserved, memory_stats,
    memory_summary, reset_peak_memory_stats, Device, MemoryStats,
};
pub use storage::Storage;
