//! The op vocabulary and its shape/dtype inference.

pub mod attention;
pub mod conv;
pub mod embedding;
pub mod infer;
mod infer_kernels;
pub mod matmul;
pub mod overlap;
mod pointwise;
pub mod pool;
pub mod quantized;
mod table;
mod values;
pub mod view;
mod vocab;
mod vocab_infer;

pub use infer::Meta;
pub use pointwise::{Float, ReduceKind};
pub use table::{BinaryDtype, BinaryOp, Domain, UnaryDtype, UnaryOp};
pub use values::{Reduction, ScalarValue};
pub use view::Layout;
pub use vocab::{Op, CHECKED_INDEX_OPS};
