//! `torch.utils`: [`checkpoint`] (activation checkpointing).

pub mod checkpoint;

pub use checkpoint::{checkpoint, Checkpointed};
