//! kiln-passes: graph-level rewrites. For now, the decomposition table that
//! turns composite ops (softmax, norms, losses, ...) into primitives.

pub mod decompose;
pub mod decompose_loss;

pub use decompose::{Builder, Moments};
pub use decompose_loss::{ClassLossOpts, Reduction};
