//! Extern (hand-written, not generated) CPU kernels: GEMM, convolution,
//! pooling, embedding and fused attention.
//!
//! Every kernel is a pure function over slices of contiguous row-major data
//! (the caller makes inputs contiguous; GEMM operands may also be strided
//! views), writing into a caller-provided `&mut [T]`. Shapes and arguments are
//! checked beforehand by `kiln_ir::op::{matmul, conv, pool, embedding}`; the
//! kernels only assert that slice lengths match the geometry they are given.

pub mod attention;
pub mod conv;
pub mod conv_grad;
pub mod conv_transpose;
pub mod cpu_isa;
pub mod embedding;
pub mod gemm;
pub mod packed;
pub mod pool;
pub mod pool_backward;
pub mod qgemm;

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Sub};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element the extern kernels compute in: `f32` or `f64`
/// (f16/bf16 go through [`gemm::matmul_half`] or widen to f32 first).
pub trait Elem:
    sealed::Sealed
    + Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
    + crate::scratch::Zeroable
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn is_nan(self) -> bool;
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// A raw pointer that parallel workers share to write disjoint regions.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: only used to hand disjoint output regions to rayon workers.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// Accessor (a method, so closures capture the whole `Send` wrapper).
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Work (multiply-adds or element visits) below which a kernel stays on the
/// calling thread: rayon's fork/join costs a few microseconds.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;

/// Threads rayon would use from here.
pub(crate) fn threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
pub(crate) mod testutil {
    /// A tiny deterministic LCG for test data in [-1, 1).
    pub struct Lcg(pub u64);
    impl Lcg {
        pub fn next_f64(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        }
        pub fn vec<T: super::Elem>(&mut self, n: usize) -> Vec<T> {
            (0..n).map(|_| T::from_f64(self.next_f64())).collect()
        }
    }

    pub fn assert_close<T: super::Elem>(got: &[T], want: &[T], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let (g, w) = (g.to_f64(), w.to_f64());
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
    }
}
