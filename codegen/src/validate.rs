//! Well-formedness of a [`Kernel`]: what every backend may assume.

use crate::interp::instr_args;
use crate::kernel::{Instr, Kernel};
use kiln_ir::{Error, ReduceKind};

fn bad(msg: String) -> Error {
    Error::Codegen(msg)
}

/// Checks that a kernel is well formed (ids in range and defined before use,
/// operand/scalar indices valid, rank consistent with the
/// reduction, `acc` parts of the right kind, an operand for every output,
/// outputs loaded only by pointwise kernels).
pub fn validate(k: &Kernel) -> Result<(), Error> {
    let name = &k.name;
    if k.operands.is_empty() {
        return Err(bad(format!("kernel {name}: no output operand")));
    }
    if k.reduce.is_some() && k.rank == 0 {
        return Err(bad(format!("kernel {name}: a reduction needs rank >= 1")));
    }
    if k.reduce.is_none() && !k.epilogue.is_empty() {
        return Err(bad(format!("kernel {name}: epilogue without a reduction")));
    }
    let nb = k.body.len();
    let total = nb + k.epilogue.len();
    validate_rows(k, total)?;
    for (id, (ins, _)) in k.body.iter().chain(k.epilogue.iter()).enumerate() {
        let (args, n) = instr_args(ins);
        for &a in &args[..n] {
            if a >= id {
                return Err(bad(format!(
                    "kernel {name}: %{id} uses %{a} before its definition"
                )));
            }
        }
        match *ins {
            Instr::Load(o) if o >= k.operands.len() => {
                return Err(bad(format!("kernel {name}: %{id} loads operand {o}")));
            }
            Instr::Load(o) if k.reduce.is_some() && o < k.outputs() => {
                return Err(bad(format!(
                    "kernel {name}: %{id} loads the output of a reduction"
                )));
            }
            Instr::Scalar(n) if n >= k.scalars.len() => {
                return Err(bad(format!(
                    "kernel {name}: %{id} reads missing scalar {n}"
                )));
            }
            Instr::Acc | Instr::AccPart(_) if id < nb => {
                return Err(bad(format!("kernel {name}: acc in the body (%{id})")));
            }
            Instr::AccPart(p) if k.reduce.as_ref().map(|r| r.kind) != Some(p.kind()) => {
                return Err(bad(format!(
                    "kernel {name}: %{id} reads acc.{} of a reduction that is not {}",
                    p.name(),
                    p.kind()
                )));
            }
            _ => {}
        }
    }
    if let Some(r) = &k.reduce {
        if r.value >= nb {
            return Err(bad(format!(
                "kernel {name}: reduced value %{} is not a body value",
                r.value
            )));
        }
        let arg = matches!(r.kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
        if arg && r.dtype.is_float() {
            return Err(bad(format!(
                "kernel {name}: {} accumulates an index, not {}",
                r.kind, r.dtype
            )));
        }
        if r.kind.float_only() && !r.dtype.is_float() {
            return Err(bad(format!(
                "kernel {name}: {} accumulates floats, not {}",
                r.kind, r.dtype
            )));
        }
    } else if k.operands.len() < k.outputs() {
        return Err(bad(format!(
            "kernel {name}: {} outputs but {} operands",
            k.outputs(),
            k.operands.len()
        )));
    }
    for &v in std::iter::once(&k.out).chain(&k.extra_out) {
        if v >= total {
            return Err(bad(format!(
                "kernel {name}: stored value %{v} does not exist"
            )));
        }
    }
    Ok(())
}

/// The row pass: after a reduction, over operand 1 (an output), its values
/// built from epilogue values, loads of inputs and its own earlier values.
fn validate_rows(k: &Kernel, first: usize) -> Result<(), Error> {
    let Some(rows) = &k.rows else {
        return Ok(());
    };
    let name = &k.name;
    if k.reduce.is_none() {
        return Err(bad(format!(
            "kernel {name}: a row pass without a reduction"
        )));
    }
    if k.operands.len() < 2 {
        return Err(bad(format!(
            "kernel {name}: a row pass needs output operand 1"
        )));
    }
    for (j, (ins, _)) in rows.instrs.iter().enumerate() {
        let id = first + j;
        let (args, n) = instr_args(ins);
        if let Some(&a) = args[..n].iter().find(|&&a| a >= id || a < k.body.len()) {
            return Err(bad(format!(
                "kernel {name}: row value %{id} uses %{a} (only epilogue values and earlier row values)"
            )));
        }
        match *ins {
            Instr::Load(o) if o < k.outputs() || o >= k.operands.len() => {
                return Err(bad(format!(
                    "kernel {name}: row value %{id} loads operand {o}"
                )));
            }
            Instr::Scalar(n) if n >= k.scalars.len() => {
                return Err(bad(format!(
                    "kernel {name}: %{id} reads missing scalar {n}"
                )));
            }
            Instr::Acc | Instr::AccPart(_) => {
                return Err(bad(format!("kernel {name}: acc in the row pass (%{id})")));
            }
            _ => {}
        }
    }
    if rows.out < first || rows.out >= k.values() {
        return Err(bad(format!(
            "kernel {name}: the row pass stores %{}, not one of its values",
            rows.out
        )));
    }
    Ok(())
}

/// Rejects f16/bf16 anywhere in `k` (operands, scalars, values, the
/// accumulator), for backends that have no half type: the CPU JIT, whose
/// callers widen half tensors to f32 temporaries around the kernel.
pub(crate) fn reject_half(k: &Kernel, backend: &str) -> Result<(), Error> {
    let name = &k.name;
    let dts = k.operands.iter().map(|o| o.dtype);
    let dts = dts.chain(k.scalars.iter().copied());
    let rows = k.rows.iter().flat_map(|r| &r.instrs);
    let dts = dts.chain(
        k.body
            .iter()
            .chain(&k.epilogue)
            .chain(rows)
            .map(|(_, d)| *d),
    );
    let dts = dts.chain(k.reduce.as_ref().map(|r| r.dtype));
    for dt in dts {
        if dt.is_half() {
            return Err(bad(format!(
                "kernel {name}: {dt} must be widened to f32 by the caller ({backend} has no {dt})"
            )));
        }
    }
    Ok(())
}
