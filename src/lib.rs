//! kiln: a deep-learning engine with PyTorch's working habits.
//!
//! ```
//! use kiln::Tensor;
//! let x = Tensor::from_vec(vec![-1.0f32, 0.5, 2.0], &[3]).unwrap();
//! let y = x.relu().unwrap();
//! assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 0.5, 2.0]);
//! ```

pub mod backends;
pub mod bench;
pub mod checkpoint;
/// `kiln export` and `kiln run` (the deployment commands).
pub mod deploy;
pub mod doctor;
/// `torch.export` for kiln: a model as one self-contained `.kiln` file.
pub mod export;
/// Architectures from torchvision and transformers under their own key names.
pub mod models;
/// NumPy `.npy` files.
pub mod npy;
/// ONNX export and import (`kiln::onnx::export`, `kiln::onnx::load`).
pub mod onnx;
pub mod plot;
pub mod serve;
pub mod summary;
pub mod tensorboard;
pub mod train;

pub use kiln_frontend::amp;
pub use kiln_frontend::autograd;
/// `torch.compile` for kiln: [`compile::compile`] a module, [`compile::compile_fn`] a function.
pub use kiln_frontend::compile;
/// `torch.distributed`: process groups on MPI (feature `mpi`) or NCCL, collectives,
/// `DistributedDataParallel`, `DistributedSampler`, `SyncBatchNorm`.
pub use kiln_frontend::distributed;
pub use kiln_frontend::functional;
pub use kiln_frontend::nn;
pub use kiln_frontend::optim;
pub use kiln_frontend::quantization;
pub use kiln_frontend::random::manual_seed;
/// `torch.utils`: `utils::checkpoint` and the `utils::Checkpointed` wrapper.
pub use kiln_frontend::utils;
pub use kiln_frontend::{data, random, serialize};
pub use kiln_frontend::{
    host_fallbacks, DType, Device, Element, Error, NormOrd, Result, Scalar, ScatterReduce, Tensor,
};
pub use kiln_passes::{ClassLossOpts, Reduction};
pub use kiln_runtime::cuda;
/// `torch.use_deterministic_algorithms`; see [`runtime::deterministic`] for what it changes.
pub use kiln_runtime::deterministic::{
    are_deterministic_algorithms_enabled, use_deterministic_algorithms,
};

/// The IR vocabulary (dtypes, shapes, ops, op parameters).
pub use kiln_ir as ir;
/// Runtime introspection: kernel-cache counters, memory in use.
pub use kiln_runtime as runtime;
/// Memory accounting: `memory_allocated()`, `max_memory_allocated()`, `memory_summary()`, ...
pub use kiln_runtime::memory;
/// `torch.profiler`: `profiler::profile(|| ..)` records ops, kernels, extern calls,
/// compiles and backward nodes; `Profile::table` and `Profile::export_chrome_trace`.
pub use kiln_runtime::profiler;
