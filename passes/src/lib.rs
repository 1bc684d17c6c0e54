//! kiln-passes: graph-level rewrites — the decomposition table that turns
//! composite ops (softmax, norms, losses, ...) into primitives, and the
//! e-graph rewrite stage of `compile()` ([`rewrite`]).

pub mod decompose;
pub mod decompose_loss;
pub mod decompose_loss_more;
pub mod rewrite;

pub use decompose::{Builder, Moments};
pub use decompose_loss::{ClassLossOpts, Reduction};
pub mod fusion;
pub mod lower;
pub mod memory_plan;
pub mod partition;
