//! The op vocabulary and its shape/dtype inference.

pub mod infer;
mod pointwise;
pub mod matmul;
pub mod conv;
pub mod pool;
pub mod embedding;
pub mod view;
mod vocab;

pub use infer::Meta;
pub use pointwise::{BinaryOp, Float, ReduceKind, UnaryOp};
pub use view::Layout;
pub use vocab::Op;
