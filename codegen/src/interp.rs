//! KernelIR interpreter (in progress).
