//! Eager execution of decompositions with pointwise fusion.
//!
//! [`Fuser`] implements `kiln_passes::decompose::Builder` lazily: pointwise
//! ops build an expression over materialised tensors instead of running; a
//! reduction compiles the pending expression into its own loop body (a
//! prologue), and whatever is pending at the end becomes one pointwise
//! kernel. One-pass reductions store several values per row (a trailing
//! tuple dim, read back through views). Their reader over the same rows
//! runs them as its row pass ([`rows`]): eager softmax is ONE kernel (an
//! online log-sum-exp storing (shift, logsum), then exp((x - shift) -
//! logsum) along the row again) and so is layer_norm (Welford's (mean, var,
//! rstd), then the normalisation).
//! Types follow the same inference functions as the unfused ops.

use super::kernel::KernelCall;
use super::reduce::{mean_epilogue, reduce_expr};
use crate::{Scalar, Tensor};
use kiln_ir::op::infer::{self, Arg, Meta};
use kiln_ir::shape::Dims;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result, UnaryOp};
use kiln_passes::decompose::{Builder, Moments};
use std::collections::HashMap;
use std::rc::Rc;

mod builder;
mod rows;

/// A value of a decomposition: a tensor, or a pending pointwise expression.
#[derive(Clone)]
pub struct Lazy(Rc<Node>);

struct Node {
    meta: Meta,
    kind: Kind,
    /// The tree reads a part of a one-pass reduction (so most expressions
    /// skip the row-fusion walks).
    reads_parts: bool,
}

enum Kind {
    Leaf(Tensor),
    /// Part `i` of a one-pass reduction that may not have run yet: its
    /// reader runs it as the reduction's row pass ([`rows`]).
    Part(Rc<rows::Pending>, usize),
    /// A Python number, already in the compute dtype of its use.
    Scalar(f64, DType),
    /// `op(args cast to compute)`, then cast to `meta.dtype`.
    Unary(UnaryOp, DType, Lazy),
    Binary(BinaryOp, DType, Lazy, Lazy),
    Select(DType, Lazy, Lazy, Lazy),
    Cast(Lazy),
}

impl Lazy {
    pub fn tensor(t: &Tensor) -> Lazy {
        Lazy(Rc::new(Node {
            meta: t.meta(),
            kind: Kind::Leaf(t.clone()),
            reads_parts: false,
        }))
    }
    fn new(meta: Meta, kind: Kind) -> Lazy {
        let reads_parts = match &kind {
            Kind::Part(..) => true,
            Kind::Leaf(_) | Kind::Scalar(..) => false,
            Kind::Unary(_, _, a) | Kind::Cast(a) => a.0.reads_parts,
            Kind::Binary(_, _, a, b) => a.0.reads_parts || b.0.reads_parts,
            Kind::Select(_, c, a, b) => c.0.reads_parts || a.0.reads_parts || b.0.reads_parts,
        };
        Lazy(Rc::new(Node {
            meta,
            kind,
            reads_parts,
        }))
    }
    fn as_tensor(&self) -> Option<&Tensor> {
        match &self.0.kind {
            Kind::Leaf(t) => Some(t),
            Kind::Part(p, i) => p.view(*i),
            _ => None,
        }
    }

    /// The tensor, when this is one (not a pending expression).
    pub fn as_leaf(&self) -> Option<&Tensor> {
        self.as_tensor()
    }

    /// Runs the pending expression (one kernel), or returns the tensor.
    pub fn materialize(&self) -> Result<Tensor> {
        if let Some(t) = rows::row_kernel(self)? {
            return Ok(t);
        }
        self.force()?;
        if let Some(t) = self.as_tensor() {
            return Ok(t.clone());
        }
        let mut e = Emitter::default();
        let leaves = self.leaves();
        let mut k = KernelCall::new();
        for l in &leaves {
            let v = k.load(l);
            e.leaf_vals.push(v);
        }
        e.leaves = leaves;
        let v = e.emit(&mut k, self);
        k.finish(&e.name(), v, &self.0.meta.dims, self.0.meta.dtype)
    }

    /// Runs the pending expression as one kernel writing into `dst` (same
    /// shape; a compiled extern's epilogue writes over the extern's output).
    pub fn materialize_into(&self, dst: &Tensor) -> Result<()> {
        self.materialize_into_with(dst, |k, views, scalars| {
            kiln_runtime::launch(k, views, scalars)
        })
    }

    /// [`Lazy::materialize_into`], handing the kernel to `launch` (see
    /// [`KernelCall::store_into_with`]).
    pub fn materialize_into_with(
        &self,
        dst: &Tensor,
        launch: impl FnOnce(&kiln_codegen::Kernel, &[kiln_runtime::View], &[u64]) -> Result<()>,
    ) -> Result<()> {
        self.force()?;
        let mut e = Emitter::default();
        let leaves = self.leaves();
        let mut k = KernelCall::new();
        for l in &leaves {
            let v = k.load(l);
            e.leaf_vals.push(v);
        }
        e.leaves = leaves;
        let v = e.emit(&mut k, self);
        k.store_into_with(&e.name(), v, dst, launch)
    }

    /// Runs several pending expressions as ONE kernel, writing each into its
    /// destination (all of the same shape): shared subexpressions are
    /// computed once, and a destination an expression also reads (same
    /// storage and layout) is updated in place — each element's values are
    /// computed from the old contents before any is stored.
    pub fn materialize_many_into(exprs: &[(&Lazy, &Tensor)]) -> Result<()> {
        Lazy::materialize_many_named(None, exprs)
    }

    /// [`Lazy::materialize_many_into`] with a kernel name for profiles and
    /// dumps (`adam_step`), instead of the fused ops' names.
    pub fn materialize_many_named(name: Option<&str>, exprs: &[(&Lazy, &Tensor)]) -> Result<()> {
        let dsts: Vec<Tensor> = exprs.iter().map(|(_, d)| (*d).clone()).collect();
        for (x, _) in exprs {
            x.force()?;
        }
        let mut leaves: Vec<Tensor> = vec![];
        for (x, _) in exprs {
            for t in x.leaves() {
                if !leaves
                    .iter()
                    .any(|o| o.shares_storage(&t) && o.layout() == t.layout())
                {
                    leaves.push(t);
                }
            }
        }
        let mut e = Emitter::default();
        let mut k = KernelCall::with_outputs(&dsts);
        for l in &leaves {
            let v = k.load(l);
            e.leaf_vals.push(v);
        }
        e.leaves = leaves;
        let vals: Vec<usize> = exprs.iter().map(|(x, _)| e.emit(&mut k, x)).collect();
        let name = name.map_or_else(|| e.name(), str::to_string);
        k.store_many(&name, &vals)
    }

    /// Runs several pending expressions of one shape as ONE kernel, each
    /// into a new tensor (a compiled multi-output kernel: an LSTM step's
    /// `c_t` and `h_t`); subexpressions they share are computed once.
    pub fn materialize_many(exprs: &[&Lazy]) -> Result<Vec<Tensor>> {
        for x in exprs {
            x.force()?;
        }
        let leaves: Vec<Tensor> = exprs.iter().flat_map(|x| x.leaves()).collect();
        let device = crate::device::device_of(&leaves);
        let dsts = exprs
            .iter()
            .map(|x| Tensor::empty_for("fused", &x.0.meta.dims, x.0.meta.dtype, device.clone()))
            .collect::<Result<Vec<Tensor>>>()?;
        let pairs: Vec<(&Lazy, &Tensor)> = exprs.iter().copied().zip(&dsts).collect();
        Lazy::materialize_many_named(None, &pairs)?;
        Ok(dsts)
    }

    /// A 0-dim constant of dtype `dt` (a kernel scalar argument, not a tensor).
    pub fn constant(v: f64, dt: DType) -> Lazy {
        Lazy::new(
            Meta {
                dtype: dt,
                dims: Dims::new(),
            },
            Kind::Scalar(v, dt),
        )
    }

    pub fn meta(&self) -> &Meta {
        &self.0.meta
    }

    /// Whether the expression reads no tensor (constants only).
    pub fn is_constant(&self) -> bool {
        let mut any = false;
        rows::visit(self, &mut |n| {
            any |= matches!(n.0.kind, Kind::Leaf(_) | Kind::Part(..));
        });
        !any
    }

    /// Runs the one-pass reductions whose parts this expression reads.
    fn force(&self) -> Result<()> {
        if !self.0.reads_parts {
            return Ok(());
        }
        let mut pending = vec![];
        rows::visit(self, &mut |n| {
            if let Kind::Part(p, _) = &n.0.kind {
                pending.push(p.clone());
            }
        });
        pending.iter().try_for_each(|p| p.resolve())
    }

    /// Distinct leaf tensors, in first-use order (parts of one-pass
    /// reductions must have run: see [`Lazy::force`]).
    fn leaves(&self) -> Vec<Tensor> {
        fn walk(n: &Lazy, out: &mut Vec<Tensor>) {
            let leaf = match &n.0.kind {
                Kind::Part(p, i) => p.view(*i),
                Kind::Leaf(t) => Some(t),
                _ => None,
            };
            match &n.0.kind {
                Kind::Leaf(_) | Kind::Part(..) => {
                    let t = leaf.expect("a forced part");
                    if !out
                        .iter()
                        .any(|o| o.shares_storage(t) && o.layout() == t.layout())
                    {
                        out.push(t.clone())
                    }
                }
                Kind::Scalar(..) => {}
                Kind::Unary(_, _, a) | Kind::Cast(a) => walk(a, out),
                Kind::Binary(_, _, a, b) => {
                    walk(a, out);
                    walk(b, out)
                }
                Kind::Select(_, c, a, b) => {
                    walk(c, out);
                    walk(a, out);
                    walk(b, out)
                }
            }
        }
        let mut v = vec![];
        walk(self, &mut v);
        v
    }
}

/// Turns an expression into kernel instructions, emitting shared nodes once.
#[derive(Default)]
struct Emitter {
    leaves: Vec<Tensor>,
    leaf_vals: Vec<usize>,
    done: HashMap<*const Node, usize>,
    ops: Vec<&'static str>,
    /// In a row pass: the reduction whose parts are the epilogue's values.
    parts: Option<(Rc<rows::Pending>, Vec<usize>)>,
    /// With `Some`, the scalar argument each scalar node became, so that a
    /// reduction's prologue and its row pass (one call) share one argument
    /// per node. `None` (emitters reused across calls): a new one each time.
    scalar_args: Option<HashMap<*const Node, usize>>,
}

impl Emitter {
    fn emit(&mut self, k: &mut KernelCall, n: &Lazy) -> usize {
        let key = Rc::as_ptr(&n.0);
        if let Some(&v) = self.done.get(&key) {
            return v;
        }
        let out = n.0.meta.dtype.compute();
        let v = match &n.0.kind {
            Kind::Part(p, i) if self.parts.as_ref().is_some_and(|q| Rc::ptr_eq(&q.0, p)) => {
                self.parts.as_ref().expect("checked").1[*i]
            }
            Kind::Leaf(_) | Kind::Part(..) => {
                let t = n.as_tensor().expect("a forced part");
                let i = self
                    .leaves
                    .iter()
                    .position(|o| o.shares_storage(t) && o.layout() == t.layout())
                    .unwrap();
                self.leaf_vals[i]
            }
            Kind::Scalar(x, dt) => match &mut self.scalar_args {
                Some(args) => match args.get(&key) {
                    Some(&arg) => k.scalar_again(arg),
                    None => {
                        args.insert(key, k.scalar_count());
                        k.scalar(*x, *dt)
                    }
                },
                None => k.scalar(*x, *dt),
            },
            Kind::Unary(op, c, a) => {
                let a = self.emit(k, a);
                self.ops.push(op.name());
                let a = k.cast(a, *c);
                let r = k.unary(*op, a, *c);
                k.cast(r, out)
            }
            Kind::Binary(op, c, a, b) => {
                let (a, b) = (self.emit(k, a), self.emit(k, b));
                self.ops.push(op.name());
                let (a, b) = (k.cast(a, *c), k.cast(b, *c));
                let r = k.binary(*op, a, b, *c);
                k.cast(r, out)
            }
            Kind::Select(c, m, a, b) => {
                let (m, a, b) = (self.emit(k, m), self.emit(k, a), self.emit(k, b));
                self.ops.push("where");
                let m = k.cast(m, DType::Bool);
                let (a, b) = (k.cast(a, *c), k.cast(b, *c));
                let r = k.select(m, a, b, *c);
                k.cast(r, out)
            }
            Kind::Cast(a) => {
                let a = self.emit(k, a);
                k.cast(a, out)
            }
        };
        self.done.insert(key, v);
        v
    }

    /// `fused[sub+exp+div]`-style kernel names, for dumps and profiles.
    fn name(&self) -> String {
        if self.ops.len() == 1 {
            self.ops[0].to_string()
        } else {
            format!("fused[{}]", self.ops.join("+"))
        }
    }
}

/// A Python number for a decomposition's constant: an integral value against
/// an integer tensor stays integer (e.g. `where(mask, idx, 0)`).
pub(crate) fn scalar_for(dt: DType, s: f64) -> Scalar {
    if !dt.is_float() && s.fract() == 0.0 {
        Scalar::Int(s as i64)
    } else {
        Scalar::Float(s)
    }
}

/// The eager [`Builder`]: fuses pointwise chains into the next reduction or the final kernel.
pub struct Fuser;

impl Fuser {
    /// `a op s` (or `s op a` when `reversed`) with the Python number `s`.
    pub fn binary_scalar(&self, op: BinaryOp, a: &Lazy, s: Scalar, reversed: bool) -> Result<Lazy> {
        let (ta, ts) = (Arg::Tensor(&a.0.meta), Arg::Scalar(s.category()));
        let sig = if reversed {
            infer::binary(op, ts, ta)?
        } else {
            infer::binary(op, ta, ts)?
        };
        let c = Lazy::constant(s.value(), sig.compute);
        let (l, r) = if reversed {
            (c, a.clone())
        } else {
            (a.clone(), c)
        };
        Ok(Lazy::new(
            Meta {
                dtype: sig.out,
                dims: sig.dims,
            },
            Kind::Binary(op, sig.compute, l, r),
        ))
    }

    /// One reduction kernel of `kind` over `x` (its pending expression as the
    /// prologue); `epilogue(k, acc, n, compute)` gives the value(s) stored
    /// per output element (several: a trailing dim holds them).
    #[allow(clippy::too_many_arguments)]
    fn reduce_lazy(
        &self,
        name: &str,
        kind: ReduceKind,
        x: &Lazy,
        dims: &[i64],
        keepdim: bool,
        out_dtype: Option<DType>,
        epilogue: impl FnOnce(&mut KernelCall, usize, usize, DType) -> Vec<usize>,
    ) -> Result<Tensor> {
        let m = &x.0.meta;
        let rd = infer::reduce_dims(name, m.dims.len(), Some(dims))?;
        let out = infer::reduce(kind, m, &rd, keepdim)?;
        let compute = match kind {
            ReduceKind::ArgMax | ReduceKind::ArgMin => m.dtype.compute(),
            _ => out.dtype.compute(),
        };
        x.force()?;
        let leaves = x.leaves();
        let mut e = Emitter {
            leaves: leaves.clone(),
            ..Emitter::default()
        };
        let body = |k: &mut KernelCall, loaded: &[usize]| {
            // a long sum emits the body once per cascade kernel: start afresh
            e.done.clear();
            e.leaf_vals = loaded.to_vec();
            let v = e.emit(k, x);
            k.cast(v, compute)
        };
        reduce_expr(
            name,
            kind,
            m,
            &leaves,
            Some(dims),
            keepdim,
            out_dtype.unwrap_or(out.dtype),
            body,
            |k, acc, n| epilogue(k, acc, n, compute),
        )
    }

    /// The parts of a one-pass reduction (log-sum-exp: shift, logsum;
    /// Welford: mean, var, rstd) over `dims` of `x`, each typed as `x` (a
    /// cast kernels skip: f16/bf16 values are computed in f32 anyway).
    /// With `defer`, where the row pass applies ([`rows::defers`]) the
    /// reduction runs when a reader needs it, as that reader's row pass.
    pub(crate) fn one_pass(
        &mut self,
        kind: ReduceKind,
        x: &Lazy,
        dims: &[i64],
        eps: f64,
        defer: bool,
    ) -> Result<Vec<Lazy>> {
        let p = Rc::new(rows::Pending::new(kind, x, eps));
        if !(defer && rows::defers(x, dims)?) {
            let t = self.reduce_lazy(
                p.name(),
                kind,
                x,
                dims,
                true,
                Some(x.0.meta.dtype.compute()),
                |k, acc, _, c| p.epilogue(k, acc, c),
            )?;
            p.set(t)?;
        }
        let dims: Dims = match p.view(0) {
            Some(v) => v.dims().iter().copied().collect(),
            // deferred: over the last dim, kept
            None => {
                let mut d = x.0.meta.dims.clone();
                *d.last_mut().expect("a deferred reduction has a dim") = 1;
                d
            }
        };
        let (dt, compute) = (x.0.meta.dtype, x.0.meta.dtype.compute());
        (0..p.parts())
            .map(|i| {
                let meta = Meta {
                    dtype: compute,
                    dims: dims.clone(),
                };
                let part = Lazy::new(meta, Kind::Part(p.clone(), i));
                self.cast(&part, dt)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
