//! The KernelIR interpreter: runs a [`Kernel`] with exactly the [`crate::KernelFn`]
//! ABI, computing every scalar with the reference interpreter of `kiln-ir`
//! ([`kiln_ir::interp::Interp`]). It is the oracle the Cranelift backend is tested
//! against, and the definition of what a kernel means:
//!
//! - the loop space is `sizes[0..rank]`; dim 0 runs over `start..end` only;
//! - without a reduction, `out[i] = body(i)` for every index `i` (and
//!   operand `1 + j` gets `extra_out[j]`; all of an index's values are
//!   computed, from the operands as they were, before any is stored);
//! - with a reduction the innermost dim (`rank - 1`) is reduced: for every
//!   index of the other dims, the body values along that dim are combined in
//!   order (Sum, Prod, NaN-propagating Max/Min, or the first index of the
//!   max/min for ArgMax/ArgMin, where NaN counts as the extreme), starting
//!   from the identity (0, 1, -inf/+inf or the dtype's min/max); except that
//!   a float Sum none of whose loads is strided along the reduced dim adds in
//!   PyTorch's order (see [`sum_width`] and [`pytorch_sum`]), and that
//!   LogSumExp and Welford push the values in order into their running state
//!   ([`crate::online`]); then the epilogue runs once with `Acc` = that value
//!   (and `AccPart`s = the state's other results), its loads reading at
//!   reduce index 0, and its result is stored to the output at reduce index 0
//!   (`extra_out` at the following elements); a row pass then evaluates its
//!   value at every element of the row, with the epilogue's values, and
//!   stores it to operand 1 ([`crate::kernel::RowPass`]);
//! - when no dim is left to split (rank 0, or rank 1 with a reduction) the
//!   single output element is computed by the call with `start == 0`;
//! - a value is converted to the dtype its user needs with the cast rules of
//!   [`kiln_ir::scalar::ScalarOps::cast`] (load dtype -> instruction dtype,
//!   result -> output dtype);
//! - f16/bf16 operands are read and written with crate `half` (round to
//!   nearest even); a value of dtype f16/bf16 is rounded to it after every
//!   primitive, so an op computed in f32 and cast to f16 rounds once;
//! - only instructions the result depends on are evaluated; an epilogue may
//!   use body values, which are then evaluated at reduce index 0.

use crate::kernel::{Instr, Kernel, ValueId};
use crate::online;
pub use crate::validate::validate;
use kiln_ir::interp::{Interp, Val};
use kiln_ir::scalar::{lower_binary, lower_unary, Cmp, Prim2, ScalarOps};
use kiln_ir::{DType, ReduceKind};

/// The operands (value ids) an instruction reads.
pub(crate) fn instr_args(ins: &Instr) -> ([ValueId; 3], usize) {
    match *ins {
        Instr::Unary(_, a) | Instr::Cast(a) => ([a, 0, 0], 1),
        Instr::Binary(_, a, b) => ([a, b, 0], 2),
        Instr::Where(c, a, b) => ([c, a, b], 3),
        _ => ([0; 3], 0),
    }
}

/// What a leaf instruction (Load, Scalar, Acc) evaluates to, with its dtype.
pub(crate) type Leaf<'a, S> = dyn FnMut(&mut S, Instr) -> (<S as ScalarOps>::V, DType) + 'a;

/// Evaluates value `id` (and, first, whatever it depends on that is not yet in
/// `vals`) with the backend `s`. `vals` is indexed by value id (body, then epilogue).
/// This is the one place instruction semantics live; backends only provide `ScalarOps`.
pub(crate) fn eval_value<S: ScalarOps>(
    s: &mut S,
    k: &Kernel,
    id: ValueId,
    vals: &mut [Option<S::V>],
    leaf: &mut Leaf<'_, S>,
) -> S::V {
    if let Some(v) = vals[id] {
        return v;
    }
    let (ins, dt) = k.instr(id);
    let (args, n) = instr_args(&ins);
    for &a in &args[..n] {
        eval_value(s, k, a, vals, leaf);
    }
    let get = |vals: &[Option<S::V>], a: ValueId| vals[a].expect("evaluated above");
    let conv = |s: &mut S, x: S::V, from: DType, to: DType| {
        if from == to {
            x
        } else {
            s.cast(x, from, to)
        }
    };
    let v = match ins {
        Instr::Load(_) | Instr::Scalar(_) | Instr::Acc | Instr::AccPart(_) => {
            let (x, from) = leaf(s, ins);
            conv(s, x, from, dt)
        }
        Instr::Const(bits) => s.constant(f64::from_bits(bits), dt),
        Instr::Unary(op, a) => {
            let x = conv(s, get(vals, a), k.dtype_of(a), dt);
            lower_unary(s, op, x, dt)
        }
        Instr::Binary(op, a, b) => {
            let cd = k.dtype_of(a);
            let x = get(vals, a);
            let y = conv(s, get(vals, b), k.dtype_of(b), cd);
            let r = lower_binary(s, op, x, y, cd);
            let rd = if op.is_comparison() { DType::Bool } else { cd };
            conv(s, r, rd, dt)
        }
        Instr::Where(c, a, b) => {
            let c = conv(s, get(vals, c), k.dtype_of(c), DType::Bool);
            let x = conv(s, get(vals, a), k.dtype_of(a), dt);
            let y = conv(s, get(vals, b), k.dtype_of(b), dt);
            s.select(c, x, y, dt)
        }
        Instr::Cast(a) => conv(s, get(vals, a), k.dtype_of(a), dt),
    };
    vals[id] = Some(v);
    v
}

/// The starting value of a reduction whose values have dtype `dt` (for
/// LogSumExp the starting shift; Welford starts from an empty state).
pub fn reduce_identity(kind: ReduceKind, dt: DType) -> f64 {
    let (lo, hi) = match dt {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::I16 => (i16::MIN as f64, i16::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    };
    match kind {
        ReduceKind::Sum => 0.0,
        ReduceKind::Prod => 1.0,
        ReduceKind::Max | ReduceKind::ArgMax => lo,
        ReduceKind::Min | ReduceKind::ArgMin => hi,
        ReduceKind::LogSumExp => crate::online::lowest(dt),
        ReduceKind::Welford => 0.0,
    }
}

/// The vector width, in elements, of the PyTorch summation order that a
/// float Sum follows (see [`pytorch_sum`]): 8 for f32 and 4 for f64 (PyTorch's
/// `Vectorized` on AVX2), when the reduction is a Sum accumulating in f32/f64
/// and none of the operands the reduced value loads is strided along the
/// reduced dim (a row PyTorch would sum as a contiguous inner reduction).
/// `None`: the values are added one after the other.
pub fn sum_width(k: &Kernel) -> Option<usize> {
    let r = k.reduce.as_ref()?;
    let w = match (r.kind, r.dtype) {
        (ReduceKind::Sum, DType::F32) => 8,
        (ReduceKind::Sum, DType::F64) => 4,
        _ => return None,
    };
    let mut seen = vec![false; k.body.len()];
    let mut stack = vec![r.value];
    while let Some(id) = stack.pop() {
        if id >= k.body.len() || std::mem::replace(&mut seen[id], true) {
            continue;
        }
        let ins = k.body[id].0;
        if let Instr::Load(op) = ins {
            if k.operands[op].inner == crate::kernel::Inner::Strided {
                return None;
            }
        }
        let (args, n) = instr_args(&ins);
        stack.extend_from_slice(&args[..n]);
    }
    Some(w)
}

/// PyTorch's CPU float sum of one row (`cascade_sum` in ATen's
/// `SumKernel.cpp`, without its cascade, which starts at 64 vectors), with
/// vectors of `w` elements: rows shorter than `w` use `w = 1`. The row is cut
/// into vectors of `w`; four vector accumulators take vectors 0, 1, 2, 3, 4,
/// ... in turn while a whole group of four is left, the remaining whole
/// vectors go into the first; the four are added lane-wise, left to right.
/// The result starts at 0, adds the elements after the last whole vector in
/// order, then the lanes of the combined accumulator in order. So a row of 5
/// gives `(((x0 + x4) + x1) + x2) + x3`.
pub fn pytorch_sum<S: ScalarOps>(s: &mut S, xs: &[S::V], w: usize, dt: DType) -> S::V {
    let n = xs.len();
    let w = if n < w { 1 } else { w };
    let nv = n / w;
    let zero = s.constant(0.0, dt);
    let mut acc = vec![vec![zero; w]; 4];
    for j in 0..nv {
        let a = if j < nv / 4 * 4 { j % 4 } else { 0 };
        for l in 0..w {
            acc[a][l] = s.binary(Prim2::Add, acc[a][l], xs[j * w + l], dt);
        }
    }
    let (first, rest) = acc.split_at_mut(1);
    for other in rest.iter() {
        for (a, &b) in first[0].iter_mut().zip(other) {
            *a = s.binary(Prim2::Add, *a, b, dt);
        }
    }
    let mut r = zero;
    for &x in xs[nv * w..].iter().chain(&first[0]) {
        r = s.binary(Prim2::Add, r, x, dt);
    }
    r
}

unsafe fn read(ptr: *mut u8, elem_off: isize, dt: DType) -> Val {
    let p = ptr.offset(elem_off * dt.size() as isize);
    Val::from_le_bytes(std::slice::from_raw_parts(p, dt.size()), dt)
}

unsafe fn write(ptr: *mut u8, elem_off: isize, dt: DType, v: Val) {
    let p = ptr.offset(elem_off * dt.size() as isize);
    v.write_le_bytes(dt, std::slice::from_raw_parts_mut(p, dt.size()));
}

/// Runs `k` over the index space described by the [`crate::KernelFn`] arguments.
///
/// # Safety
/// Same contract as calling the compiled kernel: every pointer must be valid for
/// every element the sizes and strides address.
///
/// # Panics
/// If the kernel is malformed (see [`validate`]).
pub unsafe fn run_kernel(
    k: &Kernel,
    ptrs: &[*mut u8],
    strides: &[isize],
    sizes: &[usize],
    scalars: &[u64],
    start: usize,
    end: usize,
) {
    if let Err(e) = validate(k) {
        panic!("{e}");
    }
    let r = k.rank;
    let nops = k.operands.len();
    let scal: Vec<Val> = k
        .scalars
        .iter()
        .enumerate()
        .map(|(n, &d)| Val::from_arg_bits(scalars[n], d))
        .collect();
    let iter_dims = if k.reduce.is_some() { r - 1 } else { r };
    let stride = |op: usize, d: usize| strides[op * r + d];
    let mut idx = vec![0usize; iter_dims];
    if iter_dims == 0 {
        if start != 0 {
            return;
        }
    } else {
        if start >= end {
            return;
        }
        idx[0] = start;
        if (1..iter_dims).any(|d| sizes[d] == 0) {
            return;
        }
    }
    let mut offs = vec![0isize; nops];
    loop {
        for (op, o) in offs.iter_mut().enumerate() {
            *o = (0..iter_dims)
                .map(|d| idx[d] as isize * stride(op, d))
                .sum();
        }
        point(k, ptrs, &offs, &scal, sizes, &stride);
        // odometer: innermost iterated dim fastest
        let mut d = iter_dims;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            let hi = if d == 0 { end } else { sizes[d] };
            if idx[d] < hi {
                break;
            }
            if d == 0 {
                return;
            }
            idx[d] = 0;
        }
    }
}

/// Computes one output element (one full reduction when reducing).
unsafe fn point(
    k: &Kernel,
    ptrs: &[*mut u8],
    offs: &[isize],
    scal: &[Val],
    sizes: &[usize],
    stride: &dyn Fn(usize, usize) -> isize,
) {
    let s = &mut Interp;
    let total = k.values();
    let leaf_at = |j: usize| {
        move |_: &mut Interp, ins: Instr| -> (Val, DType) {
            match ins {
                Instr::Load(op) => {
                    let dt = k.operands[op].dtype;
                    let rd = if j == 0 {
                        0
                    } else {
                        j as isize * stride(op, k.rank - 1)
                    };
                    (read(ptrs[op], offs[op] + rd, dt), dt)
                }
                Instr::Scalar(n) => (scal[n], k.scalars[n]),
                _ => unreachable!("acc outside an epilogue"),
            }
        }
    };
    let Some(red) = &k.reduce else {
        // every value before any store: an output may also be an input
        let mut vals = vec![None; total];
        let stores = k.stores();
        let got: Vec<Val> = stores
            .iter()
            .map(|&(_, _, v)| eval_value(s, k, v, &mut vals, &mut leaf_at(0)))
            .collect();
        for (&(op, _, v), x) in stores.iter().zip(got) {
            let dt = k.operands[op].dtype;
            write(ptrs[op], offs[op], dt, s.cast(x, k.dtype_of(v), dt));
        }
        return;
    };
    let vd = k.dtype_of(red.value);
    let n = sizes[k.rank - 1];
    let row_stride = if k.rows.is_some() {
        stride(1, k.rank - 1)
    } else {
        0
    };
    let row_value = |s: &mut Interp, j: usize| {
        let mut vals = vec![None; total];
        let v = eval_value(s, k, red.value, &mut vals, &mut leaf_at(j));
        if vd == red.dtype {
            v
        } else {
            s.cast(v, vd, red.dtype)
        }
    };
    if online::is_online(red.kind) {
        let dt = red.dtype;
        let fin = if red.kind == ReduceKind::LogSumExp {
            let mut st = online::lse_init(s, dt);
            for j in 0..n {
                let v = row_value(s, j);
                st = online::lse_push(s, st, v, dt);
            }
            online::finish_lse(s, st, dt)
        } else {
            let mut st = online::welford_init(s, dt);
            for j in 0..n {
                let v = row_value(s, j);
                let inv = online::inv_count(s, Val::I(j as i64 + 1), dt);
                st = online::welford_push(s, st, v, inv, dt);
            }
            online::finish_welford(s, Val::I(n as i64), st, dt)
        };
        let at = |s: &mut Interp, ins: Instr, j: usize| leaf_at(j)(s, ins);
        return epilogue(k, ptrs, offs, &fin, dt, (n, row_stride), &at);
    }
    let arg = matches!(red.kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let cmp_dt = if arg { vd } else { red.dtype };
    let mut best = s.constant(reduce_identity(red.kind, cmp_dt), cmp_dt);
    let mut best_idx = 0i64;
    let width = sum_width(k);
    let mut row = vec![];
    for j in 0..n {
        let v = if arg {
            let mut vals = vec![None; total];
            eval_value(s, k, red.value, &mut vals, &mut leaf_at(j))
        } else {
            row_value(s, j)
        };
        match red.kind {
            ReduceKind::Sum if width.is_some() => row.push(v),
            ReduceKind::Sum => best = s.binary(Prim2::Add, best, v, cmp_dt),
            ReduceKind::Prod => best = s.binary(Prim2::Mul, best, v, cmp_dt),
            ReduceKind::Max => best = s.binary(Prim2::Max, best, v, cmp_dt),
            ReduceKind::Min => best = s.binary(Prim2::Min, best, v, cmp_dt),
            ReduceKind::ArgMax | ReduceKind::ArgMin => {
                let c = if red.kind == ReduceKind::ArgMax {
                    Cmp::Gt
                } else {
                    Cmp::Lt
                };
                if !best.is_nan() && (v.is_nan() || s.compare(c, v, best, cmp_dt).is_true()) {
                    best = v;
                    best_idx = j as i64;
                }
            }
            ReduceKind::LogSumExp | ReduceKind::Welford => unreachable!("online"),
        }
    }
    if let Some(w) = width {
        best = pytorch_sum(s, &row, w, cmp_dt);
    }
    let (acc, dt) = if arg {
        (Val::I(best_idx), DType::I64)
    } else {
        (best, red.dtype)
    };
    let fin = online::Finished {
        acc,
        first: acc,
        second: acc,
    };
    let at = |s: &mut Interp, ins: Instr, j: usize| leaf_at(j)(s, ins);
    epilogue(k, ptrs, offs, &fin, dt, (n, row_stride), &at);
}

/// Runs the epilogue with the finished reduction `fin` (of dtype `dt`) and
/// stores `out` and `extra_out` at the output's row element and the next
/// ones; then the row pass, if any, over the row's `row_len` elements
/// (`at(s, leaf, j)`: a leaf at element `j`).
unsafe fn epilogue(
    k: &Kernel,
    ptrs: &[*mut u8],
    offs: &[isize],
    fin: &online::Finished<Val>,
    dt: DType,
    (row_len, row_stride): (usize, isize),
    at: &dyn Fn(&mut Interp, Instr, usize) -> (Val, DType),
) {
    let base = |s: &mut Interp, ins: Instr| at(s, ins, 0);
    let row_leaf = |s: &mut Interp, ins: Instr, j: usize| at(s, ins, j);
    let s = &mut Interp;
    let out_dt = k.operands[0].dtype;
    let mut vals = vec![None; k.values()];
    let mut leaf = |s: &mut Interp, ins: Instr| match ins {
        Instr::Acc => (fin.get(None), dt),
        Instr::AccPart(p) => (fin.get(Some(p)), dt),
        _ => base(s, ins),
    };
    for (t, &o) in std::iter::once(&k.out).chain(&k.extra_out).enumerate() {
        let v = eval_value(s, k, o, &mut vals, &mut leaf);
        let v = s.cast(v, k.dtype_of(o), out_dt);
        write(ptrs[0], offs[0] + t as isize, out_dt, v);
    }
    if let Some(rows) = &k.rows {
        // the epilogue values the pass uses, once per row
        let epi = k.body.len()..k.body.len() + k.epilogue.len();
        for id in epi.clone() {
            eval_value(s, k, id, &mut vals, &mut leaf);
        }
        let row_dt = k.operands[1].dtype;
        for j in 0..row_len {
            let mut at = vals.clone();
            for v in &mut at[epi.end..] {
                *v = None;
            }
            let x = eval_value(s, k, rows.out, &mut at, &mut |s, ins| row_leaf(s, ins, j));
            let x = s.cast(x, k.dtype_of(rows.out), row_dt);
            write(ptrs[1], offs[1] + j as isize * row_stride, row_dt, x);
        }
    }
}

#[cfg(test)]
mod tests;
