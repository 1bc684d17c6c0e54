//! kiln-frontend: the strided [`Tensor`] and its eager ops.

pub mod amp;
pub mod autograd;
pub mod compile;
pub mod data;
mod device;
pub mod distributed;
pub mod functional;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod quantization;
pub mod random;
pub mod serialize;
mod tensor;
mod tensor_alloc;
pub mod utils;
pub mod warnings;

pub use device::host_fallbacks;
pub use kiln_ir::{DType, Error, Result};
pub use kiln_runtime::Device;
pub use ops::pointwise::Scalar;
pub use ops::reduce_more::NormOrd;
pub use ops::scatter::ScatterReduce;
pub use tensor::{Element, Tensor};
