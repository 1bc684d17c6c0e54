//! kiln-frontend: the strided [`Tensor`] and its eager ops.

pub mod autograd;
pub mod functional;
pub mod ops;
mod tensor;

pub use kiln_ir::{DType, Error, Result};
pub use ops::pointwise::Scalar;
pub use tensor::{Element, Tensor};
