//! Pointwise kernels: a grid-stride loop over the flattened index space,
//! preceded, when the kernel is rank 1 with every operand contiguous, by a
//! vector path (see [`vector_width`]).

use super::scalar::Helper;
use super::{c_storage_type, decompose, load, load_elem, store, store_elem, CudaC, Cv};
use crate::interp::eval_value;
use crate::kernel::{Inner, Instr, Kernel};

/// Elements per thread of the vector path: 16 bytes of the widest operand
/// (4 for f32, 8 for f16/bf16, 2 for f64), or None when the kernel has none —
/// a reduction, rank other than 1, or an operand that is not contiguous.
pub fn vector_width(k: &Kernel) -> Option<usize> {
    if k.reduce.is_some() || k.rank != 1 {
        return None;
    }
    if k.operands.iter().any(|o| o.inner != Inner::Contiguous) {
        return None;
    }
    let widest = used(k).map(|op| k.operands[op].dtype.size()).max()?;
    Some(16 / widest)
}

/// The operands the kernel touches: its outputs and the inputs it loads (an
/// unused operand's pointer must not turn the vector path off).
fn used(k: &Kernel) -> impl Iterator<Item = usize> + '_ {
    let loaded = |op: usize| k.body.iter().any(|(i, _)| *i == Instr::Load(op));
    (0..k.operands.len()).filter(move |&op| op < k.outputs() || loaded(op))
}

pub(super) fn pointwise(e: &mut CudaC, k: &Kernel, scal: &[Cv]) {
    let mut total = if k.rank == 0 {
        "(start == 0 ? 1LL : 0LL)".to_string()
    } else {
        "(end > start ? end - start : 0LL)".to_string()
    };
    for d in 1..k.rank {
        total.push_str(&format!(" * n{d}"));
    }
    e.line(&format!("const long long total = {total};"));
    let tid = "(long long)blockIdx.x * blockDim.x + threadIdx.x";
    let from = match vector_width(k) {
        Some(w) => {
            vector_path(e, k, scal, w);
            format!("first + {tid}")
        }
        None => tid.to_string(),
    };
    e.line(&format!("for (long long flat = {from}; flat < total;"));
    e.line("     flat += (long long)gridDim.x * blockDim.x) {");
    e.indent += 1;
    decompose(e, k, "flat", k.rank, k.rank > 0);
    let mut vals = vec![None; k.body.len()];
    let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
        Instr::Load(op) => load(e, k, op, &format!("o{op}")),
        Instr::Scalar(n) => (scal[n], k.scalars[n]),
        _ => unreachable!("acc outside an epilogue"),
    };
    let stores = k.stores();
    let got: Vec<Cv> = stores
        .iter()
        .map(|s| eval_value(e, k, s.2, &mut vals, &mut leaf))
        .collect();
    for (&st, v) in stores.iter().zip(got) {
        store(e, k, st, v);
    }
    e.indent -= 1;
    e.line("}");
}

/// `kiln_vec<T, w>` for operand `op`.
fn vec_type(k: &Kernel, op: usize, w: usize) -> String {
    format!("kiln_vec<{}, {w}>", c_storage_type(k.operands[op].dtype))
}

/// Declares `first`, the flat index the scalar loop starts at: 0, or, when
/// the pointers `p{op} + start` are all aligned to their vector of `w`
/// elements, after the whole vectors, which this path covers — each thread
/// loads `w` elements of every operand it reads as one access per operand
/// (grid-stride over vectors), computes the `w` indices' values, then stores
/// one vector per output. The scalar loop then does the tail.
fn vector_path(e: &mut CudaC, k: &Kernel, scal: &[Cv], w: usize) {
    e.helpers.insert(Helper::Vec);
    let aligned: Vec<String> = used(k)
        .map(|op| {
            let mask = w * k.operands[op].dtype.size() - 1;
            format!("((unsigned long long)(p{op} + start) & {mask}ULL)")
        })
        .collect();
    e.line("long long first = 0LL;");
    e.line(&format!("if (({}) == 0ULL) {{", aligned.join(" | ")));
    e.indent += 1;
    e.line(&format!("const long long nvec = total / {w};"));
    e.line("for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec;");
    e.line("     v += (long long)gridDim.x * blockDim.x) {");
    e.indent += 1;
    let mut loaded = vec![false; k.operands.len()];
    let stores = k.stores();
    let mut got: Vec<Vec<Cv>> = vec![];
    for j in 0..w {
        let mut vals = vec![None; k.body.len()];
        let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
            Instr::Load(op) => {
                // one vector load per operand, at its first use (in element 0's code)
                if !std::mem::replace(&mut loaded[op], true) {
                    let ty = vec_type(k, op, w);
                    e.line(&format!(
                        "const {ty} x{op} = *reinterpret_cast<const {ty}*>(p{op} + start + {w} * v);"
                    ));
                }
                load_elem(e, k, op, &format!("x{op}.v[{j}]"))
            }
            Instr::Scalar(n) => (scal[n], k.scalars[n]),
            _ => unreachable!("acc outside an epilogue"),
        };
        got.push(
            stores
                .iter()
                .map(|s| eval_value(e, k, s.2, &mut vals, &mut leaf))
                .collect(),
        );
    }
    // every value of the vector before any store: an output may also be an input
    for (i, &(op, _, id)) in stores.iter().enumerate() {
        let ty = vec_type(k, op, w);
        e.line(&format!("{ty} y{op};"));
        for (j, vals) in got.iter().enumerate() {
            store_elem(e, k, (op, id), vals[i], &format!("y{op}.v[{j}]"));
        }
        e.line(&format!(
            "*reinterpret_cast<{ty}*>(p{op} + start + {w} * v) = y{op};"
        ));
    }
    e.indent -= 1;
    e.line("}");
    e.line(&format!("first = nvec * {w};"));
    e.indent -= 1;
    e.line("}");
}
