//! kiln-ir: the vocabulary every other kiln crate speaks — element types and
//! their promotion, shapes and broadcasting, the op kinds, shape/dtype inference,
//! and the one definition of scalar semantics ([`scalar::ScalarOps`]).
//!
//! It knows nothing of Cranelift, egg or CUDA.

pub mod dtype;
pub mod error;
pub mod graph;
pub mod interp;
pub mod op;
pub mod scalar;
pub mod shape;

pub use dtype::{promote_types, result_type, Category, DType, Operand};
pub use error::{Error, Result};
pub use graph::{Graph, NodeId};
pub use op::{BinaryOp, Float, ReduceKind, UnaryOp};
pub use shape::{Dims, Strides};
