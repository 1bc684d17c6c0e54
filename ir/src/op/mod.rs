//! The op vocabulary and its shape/dtype inference.

mod pointwise;

pub use pointwise::{BinaryOp, Float, ReduceKind, UnaryOp};
