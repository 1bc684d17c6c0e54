//! A template kernel's fused pointwise epilogue: a KernelIR pointwise kernel
//! over the template's output index space, emitted by the same scalar code as
//! every other kernel into the template's store, so the value goes through
//! it before it reaches memory (Conv + folded BatchNorm + ReLU, or
//! Linear + bias + GELU, in one launch).
//!
//! The epilogue kernel stores operand 0 — the template's output, of the
//! template's dtype — and its loads of operand 0 or of `value_operands`
//! read the template's value. Every other input gets a pointer `p{op}` (after
//! the template's own pointers) and one stride per output dim `s{op}_{d}`
//! plus the scalars `sc{n}` (after the template's sizes).

use super::scalar::{c_storage_type, CudaC};
use super::template::{ptr_params, Param};
use super::{declare_scalars, load, store_elem};
use crate::interp::{eval_value, validate};
use crate::kernel::{Instr, Kernel};
use kiln_ir::{DType, Error};

/// A pointwise kernel applied to a template's value before it is stored.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue<'a> {
    pub kernel: &'a Kernel,
    /// Inputs that read the template's value (views of its output).
    pub value_operands: &'a [usize],
}

impl Epilogue<'_> {
    /// The inputs that get a pointer of their own.
    pub fn inputs(&self) -> Vec<usize> {
        (1..self.kernel.operands.len())
            .filter(|op| !self.value_operands.contains(op))
            .collect()
    }
}

/// What an epilogue adds to a template's text and parameters.
#[derive(Default)]
pub(crate) struct Emitted {
    /// `const T* __restrict__ p{op}` for each input, and their params.
    pub ptrs: Vec<(String, Param)>,
    /// The strides and scalars, after the template's sizes.
    pub tail: Vec<(String, Param)>,
    /// Scalar conversions for the top of the kernel.
    pub scalars: String,
    /// Computes the stored value from `value` and stores it at `p0[oc]`.
    pub store: String,
    /// Helper functions the code needs, written before the kernel.
    pub helpers: String,
}

/// The epilogue `ep` (or a plain store) of a template of dtype `dt` whose
/// value is the C variable `value` at output index `idx` (one variable per
/// dim), indented to `indent` levels.
pub(crate) fn emit(
    op_name: &str,
    ep: Option<Epilogue>,
    dt: DType,
    idx: &[&str],
    value: &str,
    indent: usize,
) -> Result<Emitted, Error> {
    let Some(ep) = ep else {
        let pad = "  ".repeat(indent);
        return Ok(Emitted {
            store: format!("{pad}p0[oc] = {value};\n"),
            ..Emitted::default()
        });
    };
    let k = ep.kernel;
    check(op_name, k, dt, idx.len())?;
    let inputs = ep.inputs();
    let mut out = Emitted::default();
    for &op in &inputs {
        let st = c_storage_type(k.operands[op].dtype);
        out.ptrs
            .push((format!("const {st}* __restrict__ p{op}"), ptr_params(st).1));
        for d in 0..idx.len() {
            out.tail
                .push((format!("const long long s{op}_{d}"), Param::Int));
        }
    }
    for (n, s) in k.scalars.iter().enumerate() {
        out.tail.push(if s.is_float() {
            (format!("const double sc{n}"), Param::F64)
        } else {
            (format!("const long long sc{n}"), Param::Int)
        });
    }
    let mut e = CudaC {
        indent: 1,
        ..CudaC::default()
    };
    let scal = declare_scalars(&mut e, k);
    out.scalars = std::mem::take(&mut e.code);
    e.indent = indent;
    for &op in &inputs {
        let terms: Vec<String> = idx
            .iter()
            .enumerate()
            .map(|(d, i)| format!("{i} * s{op}_{d}"))
            .collect();
        e.line(&format!("const long long o{op} = {};", terms.join(" + ")));
    }
    let v = e.named(value);
    let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
        Instr::Load(op) if op == 0 || ep.value_operands.contains(&op) => (v, dt),
        Instr::Load(op) => load(e, k, op, &format!("o{op}")),
        Instr::Scalar(n) => (scal[n], k.scalars[n]),
        _ => unreachable!("a pointwise epilogue has no accumulator"),
    };
    let mut vals = vec![None; k.body.len()];
    let r = eval_value(&mut e, k, k.out, &mut vals, &mut leaf);
    store_elem(&mut e, k, (0, k.out), r, "p0[oc]");
    out.store = std::mem::take(&mut e.code);
    super::scalar::write_helpers(&mut out.helpers, &e.helpers);
    Ok(out)
}

fn check(op_name: &str, k: &Kernel, dt: DType, rank: usize) -> Result<(), Error> {
    validate(k)?;
    let bad = |why: String| Err(Error::op(op_name, format!("epilogue {}: {why}", k.name)));
    if k.reduce.is_some() || !k.extra_out.is_empty() {
        return bad("an epilogue is one pointwise store".into());
    }
    if k.rank != rank {
        return bad(format!(
            "rank {} (the {op_name} output has {rank} dims)",
            k.rank
        ));
    }
    if k.operands[0].dtype != dt {
        return bad(format!(
            "stores {} over a {dt} {op_name}",
            k.operands[0].dtype
        ));
    }
    Ok(())
}
