//! kiln-runtime: CPU storage, launching generated kernels through the kernel
//! cache, and extern kernels (GEMM, convolution, pooling, embedding).

pub mod externs;
pub mod launch;
pub mod storage;
pub mod strided;

pub use launch::{cache_stats, convert, launch, record_kernels, CacheStats, View};
pub use storage::{memory_allocated, memory_cached, Storage};
