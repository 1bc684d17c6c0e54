//! Row fusion: a one-pass reduction over the last dim (softmax's
//! log-sum-exp, layer_norm's Welford moments) and the pointwise expression
//! that reads its parts over the same rows run as ONE kernel, the
//! reduction's row pass ([`kiln_codegen::RowPass`]): the row is read from
//! memory once and re-read from cache, and there is one launch instead of
//! two. Softmax and layer_norm move 2 bytes per element of memory instead
//! of 3.
//!
//! The reduction does not run when it is built: its parts are
//! [`Kind::Part`] leaves of a [`Pending`]. When an expression is
//! materialised whose tree reads the parts of exactly one such reduction,
//! over that reduction's input's dims, on the CPU, in f32/f64, it runs as
//! that reduction's row pass ([`row_kernel`]); any other use runs the
//! reduction first, alone ([`Pending::resolve`]), as before, and so does
//! every one-pass reduction with `KILN_ROW_PASS=0`.
//!
//! ```text
//! softmax(x):  lse+rows  — reduce lse over the row; row: exp((x - shift) - logsum)
//! ```

use super::{Emitter, Fuser, Kind, Lazy};
use crate::ops::kernel::{KernelCall, Rows};
use crate::Tensor;
use kiln_codegen::AccPart;
use kiln_ir::op::infer;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result, UnaryOp};
use std::cell::OnceCell;
use std::collections::HashSet;
use std::rc::Rc;

/// A one-pass reduction over a row and, once it has run, its parts.
pub(crate) struct Pending {
    kind: ReduceKind,
    /// The reduced expression (the kernel's prologue).
    x: Lazy,
    /// Welford's epsilon inside `rstd = rsqrt(var + eps)`.
    eps: f64,
    /// One view per part of the stored tuple (a trailing dim), once run.
    views: OnceCell<Vec<Tensor>>,
}

impl Pending {
    pub(crate) fn new(kind: ReduceKind, x: &Lazy, eps: f64) -> Pending {
        Pending {
            kind,
            x: x.clone(),
            eps,
            views: OnceCell::new(),
        }
    }

    /// The kernel's name in profiles and dumps.
    pub(crate) fn name(&self) -> &'static str {
        match self.kind {
            ReduceKind::LogSumExp => "lse",
            _ => "moments",
        }
    }

    /// Log-sum-exp: (shift, logsum); Welford: (mean, var, rstd).
    pub(crate) fn parts(&self) -> usize {
        match self.kind {
            ReduceKind::LogSumExp => 2,
            _ => 3,
        }
    }

    /// The values stored per row, from the finished reduction `acc`.
    pub(crate) fn epilogue(&self, k: &mut KernelCall, acc: usize, c: DType) -> Vec<usize> {
        match self.kind {
            ReduceKind::LogSumExp => vec![
                k.acc_part(AccPart::Shift, c),
                k.acc_part(AccPart::LogSum, c),
            ],
            _ => {
                let mean = k.acc_part(AccPart::Mean, c);
                let eps = k.scalar(self.eps, c);
                let ve = k.binary(BinaryOp::Add, acc, eps, c);
                let rstd = k.unary(UnaryOp::Rsqrt, ve, c);
                vec![mean, acc, rstd]
            }
        }
    }

    /// Part `i`, once the reduction has run.
    pub(crate) fn view(&self, i: usize) -> Option<&Tensor> {
        self.views.get().map(|v| &v[i])
    }

    /// Keeps the reduction's stored tuple (its parts along the last dim).
    pub(crate) fn set(&self, tuple: Tensor) -> Result<()> {
        let views = (0..self.parts())
            .map(|i| tuple.select(-1, i as i64))
            .collect::<Result<Vec<_>>>()?;
        let _ = self.views.set(views);
        Ok(())
    }

    /// Runs the reduction on its own (no reader took it as a row pass).
    pub(crate) fn resolve(&self) -> Result<()> {
        if self.views.get().is_some() {
            return Ok(());
        }
        let last = self.x.0.meta.dims.len() as i64 - 1;
        let c = self.x.0.meta.dtype.compute();
        let t = Fuser.reduce_lazy(
            self.name(),
            self.kind,
            &self.x,
            &[last],
            true,
            Some(c),
            |k, acc, _, c| self.epilogue(k, acc, c),
        )?;
        self.set(t)
    }
}

/// Whether a one-pass reduction of `x` over `dims` waits for a reader to
/// take it as a row pass: over the last dim only, of f32/f64 CPU tensors.
pub(crate) fn defers(x: &Lazy, dims: &[i64]) -> Result<bool> {
    let m = &x.0.meta;
    if !enabled() || m.dims.is_empty() || !matches!(m.dtype, DType::F32 | DType::F64) {
        return Ok(false);
    }
    let rd = infer::reduce_dims("row fusion", m.dims.len(), Some(dims))?;
    Ok(rd == [m.dims.len() - 1] && on_cpu(x))
}

/// Row passes are on unless `KILN_ROW_PASS=0` (for A/B timing: the
/// reduction and its reader then run as two kernels, as before).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_ROW_PASS").map_or(true, |v| v != "0"))
}

/// Whether every tensor `e` reads is an f32/f64 CPU tensor (the JIT's
/// row pass; f16/bf16 and CUDA keep two kernels).
fn on_cpu(e: &Lazy) -> bool {
    let mut ok = true;
    visit(e, &mut |n| {
        if let Kind::Leaf(t) = &n.0.kind {
            ok &= !t.device().is_cuda() && !t.dtype().is_half();
        }
    });
    ok
}

/// Calls `f` on every node of `e` once (shared subtrees once), parents first.
pub(super) fn visit(e: &Lazy, f: &mut dyn FnMut(&Lazy)) {
    let mut seen = HashSet::new();
    let mut stack = vec![e.clone()];
    while let Some(n) = stack.pop() {
        if !seen.insert(Rc::as_ptr(&n.0)) {
            continue;
        }
        f(&n);
        match &n.0.kind {
            Kind::Leaf(_) | Kind::Part(..) | Kind::Scalar(..) => {}
            Kind::Unary(_, _, a) | Kind::Cast(a) => stack.push(a.clone()),
            Kind::Binary(_, _, a, b) => stack.extend([a.clone(), b.clone()]),
            Kind::Select(_, c, a, b) => stack.extend([c.clone(), a.clone(), b.clone()]),
        }
    }
}

/// The reductions `e` reads parts of that have not run, each once.
fn unresolved(e: &Lazy) -> Vec<Rc<Pending>> {
    let mut out: Vec<Rc<Pending>> = vec![];
    visit(e, &mut |n| {
        if let Kind::Part(p, _) = &n.0.kind {
            if p.views.get().is_none() && !out.iter().any(|q| Rc::ptr_eq(p, q)) {
                out.push(p.clone());
            }
        }
    });
    out
}

/// Materialises `e` as the row pass of the one reduction whose parts it
/// reads, when it can (see the module docs): `None` otherwise.
pub(super) fn row_kernel(e: &Lazy) -> Result<Option<Tensor>> {
    if !e.0.reads_parts || matches!(e.0.kind, Kind::Part(..)) {
        return Ok(None);
    }
    let pending = unresolved(e);
    let [p] = pending.as_slice() else {
        return Ok(None);
    };
    let (m, xm) = (&e.0.meta, &p.x.0.meta);
    let row_dtype = matches!(m.dtype, DType::F32 | DType::F64);
    if m.dims != xm.dims || !row_dtype || !on_cpu(e) || !on_cpu(&p.x) {
        return Ok(None);
    }
    // other reductions inside the prologue run first, on their own
    p.x.force()?;
    let compute = xm.dtype.compute();
    let x_leaves = p.x.leaves();
    let mut k = KernelCall::for_rows();
    let mut body = Emitter {
        leaves: x_leaves.clone(),
        scalar_args: Some(Default::default()),
        ..Emitter::default()
    };
    for t in &x_leaves {
        let v = k.load(&t.expand_to(&xm.dims)?);
        body.leaf_vals.push(v);
    }
    let v = body.emit(&mut k, &p.x);
    let v = k.cast(v, compute);
    // the reader's other leaves have run (only `p` had not)
    e.force_except(p)?;
    let e_leaves = e.leaves_except(p);
    let mut rows = Emitter {
        leaves: e_leaves.clone(),
        parts: Some((p.clone(), vec![])),
        scalar_args: body.scalar_args.clone(),
        ..Emitter::default()
    };
    let device = crate::device::device_of(x_leaves.iter().chain(&e_leaves));
    let name = format!("{}+rows", p.name());
    let out = Tensor::empty_for(&name, &m.dims, m.dtype, device)?;
    // loaded at the row's dims, as the prologue's are: a leaf both read
    // is then one operand
    let e_loads = e_leaves
        .iter()
        .map(|t| t.expand_to(&m.dims))
        .collect::<Result<Vec<_>>>()?;
    let mut emit = |k: &mut KernelCall, parts: &[usize]| {
        rows.parts.as_mut().expect("set above").1 = parts.to_vec();
        rows.leaf_vals = e_loads.iter().map(|t| k.load(t)).collect();
        rows.emit(k, e)
    };
    let rows_arg = Rows {
        out: &out,
        emit: &mut emit,
    };
    let tuple = k.reduce_with_rows(
        &name,
        p.kind,
        v,
        &xm.dims,
        compute,
        |k, acc| p.epilogue(k, acc, compute),
        Some(rows_arg),
    )?;
    let mut shape: Vec<usize> = xm.dims.to_vec();
    *shape.last_mut().expect("rank >= 1") = 1;
    shape.push(p.parts());
    p.set(tuple.reshape_dims(&shape)?)?;
    Ok(Some(out))
}

impl Lazy {
    /// [`Lazy::force`] for every reduction but `p`.
    fn force_except(&self, p: &Rc<Pending>) -> Result<()> {
        unresolved(self)
            .iter()
            .filter(|q| !Rc::ptr_eq(q, p))
            .try_for_each(|q| q.resolve())
    }

    /// Distinct leaf tensors but `p`'s parts, in first-use order.
    fn leaves_except(&self, p: &Rc<Pending>) -> Vec<Tensor> {
        let mut out: Vec<Tensor> = vec![];
        let mut order = vec![];
        visit(self, &mut |n| order.push(n.clone()));
        for n in order {
            let t = match &n.0.kind {
                Kind::Leaf(t) => t,
                Kind::Part(q, _) if !Rc::ptr_eq(q, p) => n.as_tensor().expect("forced"),
                _ => continue,
            };
            if !out
                .iter()
                .any(|o| o.shares_storage(t) && o.layout() == t.layout())
            {
                out.push(t.clone());
            }
        }
        out
    }
}
