//! Eager ops on [`crate::Tensor`]. Pointwise ops and reductions build one
//! KernelIR each ([`kernel`]); composites come from `kiln_passes::decompose`.

pub mod composite;
mod creation;
mod diagonal;
pub mod elementwise;
pub mod fuse;
pub(crate) mod gather_kernel;
pub(crate) mod kernel;
pub(crate) mod nonzero;
pub mod pointwise;
pub mod reduce;
mod reduce_cascade;
pub mod reduce_more;
pub(crate) mod scan;
pub mod scatter;
pub(crate) mod sort;
pub mod view;
pub(crate) mod view_more;
