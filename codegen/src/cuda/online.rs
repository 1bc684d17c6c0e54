//! CUDA C for the one-pass reductions of [`crate::online`] (log-sum-exp and
//! Welford). Same launch shape as the other reductions: one block per row,
//! each thread pushes a strided slice of the row into its running state, the
//! states merge across each warp with `__shfl_down_sync` (every component
//! shuffled), warp leaders meet in shared memory, and thread 0 finishes the
//! state, runs the epilogue and stores `out` (and `extra_out` after it).
//! A row pass then runs on every thread over its slice of the row, reading
//! the stored parts back after a block barrier.

use super::{
    c_literal, c_type, close_row, decompose, inner_term, load, store_elem, store_epilogue, CudaC,
    Cv,
};
use crate::interp::eval_value;
use crate::kernel::{Instr, Kernel};
use crate::online::{self, Finished, Lse, Moments};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::{DType, ReduceKind};

/// The running state's variables: `(name, dtype, initial value)`.
fn components(kind: ReduceKind, cd: DType) -> Vec<(&'static str, DType, String)> {
    let z = c_literal(0.0, cd);
    if kind == ReduceKind::LogSumExp {
        vec![
            ("acc_m", cd, c_literal(online::lowest(cd), cd)),
            ("acc_s", cd, z),
        ]
    } else {
        vec![
            ("acc_n", DType::I64, "0LL".into()),
            ("acc_mean", cd, z.clone()),
            ("acc_m2", cd, z),
        ]
    }
}

/// `name = value;` for each state variable.
fn assign(e: &mut CudaC, names: &[Cv], vals: &[Cv]) {
    for (n, v) in names.iter().zip(vals) {
        let l = format!("{} = {};", e.name(*n), e.name(*v));
        e.line(&l);
    }
}

/// Merges the state `other` (values named like the state) into the state.
fn merge(e: &mut CudaC, kind: ReduceKind, cd: DType, st: &[Cv], other: &[Cv]) {
    if kind == ReduceKind::LogSumExp {
        let a = Lse { m: st[0], s: st[1] };
        let b = Lse {
            m: other[0],
            s: other[1],
        };
        let r = online::lse_merge(e, a, b, cd);
        assign(e, st, &[r.m, r.s]);
    } else {
        let na = e.cast(st[0], DType::I64, cd);
        let nb = e.cast(other[0], DType::I64, cd);
        let a = Moments {
            mean: st[1],
            m2: st[2],
        };
        let b = Moments {
            mean: other[1],
            m2: other[2],
        };
        let r = online::welford_merge(e, (na, a), (nb, b), cd);
        let n = e.binary(kiln_ir::scalar::Prim2::Add, st[0], other[0], DType::I64);
        assign(e, st, &[n, r.mean, r.m2]);
    }
}

/// The body of a LogSumExp or Welford reduction kernel.
pub(super) fn reduction(e: &mut CudaC, k: &Kernel, scal: &[Cv]) {
    let red = k.reduce.as_ref().expect("reduction");
    let (kind, vd, cd) = (red.kind, k.dtype_of(red.value), red.dtype);
    let comps = components(kind, cd);
    let kept = k.rank - 1;
    let last = k.rank - 1;
    let mut rows = if kept == 0 {
        "(start == 0 ? 1LL : 0LL)".to_string()
    } else {
        "(end > start ? end - start : 0LL)".to_string()
    };
    for d in 1..kept {
        rows.push_str(&format!(" * n{d}"));
    }
    e.line(&format!("const long long rows = {rows};"));
    e.line("const int lane = threadIdx.x & 31;");
    e.line("const int warp = threadIdx.x >> 5;");
    e.line("const int nwarps = (blockDim.x + 31) >> 5;");
    for (n, dt, _) in &comps {
        e.line(&format!("__shared__ {} sh_{n}[32];", c_type(*dt)));
    }
    e.line("for (long long row = blockIdx.x; row < rows; row += gridDim.x) {");
    e.indent += 1;
    decompose(e, k, "row", kept, false);
    for (n, dt, init) in &comps {
        e.line(&format!("{} {n} = {init};", c_type(*dt)));
    }
    let st: Vec<Cv> = comps.iter().map(|(n, _, _)| e.named(*n)).collect();
    // Each thread: elements threadIdx.x, threadIdx.x + blockDim.x, ...
    e.line(&format!(
        "for (long long j = threadIdx.x; j < n{last}; j += blockDim.x) {{"
    ));
    e.indent += 1;
    let mut vals = vec![None; k.body.len()];
    let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
        Instr::Load(op) => load(e, k, op, &format!("o{op}{}", inner_term(k, op, "j"))),
        Instr::Scalar(n) => (scal[n], k.scalars[n]),
        _ => unreachable!("acc outside an epilogue"),
    };
    let v = eval_value(e, k, red.value, &mut vals, &mut leaf);
    let x = if vd == cd { v } else { e.cast(v, vd, cd) };
    if kind == ReduceKind::LogSumExp {
        let r = online::lse_push(e, Lse { m: st[0], s: st[1] }, x, cd);
        assign(e, &st, &[r.m, r.s]);
    } else {
        e.line("acc_n += 1LL;");
        let inv = online::inv_count(e, st[0], cd);
        let m = Moments {
            mean: st[1],
            m2: st[2],
        };
        let r = online::welford_push(e, m, x, inv, cd);
        assign(e, &st[1..], &[r.mean, r.m2]);
    }
    e.indent -= 1;
    e.line("}");
    // Warp, then block.
    let shuffle = |e: &mut CudaC| {
        e.line("for (int off = 16; off > 0; off >>= 1) {");
        e.indent += 1;
        let other: Vec<Cv> = comps
            .iter()
            .map(|(n, dt, _)| e.tmp(*dt, format!("__shfl_down_sync(0xffffffffu, {n}, off)")))
            .collect();
        merge(e, kind, cd, &st, &other);
        e.indent -= 1;
        e.line("}");
    };
    shuffle(e);
    e.line("if (lane == 0) {");
    for (n, _, _) in &comps {
        e.line(&format!("  sh_{n}[warp] = {n};"));
    }
    e.line("}");
    e.line("__syncthreads();");
    e.line("if (warp == 0) {");
    e.indent += 1;
    for (n, _, init) in &comps {
        e.line(&format!("{n} = lane < nwarps ? sh_{n}[lane] : {init};"));
    }
    shuffle(e);
    e.line("if (lane == 0) {");
    e.indent += 1;
    let fin: Finished<Cv> = if kind == ReduceKind::LogSumExp {
        online::finish_lse(e, Lse { m: st[0], s: st[1] }, cd)
    } else {
        let m = Moments {
            mean: st[1],
            m2: st[2],
        };
        online::finish_welford(e, st[0], m, cd)
    };
    // Epilogue at reduce index 0 (the row's base offsets).
    let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
        Instr::Acc => (fin.acc, cd),
        Instr::AccPart(p) => (fin.get(Some(p)), cd),
        Instr::Load(op) => load(e, k, op, &format!("o{op}")),
        Instr::Scalar(n) => (scal[n], k.scalars[n]),
        _ => unreachable!(),
    };
    store_epilogue(e, k, &mut leaf);
    row_pass(e, k, scal);
    close_row(e);
}

/// Whether the CUDA backend can run `k`'s row pass: after a one-pass
/// reduction, reading only epilogue values that are stored (each thread
/// reads them back from the output once thread 0 has stored them).
pub(super) fn check_row_pass(k: &Kernel) -> Result<(), kiln_ir::Error> {
    if k.rows.is_none() {
        return Ok(());
    }
    let online = k.reduce.as_ref().is_some_and(|r| online::is_online(r.kind));
    let stored: Vec<usize> = k.stores().iter().map(|s| s.2).collect();
    if !online || k.row_pass_reads().iter().any(|v| !stored.contains(v)) {
        return Err(kiln_ir::Error::Codegen(format!(
            "kernel {}: the CUDA row pass needs a one-pass reduction and only stored epilogue values",
            k.name
        )));
    }
    Ok(())
}

/// The row pass (see [`crate::kernel::RowPass`]), after the block barrier
/// that follows thread 0's stores: every thread reads the row's stored
/// parts back and walks its slice of the row, storing to operand 1.
fn row_pass(e: &mut CudaC, k: &Kernel, scal: &[Cv]) {
    let Some(rows) = &k.rows else {
        return;
    };
    let last = k.rank - 1;
    e.line(&format!(
        "for (long long j = threadIdx.x; j < n{last}; j += blockDim.x) {{"
    ));
    e.indent += 1;
    let mut vals = vec![None; k.values()];
    let reads = k.row_pass_reads();
    for (_, t, v) in k.stores() {
        if reads.contains(&v) {
            let (x, dt) = load(e, k, 0, &format!("o0 + {t}"));
            let want = k.dtype_of(v);
            vals[v] = Some(if dt == want { x } else { e.cast(x, dt, want) });
        }
    }
    let mut leaf = |e: &mut CudaC, ins: Instr| match ins {
        Instr::Load(op) => load(e, k, op, &format!("o{op}{}", inner_term(k, op, "j"))),
        Instr::Scalar(n) => (scal[n], k.scalars[n]),
        _ => unreachable!("checked by check_row_pass"),
    };
    let v = eval_value(e, k, rows.out, &mut vals, &mut leaf);
    let at = format!("p1[o1{}]", inner_term(k, 1, "j"));
    store_elem(e, k, (1, rows.out), v, &at);
    e.indent -= 1;
    e.line("}");
    // the next row's thread 0 overwrites the shared state
    e.line("__syncthreads();");
}
