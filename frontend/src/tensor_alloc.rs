//! Making fresh tensors without trusting the shape: element counts and byte
//! sizes are checked before anything is allocated, allocation failure is an
//! error naming the op, the shape, the dtype and the bytes, and `full` writes
//! its dtype directly (no wider temporary per element).

use crate::Tensor;
use kiln_ir::op::Layout;
use kiln_ir::shape::{checked_nbytes, fmt_dims};
use kiln_ir::{DType, Error, Result};
use kiln_runtime::{Device, Storage};
use std::sync::Arc;

impl Tensor {
    /// A fresh contiguous tensor on `device` for the result of `op`, contents
    /// unspecified: the fallible allocation every op's output goes through.
    ///
    /// ```
    /// use kiln_frontend::{DType, Device, Tensor};
    /// let e = Tensor::empty_for("add", &[1 << 40, 1 << 30], DType::F32, Device::Cpu).unwrap_err();
    /// assert!(e.to_string().starts_with("add: "), "{e}");
    /// ```
    pub fn empty_for(op: &str, dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let bytes = checked_nbytes(op, dims, dtype.size())?;
        let l = Layout::contiguous(dims);
        let s = Storage::empty_on(device, dtype, l.numel())
            .map_err(|e| alloc_error(op, dims, dtype, device, bytes, e))?;
        Ok(Tensor::from_parts(Arc::new(s), l))
    }

    /// Zero-filled [`Tensor::empty_for`].
    pub fn zeros_for(op: &str, dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let bytes = checked_nbytes(op, dims, dtype.size())?;
        let l = Layout::contiguous(dims);
        let s = Storage::zeros_on(device, dtype, l.numel())
            .map_err(|e| alloc_error(op, dims, dtype, device, bytes, e))?;
        Ok(Tensor::from_parts(Arc::new(s), l))
    }

    /// `torch.zeros` that returns an error instead of panicking when the
    /// shape is too big or memory runs out.
    ///
    /// ```
    /// use kiln_frontend::{DType, Tensor};
    /// let e = Tensor::try_zeros(&[1 << 32, 1 << 32], DType::F32).unwrap_err();
    /// assert!(e.to_string().contains("zeros: shape [4294967296,4294967296]"), "{e}");
    /// ```
    pub fn try_zeros(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::zeros_for("zeros", dims, dtype, Device::Cpu)
    }

    /// `torch.empty`, fallibly (see [`Tensor::try_zeros`]).
    pub fn try_empty(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::empty_for("empty", dims, dtype, Device::Cpu)
    }

    /// `torch.full`, fallibly: the value is converted to `dtype` once and
    /// the storage filled with that element's bytes.
    ///
    /// ```
    /// use kiln_frontend::{DType, Tensor};
    /// let t = Tensor::try_full(&[3], 2.5, DType::F16).unwrap();
    /// assert_eq!(t.to_f64_vec(), vec![2.5; 3]);
    /// ```
    pub fn try_full(dims: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        if value == 0.0 {
            return Tensor::zeros_for("full", dims, dtype, Device::Cpu);
        }
        let t = Tensor::empty_for("full", dims, dtype, Device::Cpu)?;
        let one = element_bytes(value, dtype);
        // SAFETY: the fresh storage is ours alone and holds numel elements.
        let bytes = unsafe { std::slice::from_raw_parts_mut(t.storage.ptr(), t.storage.nbytes()) };
        fill_pattern(bytes, &one);
        Ok(t)
    }

    /// `torch.ones`, fallibly.
    pub fn try_ones(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::try_full(dims, 1.0, dtype)
    }
}

/// The bytes of one `dtype` element holding `value`, rounded as a cast rounds.
fn element_bytes(value: f64, dtype: DType) -> Vec<u8> {
    let src = Storage::from_bytes(DType::F64, &value.to_le_bytes());
    let dst = Storage::empty(dtype, 1);
    let l = Layout::contiguous(&[1]);
    kiln_runtime::convert(
        kiln_runtime::View {
            storage: &src,
            layout: &l,
        },
        kiln_runtime::View {
            storage: &dst,
            layout: &l,
        },
    );
    // SAFETY: no kernel writes `dst`.
    unsafe { dst.bytes() }.to_vec()
}

/// Fills `out` with copies of `one` (an element's bytes), a word at a time.
fn fill_pattern(out: &mut [u8], one: &[u8]) {
    match one.len() {
        1 => out.fill(one[0]),
        2 => fill_as::<u16>(out, one),
        4 => fill_as::<u32>(out, one),
        8 => fill_as::<u64>(out, one),
        _ => out
            .chunks_exact_mut(one.len())
            .for_each(|c| c.copy_from_slice(one)),
    }
}

fn fill_as<W: Copy>(out: &mut [u8], one: &[u8]) {
    let size = std::mem::size_of::<W>();
    assert_eq!(one.len(), size);
    // SAFETY: `one` holds exactly one W (read unaligned); storage is 16-byte
    // aligned and holds a whole number of elements of this size.
    let w: W = unsafe { std::ptr::read_unaligned(one.as_ptr() as *const W) };
    let n = out.len() / size;
    debug_assert_eq!(out.as_ptr() as usize % std::mem::align_of::<W>(), 0);
    let words = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut W, n) };
    words.fill(w);
}

fn alloc_error(
    op: &str,
    dims: &[usize],
    dtype: DType,
    device: Device,
    bytes: usize,
    cause: Error,
) -> Error {
    let why = match cause {
        Error::Op { msg, .. } => msg,
        other => other.to_string(),
    };
    Error::op(
        op,
        format!(
            "cannot allocate {bytes} bytes for a {dtype} tensor of shape {} on {device} ({why})",
            fmt_dims(dims)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_writes_each_dtype_directly() {
        for dt in [
            DType::U8,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
            DType::Bool,
        ] {
            let t = Tensor::try_full(&[5], 3.0, dt).unwrap();
            let want = if dt == DType::Bool { 1.0 } else { 3.0 };
            assert_eq!(t.to_f64_vec(), vec![want; 5], "{dt}");
        }
        assert_eq!(
            Tensor::try_full(&[2], -1.0, DType::U8)
                .unwrap()
                .to_f64_vec(),
            vec![255.0; 2]
        );
    }

    #[test]
    fn overflowing_and_huge_shapes_are_errors() {
        let e = Tensor::try_zeros(&[1 << 32, 1 << 32], DType::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[4294967296,4294967296]"), "{e}");
        let e = Tensor::empty_for("mul", &[1 << 40, 1 << 22], DType::F32, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("mul: shape [1099511627776,4194304] of 4-byte elements"),
            "{e}"
        );
        // 2^58 bytes: past any address space, whatever the overcommit policy
        let e = Tensor::empty_for("mul", &[1 << 28, 1 << 28], DType::F32, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("mul: cannot allocate 288230376151711744 bytes for a f32 tensor of shape [268435456,268435456] on cpu"),
            "{e}"
        );
    }
}
