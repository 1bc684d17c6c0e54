//! The views of a template kernel's fused epilogue (see
//! `kiln_codegen::cuda::epilogue`), checked against the template's output
//! and turned into launch words.

use super::launch::launch_device;
use crate::launch::View;
use crate::memory::Device;
use crate::storage::Storage;
use kiln_codegen::Kernel;
use kiln_ir::op::Layout;
use kiln_ir::{bail, Result};

/// A pointwise kernel over a template's output (operand 0 the output, every
/// operand viewed with the output's canonical dims), its views and scalar
/// bits; inputs viewing the output itself read the template's value.
pub struct EpilogueViews<'a> {
    pub kernel: &'a Kernel,
    pub views: &'a [View<'a>],
    pub scalars: &'a [u64],
}

/// What an epilogue adds to a launch.
pub(super) struct EpilogueArgs {
    /// The inputs that read the template's value.
    pub value_operands: Vec<usize>,
    /// Pointers of the other inputs, in operand order.
    pub ptrs: Vec<u64>,
    /// Their strides (operand-major), then the scalars.
    pub tail: Vec<u64>,
    /// One-element CPU operands copied for the launch: they must outlive it
    /// (device frees are ordered after the launch on its stream).
    pub uploads: Vec<Storage>,
}

/// Checks `e` against `out`, the template's contiguous output seen as
/// `dims`, on `dev`, and lays out its launch words.
pub(super) fn epilogue_args(
    name: &str,
    e: &EpilogueViews,
    out: View,
    dims: &[usize],
    dev: Device,
) -> Result<EpilogueArgs> {
    let k = e.kernel;
    if e.views.len() != k.operands.len() {
        bail!(
            name,
            "epilogue {}: {} views for {} operands",
            k.name,
            e.views.len(),
            k.operands.len()
        );
    }
    launch_device(name, e.views)?;
    let mut whole = Layout::contiguous(dims);
    whole.offset = out.layout.offset;
    let mut args = EpilogueArgs {
        value_operands: vec![],
        ptrs: vec![],
        tail: vec![],
        uploads: vec![],
    };
    for (op, v) in e.views.iter().enumerate() {
        if v.layout.dims.as_slice() != dims {
            bail!(
                name,
                "epilogue {} operand {op} has shape {:?}, not the output's {dims:?}",
                k.name,
                v.layout.dims
            );
        }
        let is_out = std::ptr::eq(v.storage, out.storage) && *v.layout == whole;
        if op == 0 && !is_out {
            bail!(name, "epilogue {} must store to the {name} output", k.name);
        }
        if op == 0 {
            continue;
        }
        if is_out {
            args.value_operands.push(op);
            continue;
        }
        let base = if v.storage.device() == dev {
            v.storage.device_ptr()
        } else {
            args.uploads.push(v.storage.to_device(dev)?);
            args.uploads.last().expect("just pushed").device_ptr()
        };
        args.ptrs
            .push(base + (v.layout.offset * v.dtype().size()) as u64);
        args.tail
            .extend(v.layout.strides.iter().map(|&s| s as i64 as u64));
    }
    args.tail.extend_from_slice(e.scalars);
    Ok(args)
}
