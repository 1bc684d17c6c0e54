//! Cranelift backend (in progress).
