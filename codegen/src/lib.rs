//! kiln-codegen: KernelIR ([`kernel`]) and its backends — the reference
//! interpreter ([`interp`]) and Cranelift machine code for the CPU ([`cpu`]).
//! Backends are pure functions of a [`Kernel`].

pub mod cpu;
pub mod cuda;
pub mod interp;
pub mod kernel;
pub mod online;
mod validate;

pub use kernel::{
    AccPart, Inner, Instr, Kernel, KernelBuilder, KernelFn, Operand, Reduction, RowPass, ValueId,
};
