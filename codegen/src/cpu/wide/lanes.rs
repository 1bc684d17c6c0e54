//! [`Lanes`]: the handful of vector operations the wide helpers are written
//! in, implemented once per instruction set — 8 lanes (AVX2 + FMA), 16 lanes
//! (AVX-512F) and 1 lane (portable; the fallback and a test oracle).
//!
//! Every method is `#[inline(always)]`: the generic code built from them is
//! only ever instantiated inside a `#[target_feature]` function (see
//! `isa.rs`), where the intrinsics inline too. Masks are float vectors with
//! all bits set in true lanes, as Cranelift's vector compares give.

use kiln_ir::scalar::Cmp;

/// One instruction set's f32 vector.
pub(crate) trait Lanes {
    /// Lanes per vector.
    const N: usize;
    type F: Copy;

    /// # Safety
    /// `p` is valid for `N` f32 reads.
    unsafe fn load(p: *const f32) -> Self::F;
    /// # Safety
    /// `p` is valid for `N` f32 writes.
    unsafe fn store(p: *mut f32, v: Self::F);
    /// A store that bypasses the caches (`p` aligned to the vector). Other
    /// threads are sure to see it only after [`super::fence_streams`], which
    /// [`crate::CompiledKernel::call`] issues when the kernel returns.
    ///
    /// # Safety
    /// As [`Lanes::store`].
    unsafe fn store_nt(p: *mut f32, v: Self::F) {
        Self::store(p, v)
    }
    fn splat(x: f32) -> Self::F;
    /// Every lane has the bits `x`.
    fn splat_bits(x: u32) -> Self::F {
        Self::splat(f32::from_bits(x))
    }
    fn add(a: Self::F, b: Self::F) -> Self::F;
    fn sub(a: Self::F, b: Self::F) -> Self::F;
    fn mul(a: Self::F, b: Self::F) -> Self::F;
    fn div(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, rounded once.
    fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    fn sqrt(a: Self::F) -> Self::F;
    /// `a > b ? a : b` (x86 `maxps`: NaN in either gives `b`).
    fn max_fast(a: Self::F, b: Self::F) -> Self::F;
    fn floor(a: Self::F) -> Self::F;
    fn and(a: Self::F, b: Self::F) -> Self::F;
    fn or(a: Self::F, b: Self::F) -> Self::F;
    fn xor(a: Self::F, b: Self::F) -> Self::F;
    /// A mask of `a op b` (ordered compares; `Ne` is true when unordered).
    fn cmp(op: Cmp, a: Self::F, b: Self::F) -> Self::F;
    /// A mask of `a < b or unordered`.
    fn lt_or_unordered(a: Self::F, b: Self::F) -> Self::F;
    /// `m ? a : b` bit by bit.
    fn select(m: Self::F, a: Self::F, b: Self::F) -> Self::F;
    /// Whether any lane of the mask is set.
    fn any(m: Self::F) -> bool;
    /// Lane-wise i32 add / subtract of the bit patterns.
    fn iadd(a: Self::F, b: Self::F) -> Self::F;
    fn isub(a: Self::F, b: Self::F) -> Self::F;
    /// i32 lanes shifted left by 23 (into the exponent field).
    fn shl23(a: Self::F) -> Self::F;
    /// u32 lanes shifted right by 23 (the exponent field, logically).
    fn ushr23(a: Self::F) -> Self::F;
    /// i32 lanes shifted right by 1, arithmetically.
    fn sshr1(a: Self::F) -> Self::F;
    /// The i32 lanes converted to f32.
    fn i2f(a: Self::F) -> Self::F;
    /// Whether [`Lanes::scalef`] exists (one instruction, AVX-512's `vscalefps`).
    const SCALEF: bool = false;
    /// `a · 2^n` for integral `n`, rounded once. Only called where
    /// [`Lanes::SCALEF`] says it exists.
    fn scalef(_a: Self::F, _n: Self::F) -> Self::F {
        unreachable!("scalef is only called where Lanes::SCALEF")
    }
}

/// One lane, in plain Rust: the portable fallback.
pub(crate) struct Scalar;

#[inline(always)]
fn mask(b: bool) -> f32 {
    f32::from_bits(if b { u32::MAX } else { 0 })
}

#[inline(always)]
fn bits2(a: f32, b: f32, f: impl Fn(u32, u32) -> u32) -> f32 {
    f32::from_bits(f(a.to_bits(), b.to_bits()))
}

impl Lanes for Scalar {
    const N: usize = 1;
    type F = f32;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        *p
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        *p = v
    }
    #[inline(always)]
    fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn sqrt(a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    fn max_fast(a: f32, b: f32) -> f32 {
        if a > b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn floor(a: f32) -> f32 {
        a.floor()
    }
    #[inline(always)]
    fn and(a: f32, b: f32) -> f32 {
        bits2(a, b, |x, y| x & y)
    }
    #[inline(always)]
    fn or(a: f32, b: f32) -> f32 {
        bits2(a, b, |x, y| x | y)
    }
    #[inline(always)]
    fn xor(a: f32, b: f32) -> f32 {
        bits2(a, b, |x, y| x ^ y)
    }
    #[inline(always)]
    fn cmp(op: Cmp, a: f32, b: f32) -> f32 {
        mask(match op {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        })
    }
    #[inline(always)]
    fn lt_or_unordered(a: f32, b: f32) -> f32 {
        mask(!(a >= b))
    }
    #[inline(always)]
    fn select(m: f32, a: f32, b: f32) -> f32 {
        let m = m.to_bits();
        f32::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
    }
    #[inline(always)]
    fn any(m: f32) -> bool {
        m.to_bits() != 0
    }
    #[inline(always)]
    fn iadd(a: f32, b: f32) -> f32 {
        bits2(a, b, u32::wrapping_add)
    }
    #[inline(always)]
    fn isub(a: f32, b: f32) -> f32 {
        bits2(a, b, u32::wrapping_sub)
    }
    #[inline(always)]
    fn shl23(a: f32) -> f32 {
        f32::from_bits(a.to_bits() << 23)
    }
    #[inline(always)]
    fn ushr23(a: f32) -> f32 {
        f32::from_bits(a.to_bits() >> 23)
    }
    #[inline(always)]
    fn sshr1(a: f32) -> f32 {
        f32::from_bits(((a.to_bits() as i32) >> 1) as u32)
    }
    #[inline(always)]
    fn i2f(a: f32) -> f32 {
        a.to_bits() as i32 as f32
    }
}
