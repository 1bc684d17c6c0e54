//! Fallible host allocation: every buffer kiln allocates on the host (tensor
//! storage, the caching allocator's blocks, extern kernels' scratch) goes
//! through here, so running out of memory is an `Err` naming the op, the
//! element count and the bytes asked for, never an abort inside `vec!`.

use kiln_ir::{Error, Result};

/// `len` zeroed elements of `T`, or an error naming `op` when the size
/// overflows or the allocator refuses (a `ulimit -v`, an overcommit limit).
/// Zeroed pages come from `calloc`, so a large buffer costs nothing until
/// it is written.
///
/// ```
/// let v: Vec<f32> = kiln_runtime::scratch::try_zeroed("conv2d", 1024).unwrap();
/// assert_eq!(v.len(), 1024);
/// let e = kiln_runtime::scratch::try_zeroed::<f32>("conv2d", usize::MAX / 2).unwrap_err();
/// assert!(e.to_string().starts_with("conv2d: cannot allocate"));
/// ```
pub fn try_zeroed<T: Zeroable>(op: &str, len: usize) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    let Some(bytes) = len.checked_mul(size).filter(|&b| b <= isize::MAX as usize) else {
        return Err(too_big(op, len, size));
    };
    if bytes == 0 {
        return Ok(std::iter::repeat_with(T::zero).take(len).collect());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| too_big(op, len, size))?;
    // SAFETY: the layout has a non-zero size; a null return is checked.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return Err(out_of_memory(op, len, bytes));
    }
    // SAFETY: allocated by the global allocator with `T`'s alignment for
    // exactly `len` elements, all bytes zero, which `Zeroable` says is a valid `T`.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Grows `v` to `len` elements (new ones zero), as `Vec::resize` would, but
/// fallibly: the scratch buffers extern kernels keep between calls.
///
/// ```
/// let mut v: Vec<f64> = vec![];
/// kiln_runtime::scratch::try_resize("conv2d", &mut v, 8).unwrap();
/// assert_eq!(v, vec![0.0; 8]);
/// ```
pub fn try_resize<T: Zeroable>(op: &str, v: &mut Vec<T>, len: usize) -> Result<()> {
    if len > v.len() {
        let size = std::mem::size_of::<T>();
        v.try_reserve_exact(len - v.len()).map_err(|_| {
            match len.checked_mul(size).filter(|&b| b <= isize::MAX as usize) {
                Some(bytes) => out_of_memory(op, len, bytes),
                None => too_big(op, len, size),
            }
        })?;
    }
    v.resize_with(len, T::zero);
    Ok(())
}

fn too_big(op: &str, len: usize, size: usize) -> Error {
    Error::op(
        op,
        format!("cannot allocate {len} elements of {size} bytes: the byte size overflows"),
    )
}

fn out_of_memory(op: &str, len: usize, bytes: usize) -> Error {
    Error::op(
        op,
        format!(
            "cannot allocate {bytes} bytes ({len} elements, {}) on the host: out of memory",
            human(bytes)
        ),
    )
}

/// `1.5 GiB`: the size in a message a person reads.
pub(crate) fn human(bytes: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// Element types whose all-zero bit pattern is a valid value, `zero()`
/// (what `alloc_zeroed` hands out).
///
/// # Safety
/// Implementors must be plain numbers with no padding or niche.
pub unsafe trait Zeroable: Copy {
    fn zero() -> Self;
}

macro_rules! zeroable {
    ($($t:ty),*) => { $(
        // SAFETY: a plain number; all-zero bits are 0.
        unsafe impl Zeroable for $t { fn zero() -> Self { 0 as $t } }
    )* };
}
zeroable!(u8, i8, u16, i16, u32, i32, u64, i64, u128, usize, isize, f32, f64);

// SAFETY: all-zero bits are +0.0.
unsafe impl Zeroable for half::f16 {
    fn zero() -> Self {
        half::f16::ZERO
    }
}
// SAFETY: as for f16.
unsafe impl Zeroable for half::bf16 {
    fn zero() -> Self {
        half::bf16::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_requests_are_errors_that_name_the_op_and_bytes() {
        // 2^60 f32 = 4 EiB: no machine grants it, so the allocator returns null
        let e = try_zeroed::<f32>("outer", 1 << 60).unwrap_err().to_string();
        assert!(
            e.starts_with("outer: cannot allocate 4611686018427387904 bytes"),
            "{e}"
        );
        let e = try_zeroed::<f64>("mm", usize::MAX / 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overflows"), "{e}");
        let mut v: Vec<u8> = vec![];
        let e = try_resize("im2col", &mut v, usize::MAX / 2)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("im2col: cannot allocate"), "{e}");
    }

    #[test]
    fn zeroed_buffers_are_zero() {
        let v: Vec<u128> = try_zeroed("t", 5000).unwrap();
        assert!(v.iter().all(|&x| x == 0));
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
