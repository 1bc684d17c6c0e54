//! Eager ops on [`crate::Tensor`]. Pointwise ops and reductions build one
//! KernelIR each ([`kernel`]); composites come from `kiln_passes::decompose`.

pub mod composite;
pub mod elementwise;
pub mod fuse;
pub(crate) mod gather_kernel;
pub(crate) mod kernel;
pub mod pointwise;
pub mod reduce;
mod reduce_cascade;
pub mod view;
