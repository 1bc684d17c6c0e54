//! The loop nest of a kernel function, following the [`crate::KernelFn`] ABI:
//! dim 0 over `start..end`, dims 1..rank-1 in full, per-operand byte offsets
//! accumulated from the strides (views and broadcasts are index arithmetic).
//!
//! The innermost dim is either a pointwise row (here) or a reduction
//! (`reduce.rs`). A pointwise row with a vector plan runs an f32x4/f64x2 loop
//! unrolled twice (two independent bodies per iteration, the second at an
//! immediate offset), then a scalar tail; broadcast operands are loaded once
//! per row, before the loop.

use super::emit::{flags, scalar_ty, Emitter};
use super::plan::Plan;
use crate::interp::eval_value;
use crate::kernel::{Inner, Instr, Kernel};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, Value};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::DType;

/// Values computed once, in the entry block.
pub(crate) struct Frame {
    pub sizes: Vec<Value>,
    pub bases: Vec<Value>,
    /// Byte strides, `[operand][dim]`.
    pub bstr: Vec<Vec<Value>>,
    /// Scalar arguments in their dtype (`Kernel::scalars`), scalar form.
    pub scal: Vec<Value>,
    pub start: Value,
    pub end: Value,
}

impl Frame {
    /// Elements of the whole launch (the product of its sizes): the wide
    /// helpers stream their output past the caches when that is large.
    pub(crate) fn launch_elements(&self, em: &mut Emitter) -> Value {
        let one = em.b.ins().iconst(types::I64, 1);
        self.sizes.iter().fold(one, |n, &s| em.b.ins().imul(n, s))
    }

    /// The row after `row` of operand `op` in a kernel of `rank` dims: one
    /// stride of the dim above the row's on (null for a kernel of one row).
    /// After the last row of that dim it is some other address, so it is
    /// only ever prefetched, never read.
    pub(crate) fn next_row(&self, em: &mut Emitter, rank: usize, row: Value, op: usize) -> Value {
        match rank {
            0 | 1 => em.b.ins().iconst(types::I64, 0),
            r => em.b.ins().iadd(row, self.bstr[op][r - 2]),
        }
    }
}

fn log2_size(dt: DType) -> i64 {
    dt.size().trailing_zeros() as i64
}

/// Emits the whole function body into the (empty) function of `em`.
pub(crate) fn build(k: &Kernel, em: &mut Emitter, plan: &Plan) {
    let entry = em.b.create_block();
    em.b.append_block_params_for_function_params(entry);
    em.b.switch_to_block(entry);
    em.b.seal_block(entry);
    let p = em.b.block_params(entry).to_vec();
    let (a_ptrs, a_strides, a_sizes, a_scalars) = (p[0], p[1], p[2], p[3]);
    em.pool_base = Some(em.b.ins().symbol_value(types::I64, em.pool_gv));
    let r = k.rank;
    let i64t = types::I64;
    let mut fr = Frame {
        sizes: vec![],
        bases: vec![],
        bstr: vec![],
        scal: vec![],
        start: p[4],
        end: p[5],
    };
    for op in 0..k.operands.len() {
        let base = em.b.ins().load(i64t, flags(), a_ptrs, (op * 8) as i32);
        fr.bases.push(base);
        let sh = log2_size(k.operands[op].dtype);
        let mut row = vec![];
        for d in 0..r {
            let s =
                em.b.ins()
                    .load(i64t, flags(), a_strides, ((op * r + d) * 8) as i32);
            row.push(if sh == 0 {
                s
            } else {
                em.b.ins().ishl_imm_u(s, sh)
            });
        }
        fr.bstr.push(row);
    }
    for d in 0..r {
        let s = em.b.ins().load(i64t, flags(), a_sizes, (d * 8) as i32);
        fr.sizes.push(s);
    }
    for (n, &dt) in k.scalars.iter().enumerate() {
        let raw = em.b.ins().load(i64t, flags(), a_scalars, (n * 8) as i32);
        em.lanes = 1;
        let v = if dt.is_float() {
            let f =
                em.b.ins()
                    .bitcast(types::F64, cranelift_codegen::ir::MemFlagsData::new(), raw);
            em.cast(f, DType::F64, dt)
        } else {
            em.cast(raw, DType::I64, dt)
        };
        fr.scal.push(v);
    }
    let bases = fr.bases.clone();
    if r == 0 || (r == 1 && k.reduce.is_some()) {
        // Nothing to split: the call with start == 0 computes the single output.
        let zero = em.b.ins().icmp_imm_u(IntCC::Equal, fr.start, 0);
        let (then, done) = (em.b.create_block(), em.b.create_block());
        em.b.ins().brif(zero, then, &[], done, &[]);
        em.b.seal_block(then);
        em.b.switch_to_block(then);
        if r == 0 {
            single_point(k, em, &fr, &bases);
        } else {
            super::reduce::reduce_row(k, em, &fr, plan, &bases);
        }
        em.b.ins().jump(done, &[]);
        em.b.seal_block(done);
        em.b.switch_to_block(done);
    } else {
        outer(k, em, &fr, plan, 0, &bases);
    }
    em.b.ins().return_(&[]);
}

/// `for i in (lo..hi).step_by(step)`: `pre` runs once before the first iteration
/// (only when there is one), `body` is emitted once. Leaves the builder in the exit block.
pub(crate) fn for_loop<T>(
    em: &mut Emitter,
    lo: Value,
    hi: Value,
    step: i64,
    pre: impl FnOnce(&mut Emitter) -> T,
    body: impl FnOnce(&mut Emitter, Value, &T),
) {
    let (pre_b, body_b, exit) = (
        em.b.create_block(),
        em.b.create_block(),
        em.b.create_block(),
    );
    let i = em.b.append_block_param(body_b, types::I64);
    let go = em.b.ins().icmp(IntCC::SignedLessThan, lo, hi);
    em.b.ins().brif(go, pre_b, &[], exit, &[]);
    em.b.seal_block(pre_b);
    em.b.switch_to_block(pre_b);
    let t = pre(em);
    // The constant pool's address is threaded through the loop as an opaque
    // block parameter, so pool loads stay next to their uses (see `Emitter::vconst`).
    let outer_base = em.pool_base;
    let base = em.b.append_block_param(body_b, types::I64);
    em.b.ins()
        .jump(body_b, &[lo.into(), outer_base.unwrap().into()]);
    em.b.switch_to_block(body_b);
    em.pool_base = Some(base);
    body(em, i, &t);
    let next = em.b.ins().iadd_imm_s(i, step);
    let next_base = em.b.ins().iadd_imm_s(base, 0);
    let more = em.b.ins().icmp(IntCC::SignedLessThan, next, hi);
    em.b.ins()
        .brif(more, body_b, &[next.into(), next_base.into()], exit, &[]);
    em.b.seal_block(body_b);
    em.b.seal_block(exit);
    em.b.switch_to_block(exit);
    em.pool_base = outer_base;
}

fn outer(k: &Kernel, em: &mut Emitter, fr: &Frame, plan: &Plan, d: usize, ptrs: &[Value]) {
    let inner = k.rank - 1;
    let (lo, hi) = if d == 0 {
        (fr.start, fr.end)
    } else {
        (em.b.ins().iconst(types::I64, 0), fr.sizes[d])
    };
    if d + 1 == inner {
        if let Some(cplan) = super::columns::plan(k) {
            let row_at = |em: &mut Emitter, j: Value| {
                let next = step_ptrs(em, fr, d, j, ptrs);
                super::reduce::reduce_row(k, em, fr, plan, &next);
            };
            super::columns::outer_loop(k, em, fr, cplan, lo, hi, ptrs, &row_at);
            return;
        }
    }
    if d == inner {
        if k.reduce.is_some() {
            super::reduce::reduce_row(k, em, fr, plan, ptrs);
        } else {
            pointwise_row(k, em, fr, plan, lo, hi, ptrs);
        }
        return;
    }
    for_loop(
        em,
        lo,
        hi,
        1,
        |_| (),
        |em, i, _| {
            let next = step_ptrs(em, fr, d, i, ptrs);
            outer(k, em, fr, plan, d + 1, &next);
        },
    );
}

/// Every operand's pointer at index `i` of dim `d`.
pub(crate) fn step_ptrs(
    em: &mut Emitter,
    fr: &Frame,
    d: usize,
    i: Value,
    ptrs: &[Value],
) -> Vec<Value> {
    (0..ptrs.len())
        .map(|op| {
            let off = em.b.ins().imul(i, fr.bstr[op][d]);
            em.b.ins().iadd(ptrs[op], off)
        })
        .collect()
}

/// Loads along the innermost dim of one row (pointwise or reduced).
pub(crate) struct Row<'r> {
    pub k: &'r Kernel,
    pub fr: &'r Frame,
    pub ptrs: &'r [Value],
    /// Operands the evaluated values load.
    pub loaded: Vec<usize>,
}

impl Row<'_> {
    /// Broadcast operands' values, loaded once (splatted in vector mode), by
    /// operand; after them, by body value, the [`hoisted`] values this row
    /// loads everything for, computed once per row instead of per element.
    pub(crate) fn preload(&self, em: &mut Emitter) -> Vec<Option<Value>> {
        let mut out = vec![None; self.k.operands.len()];
        for &op in &self.loaded {
            let o = self.k.operands[op];
            if o.inner == Inner::Broadcast {
                let v =
                    em.b.ins()
                        .load(scalar_ty(o.dtype), flags(), self.ptrs[op], 0);
                out[op] = Some(em.splat_if_vector(v, o.dtype));
            }
        }
        let hoist = hoisted(self.k);
        if !hoist.iter().any(|&h| h) {
            return out;
        }
        let (k, fr, loads) = (self.k, self.fr, out.clone());
        let mut vals = vec![None; k.values()];
        let mut leaf = |em: &mut Emitter, ins: Instr| -> (Value, DType) {
            match ins {
                Instr::Load(op) => (loads[op].expect("checked below"), k.operands[op].dtype),
                Instr::Scalar(n) => (em.splat_if_vector(fr.scal[n], k.scalars[n]), k.scalars[n]),
                _ => unreachable!("hoisted values read loads and scalars only"),
            }
        };
        let loaded = |id: usize| loaded_by(k, &[id]).iter().all(|&op| loads[op].is_some());
        let ids: Vec<usize> = (0..k.body.len())
            .filter(|&id| hoist[id] && loaded(id))
            .collect();
        for &id in &ids {
            eval_value(em, k, id, &mut vals, &mut leaf);
        }
        out.resize(k.operands.len() + k.values(), None);
        for id in ids {
            out[k.operands.len() + id] = vals[id];
        }
        out
    }

    /// Address of operand `op`'s element `i` along the innermost dim.
    pub(crate) fn addr(&self, em: &mut Emitter, op: usize, i: Value) -> Value {
        let o = self.k.operands[op];
        let off = match o.inner {
            Inner::Broadcast => return self.ptrs[op],
            Inner::Contiguous => {
                let sh = log2_size(o.dtype);
                if sh == 0 {
                    i
                } else {
                    em.b.ins().ishl_imm_u(i, sh)
                }
            }
            Inner::Strided => em.b.ins().imul(i, self.fr.bstr[op][self.k.rank - 1]),
        };
        em.b.ins().iadd(self.ptrs[op], off)
    }

    /// Evaluates `root` at index `i` (+ `byte_off` for contiguous operands, for unrolling).
    pub(crate) fn eval(
        &self,
        em: &mut Emitter,
        root: usize,
        i: Value,
        byte_off: i32,
        pre: &[Option<Value>],
    ) -> Value {
        self.eval_many(em, &[root], i, byte_off, pre)[0]
    }

    /// [`Row::eval`] of several roots, sharing the values they have in common.
    pub(crate) fn eval_many(
        &self,
        em: &mut Emitter,
        roots: &[usize],
        i: Value,
        byte_off: i32,
        pre: &[Option<Value>],
    ) -> Vec<Value> {
        let known = vec![None; self.k.values()];
        self.eval_known(em, roots, i, byte_off, pre, known)
    }

    /// [`Row::eval_many`] with some values already `known` (by value id),
    /// e.g. a wide helper's results read back from its tile.
    pub(crate) fn eval_known(
        &self,
        em: &mut Emitter,
        roots: &[usize],
        i: Value,
        byte_off: i32,
        pre: &[Option<Value>],
        mut vals: Vec<Option<Value>>,
    ) -> Vec<Value> {
        let ops = self.k.operands.len();
        for (id, v) in vals.iter_mut().enumerate() {
            if v.is_none() {
                *v = pre.get(ops + id).copied().flatten();
            }
        }
        let addrs: Vec<Option<Value>> = (0..self.k.operands.len())
            .map(|op| {
                (pre[op].is_none() && self.loaded.contains(&op)).then(|| self.addr(em, op, i))
            })
            .collect();
        let (k, fr) = (self.k, self.fr);
        let mut leaf = |em: &mut Emitter, ins: Instr| -> (Value, DType) {
            match ins {
                Instr::Load(op) => {
                    let dt = k.operands[op].dtype;
                    if let Some(v) = pre[op] {
                        return (v, dt);
                    }
                    let t = em.ty(dt);
                    (
                        em.b.ins().load(t, flags(), addrs[op].unwrap(), byte_off),
                        dt,
                    )
                }
                Instr::Scalar(n) => {
                    let dt = k.scalars[n];
                    (em.splat_if_vector(fr.scal[n], dt), dt)
                }
                _ => (em.fail("acc in the body".into(), DType::F32), DType::F32),
            }
        };
        roots
            .iter()
            .map(|&r| eval_value(em, k, r, &mut vals, &mut leaf))
            .collect()
    }
}

/// Per body value, whether a row computes it once ([`Row::preload`]), not
/// per element: an op whose inputs are all row-invariant (operands
/// broadcast along the row, scalars, constants) and that reads at least one
/// such operand or scalar. A squeeze-excite gate, `x * sigmoid(s)` with `s`
/// of `[N, C, 1, 1]`, evaluated its exp once per element of `x` before.
pub(crate) fn hoisted(k: &Kernel) -> Vec<bool> {
    // (invariant, reads an operand or scalar) per value
    let mut inv: Vec<(bool, bool)> = Vec::with_capacity(k.body.len());
    let mut out = Vec::with_capacity(k.body.len());
    for (ins, _) in &k.body {
        let (args, n) = crate::interp::instr_args(ins);
        let here = match *ins {
            Instr::Load(op) => (k.operands[op].inner == Inner::Broadcast, true),
            Instr::Scalar(_) => (true, true),
            Instr::Const(_) => (true, false),
            Instr::Acc | Instr::AccPart(_) => (false, false),
            _ => args[..n].iter().fold((true, false), |(i, r), &a| {
                let (ai, ar) = inv[a];
                (i && ai, r || ar)
            }),
        };
        out.push(n > 0 && here.0 && here.1);
        inv.push(here);
    }
    out
}

/// The operands loaded by the body values `root` depends on.
pub(crate) fn loaded_operands(k: &Kernel, root: usize) -> Vec<usize> {
    loaded_by(k, &[root])
}

/// The operands loaded by the body values `roots` depend on.
fn loaded_by(k: &Kernel, roots: &[usize]) -> Vec<usize> {
    let live = super::plan::live_body(k, roots);
    let mut ops: Vec<usize> = k
        .body
        .iter()
        .enumerate()
        .filter_map(|(id, (ins, _))| match ins {
            Instr::Load(op) if live[id] => Some(*op),
            _ => None,
        })
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

/// Stores `v` (of dtype `from`) to the output at `addr`, converting to the output dtype.
pub(crate) fn store_out(
    k: &Kernel,
    em: &mut Emitter,
    v: Value,
    from: DType,
    addr: Value,
    off: i32,
) {
    store_to(k, 0, em, v, from, addr, off)
}

/// [`store_out`] to output operand `op`.
fn store_to(k: &Kernel, op: usize, em: &mut Emitter, v: Value, from: DType, addr: Value, off: i32) {
    let to = k.operands[op].dtype;
    let v = em.cast(v, from, to);
    em.b.ins().store(flags(), v, addr, off);
}

fn pointwise_row(
    k: &Kernel,
    em: &mut Emitter,
    fr: &Frame,
    plan: &Plan,
    lo: Value,
    hi: Value,
    ptrs: &[Value],
) {
    let stores = k.stores();
    let roots: Vec<usize> = stores.iter().map(|s| s.2).collect();
    let row = Row {
        k,
        fr,
        ptrs,
        loaded: loaded_by(k, &roots),
    };
    let mut tail_lo = lo;
    if plan.lanes > 1 {
        tail_lo = super::tiles::tiled_row(em, &row, plan, lo, hi, &stores);
    }
    if plan.lanes > 1 {
        let lanes = plan.lanes as i64;
        let step = lanes * plan.unroll as i64;
        let n = em.b.ins().isub(hi, tail_lo);
        let nm = em.b.ins().band_imm_s(n, !(step - 1));
        let main_end = em.b.ins().iadd(tail_lo, nm);
        let vbytes = (lanes * plan.vdt.size() as i64) as i32;
        em.lanes = plan.lanes;
        for_loop(
            em,
            tail_lo,
            main_end,
            step,
            |em| row.preload(em),
            |em, i, pre| {
                let addrs: Vec<Value> = stores.iter().map(|s| row.addr(em, s.0, i)).collect();
                for u in 0..plan.unroll as i32 {
                    // all loads of this vector before its stores (in-place outputs)
                    let vs = row.eval_many(em, &roots, i, u * vbytes, pre);
                    for (v, a) in vs.into_iter().zip(&addrs) {
                        em.b.ins().store(flags(), v, *a, u * vbytes);
                    }
                }
            },
        );
        tail_lo = main_end;
    }
    em.lanes = 1;
    for_loop(
        em,
        tail_lo,
        hi,
        1,
        |em| row.preload(em),
        |em, i, pre| {
            let vs = row.eval_many(em, &roots, i, 0, pre);
            for (&(op, _, r), v) in stores.iter().zip(vs) {
                let a = row.addr(em, op, i);
                store_to(k, op, em, v, k.dtype_of(r), a, 0);
            }
        },
    );
}

/// Rank 0: one element at the base pointers.
fn single_point(k: &Kernel, em: &mut Emitter, fr: &Frame, ptrs: &[Value]) {
    em.lanes = 1;
    let mut k1 = k.clone();
    // Reuse the row machinery with every operand at its base pointer.
    for o in k1.operands.iter_mut() {
        o.inner = Inner::Broadcast;
    }
    let stores = k.stores();
    let roots: Vec<usize> = stores.iter().map(|s| s.2).collect();
    let row = Row {
        k: &k1,
        fr,
        ptrs,
        loaded: loaded_by(k, &roots),
    };
    let pre = row.preload(em);
    let i = em.b.ins().iconst(types::I64, 0);
    let vs = row.eval_many(em, &roots, i, 0, &pre);
    for (&(op, _, r), v) in stores.iter().zip(vs) {
        store_to(k, op, em, v, k.dtype_of(r), ptrs[op], 0);
    }
}
