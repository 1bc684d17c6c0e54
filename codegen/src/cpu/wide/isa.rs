//! One [`TileIsa`] per instruction set: each loop of `tile.rs` instantiated
//! inside a function compiled for that ISA (`#[target_feature]`), so the
//! generic code and its intrinsics inline into AVX2 or AVX-512 machine code.

use super::lanes::{Lanes, Scalar};
use super::tile::{self, Src, TileIsa};
use kiln_ir::scalar::{Cmp, Prim1, Prim2};
use kiln_ir::UnaryOp;

macro_rules! tile_isa {
    ($(#[$doc:meta])* $name:ident, $lanes:ty $(, $feat:literal)?) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl TileIsa for $name {
            unsafe fn unary(op: Prim1, x: Src, out: *mut f32, n: usize) {
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(op: Prim1, x: Src, out: *mut f32, n: usize) {
                    tile::unary::<$lanes>(op, x, out, n)
                }
                go(op, x, out, n)
            }
            unsafe fn binary(op: Prim2, a: Src, b: Src, out: *mut f32, n: usize) {
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(op: Prim2, a: Src, b: Src, out: *mut f32, n: usize) {
                    tile::binary::<$lanes>(op, a, b, out, n)
                }
                go(op, a, b, out, n)
            }
            unsafe fn compare(op: Cmp, a: Src, b: Src, out: *mut f32, n: usize) {
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(op: Cmp, a: Src, b: Src, out: *mut f32, n: usize) {
                    tile::compare::<$lanes>(op, a, b, out, n)
                }
                go(op, a, b, out, n)
            }
            unsafe fn fused(op: UnaryOp, p: *mut f32, n: usize) -> bool {
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(op: UnaryOp, p: *mut f32, n: usize) -> bool {
                    tile::fused::<$lanes>(op, p, n)
                }
                go(op, p, n)
            }
            unsafe fn select(c: Src, a: Src, b: Src, out: *mut f32, n: usize) {
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(c: Src, a: Src, b: Src, out: *mut f32, n: usize) {
                    tile::select::<$lanes>(c, a, b, out, n)
                }
                go(c, a, b, out, n)
            }
        }
    };
}

tile_isa!(
    /// One lane of plain Rust: the fallback, and the tails of the others.
    Portable,
    Scalar
);

#[cfg(target_arch = "x86_64")]
tile_isa!(
    /// 8 lanes, AVX2 + FMA.
    Avx2Tiles,
    super::avx2::Avx2,
    "avx2,fma"
);

#[cfg(target_arch = "x86_64")]
tile_isa!(
    /// 16 lanes, AVX-512F.
    Avx512Tiles,
    super::avx512::Avx512,
    "avx512f"
);

/// Lanes of the portable fallback.
pub(crate) const PORTABLE_LANES: usize = Scalar::N;
