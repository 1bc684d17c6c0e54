//! The CPU backend's convolution algorithm choice (the analogue of
//! `torch.backends.cudnn.benchmark`): with benchmarking on, the first call
//! of a conv shape times every applicable algorithm (im2col + GEMM,
//! Winograd F(2x2, 3x3), depthwise, 1x1 GEMM) and keeps the fastest, in
//! memory and under the kiln cache dir (`$KILN_CACHE_DIR`, else
//! `<tmp>/kiln-cache`), keyed by shape, dtype, threads and ISA. It is on by
//! default inside compiled graphs and off for eager ops, where a fixed
//! heuristic picks.
//!
//! ```
//! kiln::backends::cpu::set_benchmark(true);
//! assert!(kiln::backends::cpu::benchmark_enabled());
//! println!("vector ISA: {}", kiln::backends::cpu::isa().name());
//! ```

pub use kiln_runtime::externs::conv::select::{
    benchmark_enabled, describe, set_benchmark, take_last_run, with_algorithm, Chosen, ConvAlgo,
};
pub use kiln_runtime::externs::cpu_isa::{detect as isa, Isa};
