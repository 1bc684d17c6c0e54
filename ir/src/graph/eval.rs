//! A reference interpreter of [`Graph`]s in `f64`, independent of kiln's
//! code generation: the oracle the differential tests compare compiled and
//! eager execution against.
//!
//! Values are [`HostTensor`]s: a [`Meta`] and the elements row-major as `f64`
//! (integers and bools hold their exact value; keep integers within ±2^53).
//! Pointwise ops go through [`crate::scalar::lower_unary`] /
//! [`crate::scalar::lower_binary`] on [`crate::interp::Interp`], with the
//! compute and result dtypes of [`crate::op::infer`], so a node's value is the
//! definition's: an f32 node rounds every primitive to f32, integers wrap.
//! Reductions, matmul and convolution accumulate in `f64` and round once to
//! the node's dtype (the exact answer, rounded); views, broadcasting, slicing
//! and convolution geometry are re-implemented here rather than taken from
//! the layout code the runtime uses. Composites (softmax, layer_norm, the
//! losses, ...) are evaluated by their textbook formulas, not through kiln's
//! decomposition (see `eval/composite.rs`); the multi-result reductions they
//! lower to (`lse_parts`, `moments`, read through `getitem`) and `gather` are
//! known too, so a decomposed graph evaluates as well.
//!
//! Alongside each value, [`eval_nodes`] carries a running error bound
//! ([`Bounded`]): per element, an absolute bound on how far an implementation
//! that rounds each op to the node's dtype (in any summation order, with
//! transcendentals a few ulps off) can be from the reference value, and
//! whether a discrete decision (a comparison, floor, a float-to-int cast, an
//! argmax) was too close to call within that bound (`unsure`), so a correct
//! implementation may legitimately decide it the other way. Tests use it to
//! size tolerances to the conditioning of each graph instead of a blanket one.

mod composite;
mod loss;
mod nd;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_composite;

use super::{Graph, NodeOp};
use crate::interp::{Interp, Val};
use crate::op::infer::{self, Arg};
use crate::op::{Meta, Op};
use crate::scalar::{lower_binary, lower_unary, ScalarOps};
use crate::{bail, BinaryOp, DType, Result, UnaryOp};

/// A host tensor: its type and its elements row-major, as `f64`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub meta: Meta,
    pub data: Vec<f64>,
}

impl HostTensor {
    /// A tensor of type `meta` holding `data` (checked: one value per element).
    pub fn new(meta: Meta, data: Vec<f64>) -> Result<HostTensor> {
        let n: usize = meta.dims.iter().product();
        if data.len() != n {
            bail!(
                "eval",
                "{} values for a {} tensor ({n} elements)",
                data.len(),
                meta
            );
        }
        Ok(HostTensor { meta, data })
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// A reference value with its error analysis (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    pub value: HostTensor,
    /// Per element: absolute error bound of a correct f32/f64 implementation
    /// (0 for integers and bools, which must match exactly unless `unsure`).
    pub err: Vec<f64>,
    /// Per element: depends on a decision too close to call.
    pub unsure: Vec<bool>,
}

impl Bounded {
    fn exact(value: HostTensor) -> Bounded {
        let n = value.numel();
        Bounded {
            value,
            err: vec![0.0; n],
            unsure: vec![false; n],
        }
    }
    pub fn meta(&self) -> &Meta {
        &self.value.meta
    }
    pub fn dtype(&self) -> DType {
        self.value.meta.dtype
    }
    fn val(&self, i: usize) -> Val {
        to_val(self.value.data[i], self.dtype())
    }
}

/// How many times the error bound a decision must clear to count as certain
/// (the slack the tests' tolerance also grants).
pub const SAFETY: f64 = 4.0;

/// Unit roundoff of a dtype (0 for exact integer and bool dtypes).
pub fn unit_roundoff(dt: DType) -> f64 {
    match dt {
        DType::F64 => f64::EPSILON / 2.0,
        DType::F32 => f32::EPSILON as f64 / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

pub(crate) fn to_val(x: f64, dt: DType) -> Val {
    if dt.is_float() {
        Val::F(x)
    } else {
        Val::I(x as i64)
    }
}

/// `a * b` where a zero factor wins over an infinite one.
pub(crate) fn mul0(a: f64, b: f64) -> f64 {
    if a == 0.0 || b == 0.0 {
        0.0
    } else {
        a * b
    }
}

/// Whether a value `dist` away from a discontinuity, with error bound `e`,
/// could fall on the other side of it.
pub(crate) fn too_close(dist: f64, e: f64) -> bool {
    e > 0.0 && dist <= SAFETY * e
}

/// Evaluates `g` on `inputs` (in graph input order); returns its outputs.
pub fn eval(g: &Graph, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    let vals = eval_nodes(g, inputs)?;
    g.outputs()
        .iter()
        .map(|o| match &vals[o.index()] {
            Some(b) => Ok(b.value.clone()),
            None => bail!("eval", "output {o:?} has no value"),
        })
        .collect()
}

/// Evaluates every node of `g` with its error bound (`None` for tuple nodes).
pub fn eval_nodes(g: &Graph, inputs: &[HostTensor]) -> Result<Vec<Option<Bounded>>> {
    if inputs.len() != g.inputs().len() {
        bail!(
            "eval",
            "graph {} takes {} inputs, got {}",
            g.name(),
            g.inputs().len(),
            inputs.len()
        );
    }
    let mut vals: Vec<Option<Bounded>> = Vec::with_capacity(g.len());
    // the results of multi-output nodes, which `getitem` (Project) reads
    let mut tuples: Vec<Option<Vec<Bounded>>> = Vec::with_capacity(g.len());
    let mut next_input = 0;
    for (id, node) in g.iter() {
        let arg = |k: usize| -> Result<&Bounded> {
            match node.operands.get(k).and_then(|o| vals[o.index()].as_ref()) {
                Some(v) => Ok(v),
                None => bail!("eval", "operand {k} of {id:?} has no value"),
            }
        };
        let v = match &node.op {
            NodeOp::Input { name } => {
                let t = &inputs[next_input];
                next_input += 1;
                if Some(&t.meta) != node.meta() || t.numel() != t.meta.dims.iter().product() {
                    bail!(
                        "eval",
                        "input {name} is {} but the graph declares {:?}",
                        t.meta,
                        node.meta()
                    );
                }
                Bounded::exact(t.clone())
            }
            NodeOp::Const(c) => {
                let n = c.meta.dims.iter().product();
                let data = (0..n)
                    .map(|i| Interp.cast(Val::F(c.value(i)), DType::F64, c.meta.dtype))
                    .map(Val::as_f64)
                    .collect();
                Bounded::exact(HostTensor::new(c.meta.clone(), data)?)
            }
            NodeOp::Project(k) => {
                let t = node
                    .operands
                    .first()
                    .and_then(|o| tuples[o.index()].as_ref());
                match t.and_then(|t| t.get(*k)) {
                    Some(v) => v.clone(),
                    None => bail!("eval", "{id:?} projects result {k} of a value without one"),
                }
            }
            NodeOp::Op(op) => {
                let ins = (0..node.operands.len())
                    .map(arg)
                    .collect::<Result<Vec<_>>>()?;
                let meta = match node.meta() {
                    Some(m) => m,
                    None => {
                        let vs = composite::eval_multi(op, &ins)?;
                        let metas: Vec<&Meta> = vs.iter().map(|v| v.meta()).collect();
                        if metas.len() != node.metas.len()
                            || metas.iter().zip(&node.metas).any(|(a, b)| *a != b)
                        {
                            bail!(
                                "eval",
                                "{id:?} {}: the interpreter computed {metas:?} but inference says {:?}",
                                op.name(),
                                node.metas
                            );
                        }
                        vals.push(None);
                        tuples.push(Some(vs));
                        continue;
                    }
                };
                let v = eval_op(op, &ins, meta)?;
                if &v.value.meta != meta {
                    bail!(
                        "eval",
                        "{id:?} {}: the interpreter computed {} but inference says {}",
                        op.name(),
                        v.value.meta,
                        meta
                    );
                }
                v
            }
        };
        vals.push(Some(v));
        tuples.push(None);
    }
    Ok(vals)
}

fn eval_op(op: &Op, x: &[&Bounded], meta: &Meta) -> Result<Bounded> {
    Ok(match op {
        Op::Unary(u) => unary(*u, x[0])?,
        Op::Binary(b) => {
            let sig = infer::binary(*b, Arg::Tensor(x[0].meta()), Arg::Tensor(x[1].meta()))?;
            binary(*b, x[0], Some(x[1]), None, false, &sig)?
        }
        Op::BinaryScalar {
            op,
            value,
            reversed,
        } => {
            let (t, s) = (Arg::Tensor(x[0].meta()), Arg::Scalar(value.category()));
            let sig = if *reversed {
                infer::binary(*op, s, t)?
            } else {
                infer::binary(*op, t, s)?
            };
            binary(*op, x[0], None, Some(value.to_f64()), *reversed, &sig)?
        }
        Op::Where => where_(x[0], x[1], x[2])?,
        Op::Cast(to) => cast(x[0], *to),
        Op::Reduce {
            kind,
            dims,
            keepdim,
        } => nd::reduce(*kind, x[0], dims, *keepdim, meta.dtype)?,
        Op::Mean { dims, keepdim } => nd::mean(x[0], dims, *keepdim)?,
        Op::Matmul => nd::matmul(x[0], x[1])?,
        Op::Linear => nd::linear(x[0], x[1], x.get(2).copied())?,
        Op::Conv { params, spatial } => nd::conv(x[0], x[1], x.get(2).copied(), params, *spatial)?,
        Op::View(_) => nd::reshape(x[0], &meta.dims)?,
        Op::Permute(p) => nd::permute(x[0], p)?,
        Op::Expand(s) => nd::expand(x[0], s)?,
        Op::Slice {
            dim,
            start,
            stop,
            step,
        } => nd::slice(x[0], *dim, *start, *stop, *step)?,
        Op::Select { dim, index } => nd::select(x[0], *dim, *index)?,
        Op::Cat { dim } => nd::cat(x, *dim, meta.dtype)?,
        other => composite::eval(other, x, meta)?,
    })
}

/// Flat index into a tensor of `dims` for output multi-index `idx` under
/// NumPy broadcasting (`dims` right-aligned against `idx`).
pub(crate) fn bcast_index(idx: &[usize], dims: &[usize]) -> usize {
    let lead = idx.len() - dims.len();
    let mut flat = 0;
    for (k, &d) in dims.iter().enumerate() {
        let i = if d == 1 { 0 } else { idx[lead + k] };
        flat = flat * d + i;
    }
    flat
}

/// Calls `f(flat, multi_index)` for every element of `dims`, row-major.
pub(crate) fn for_each_index(dims: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = dims.iter().product();
    let mut idx = vec![0usize; dims.len()];
    for flat in 0..n {
        f(flat, &idx);
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Casts `v` (with error `e`) between dtypes; returns the value, its error
/// and whether the conversion decided something too close to call.
fn cast_val(v: Val, e: f64, from: DType, to: DType) -> (Val, f64, bool) {
    let r = Interp.cast(v, from, to);
    let x = v.as_f64();
    if to.is_float() {
        let round = if from == to { 0.0 } else { unit_roundoff(to) };
        (r, e + round * x.abs(), false)
    } else if from.is_float() {
        let unsure = if to == DType::Bool {
            too_close(x.abs(), e)
        } else {
            too_close((x - x.round()).abs(), e)
        };
        (r, 0.0, unsure)
    } else {
        (r, 0.0, false)
    }
}

fn cast(x: &Bounded, to: DType) -> Bounded {
    let n = x.value.numel();
    let mut out = Bounded::exact(HostTensor {
        meta: Meta {
            dtype: to,
            dims: x.meta().dims.clone(),
        },
        data: vec![0.0; n],
    });
    for i in 0..n {
        let (r, e, u) = cast_val(x.val(i), x.err[i], x.dtype(), to);
        out.value.data[i] = r.as_f64();
        out.err[i] = e;
        out.unsure[i] = u || x.unsure[i];
    }
    out
}

/// Rounding error of one op, in ulps of the result (transcendentals and
/// composites get a generous allowance: implementations differ by a few ulps).
fn unary_ulps(u: UnaryOp) -> f64 {
    use UnaryOp::*;
    match u {
        Neg | Abs | Relu | Not | Floor => 0.0,
        Sqrt | Reciprocal | Square => 1.0,
        Rsqrt => 2.0,
        _ => 16.0,
    }
}

fn f64_unary(u: UnaryOp, x: f64) -> f64 {
    lower_unary(&mut Interp, u, Val::F(x), DType::F64).as_f64()
}

fn unary(u: UnaryOp, x: &Bounded) -> Result<Bounded> {
    let sig = infer::unary(u, x.meta())?;
    let n = x.value.numel();
    let meta = Meta {
        dtype: sig.out,
        dims: sig.dims,
    };
    let mut out = Bounded::exact(HostTensor::new(meta, vec![0.0; n])?);
    for i in 0..n {
        let (xc, ex, u0) = cast_val(x.val(i), x.err[i], x.dtype(), sig.compute);
        let r = lower_unary(&mut Interp, u, xc, sig.compute);
        let (r, mut e, u1) = cast_val(r, 0.0, sig.compute, sig.out);
        let xf = xc.as_f64();
        let mut unsure = x.unsure[i] || u0 || u1;
        if sig.out.is_float() && xf.is_finite() {
            let h = 1e-6 * (1.0 + xf.abs());
            let d = (f64_unary(u, xf + h) - f64_unary(u, xf - h)) / (2.0 * h);
            let d = if d.is_finite() { d.abs() } else { 0.0 };
            let ulps = unary_ulps(u) * unit_roundoff(sig.out);
            e += mul0(d, ex) + ulps * (r.as_f64().abs() + mul0(xf.abs(), d));
            if u == UnaryOp::Floor {
                e = 0.0;
                unsure |= too_close((xf - xf.round()).abs(), ex);
            }
        } else if u == UnaryOp::Not && sig.compute.is_float() {
            unsure |= too_close(xf.abs(), ex);
        }
        out.value.data[i] = r.as_f64();
        out.err[i] = e;
        out.unsure[i] = unsure;
    }
    Ok(out)
}

/// Error and decision analysis of one binary op on compute-dtype floats.
/// Returns (propagated error before rounding, ulps of rounding, unsure).
fn binary_err(op: BinaryOp, a: f64, b: f64, ea: f64, eb: f64) -> (f64, f64, bool) {
    use BinaryOp::*;
    let near_int = |q: f64, eq: f64| too_close((q - q.round()).abs(), eq);
    match op {
        Add | Sub => (ea + eb, 1.0, false),
        Mul => (mul0(b.abs(), ea) + mul0(a.abs(), eb), 1.0, false),
        Div => (
            ea / b.abs() + mul0(a.abs() / (b * b), eb),
            1.0,
            too_close(b.abs(), eb),
        ),
        Pow => {
            let da = mul0(b, a.powf(b - 1.0)).abs();
            let db = mul0(a.abs().ln(), a.powf(b)).abs();
            let (da, db) = (finite_or(da, 0.0), finite_or(db, 0.0));
            (mul0(da, ea) + mul0(db, eb), 16.0, false)
        }
        Maximum | Minimum => (ea.max(eb), 0.0, false),
        Fmod | Remainder | FloorDiv => {
            let q = a / b;
            let eq = ea / b.abs() + mul0(q.abs() / b.abs(), eb);
            let unsure = near_int(q, eq) || too_close(b.abs(), eb);
            // d/db of a - k b is -k: k = trunc(q) for fmod, floor(q) for remainder
            let e = match op {
                FloorDiv => 0.0,
                Fmod => ea + mul0(q.trunc().abs(), eb),
                _ => ea + mul0(q.floor().abs(), eb),
            };
            (e, 2.0, unsure)
        }
        Eq | Ne | Lt | Le | Gt | Ge => (0.0, 0.0, too_close((a - b).abs(), ea + eb)),
        And | Or | Xor | BitwiseAnd | BitwiseOr | BitwiseXor => {
            (0.0, 0.0, too_close(a.abs(), ea) || too_close(b.abs(), eb))
        }
        Atan2 | Hypot => {
            let r2 = a * a + b * b;
            let (da, db) = if op == Atan2 {
                (b.abs() / r2, a.abs() / r2)
            } else {
                (a.abs() / r2.sqrt(), b.abs() / r2.sqrt())
            };
            let (da, db) = (finite_or(da, 0.0), finite_or(db, 0.0));
            (
                mul0(da, ea) + mul0(db, eb),
                4.0,
                too_close(r2.sqrt(), ea + eb),
            )
        }
        Copysign => (ea, 0.0, too_close(b.abs(), eb)),
        Xlogy => {
            let da = finite_or(b.ln().abs(), 0.0);
            let db = finite_or((a / b).abs(), 0.0);
            (mul0(da, ea) + mul0(db, eb), 16.0, too_close(b.abs(), eb))
        }
    }
}

fn finite_or(x: f64, d: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        d
    }
}

/// A binary op on tensors `a` and `b`, or on `a` and the Python number `s`
/// (`s op a` when `reversed`).
fn binary(
    op: BinaryOp,
    a: &Bounded,
    b: Option<&Bounded>,
    s: Option<f64>,
    reversed: bool,
    sig: &infer::PointwiseSig,
) -> Result<Bounded> {
    let meta = Meta {
        dtype: sig.out,
        dims: sig.dims.clone(),
    };
    let n: usize = meta.dims.iter().product();
    let mut out = Bounded::exact(HostTensor::new(meta, vec![0.0; n])?);
    let comp = sig.compute;
    // compute dtype of the operands (comparisons compare in the promoted type)
    let opnd = if matches!(op, BinaryOp::And | BinaryOp::Or) {
        DType::Bool
    } else {
        comp
    };
    let scalar = s.map(|v| Interp.constant(v, opnd));
    let dims = sig.dims.clone();
    let mut res: Result<()> = Ok(());
    for_each_index(&dims, |flat, idx| {
        let load = |t: &Bounded| {
            let i = bcast_index(idx, &t.meta().dims);
            let (v, e, u) = cast_val(t.val(i), t.err[i], t.dtype(), opnd);
            let fv = t.val(i).as_f64();
            // a float operand of a logical op keeps its float value for the analysis
            let e = if opnd == DType::Bool { t.err[i] } else { e };
            (v, e, u || t.unsure[i], fv)
        };
        let (va, ea, ua, fa) = load(a);
        let (vb, eb, ub, fb) = match (b, scalar) {
            (Some(b), _) => load(b),
            (None, Some(v)) => (v, 0.0, false, v.as_f64()),
            (None, None) => {
                res = Err(crate::Error::op(
                    "eval",
                    "binary op without a second operand",
                ));
                return;
            }
        };
        let ((va, ea, fa), (vb, eb, fb)) = if reversed {
            ((vb, eb, fb), (va, ea, fa))
        } else {
            ((va, ea, fa), (vb, eb, fb))
        };
        let r = lower_binary(&mut Interp, op, va, vb, opnd);
        let (r, _, _) = cast_val(r, 0.0, opnd, sig.out);
        let (e, ulps, unsure) = if opnd.is_float() {
            binary_err(op, va.as_f64(), vb.as_f64(), ea, eb)
        } else if opnd == DType::Bool {
            binary_err(op, fa, fb, ea, eb)
        } else {
            (0.0, 0.0, false)
        };
        let e = if sig.out.is_float() {
            e + ulps * unit_roundoff(sig.out) * r.as_f64().abs()
        } else {
            0.0
        };
        out.value.data[flat] = r.as_f64();
        out.err[flat] = e;
        out.unsure[flat] = ua || ub || unsure;
    });
    res?;
    Ok(out)
}

fn where_(c: &Bounded, a: &Bounded, b: &Bounded) -> Result<Bounded> {
    let sig = infer::where_(c.meta(), Arg::Tensor(a.meta()), Arg::Tensor(b.meta()))?;
    let meta = Meta {
        dtype: sig.out,
        dims: sig.dims.clone(),
    };
    let n: usize = meta.dims.iter().product();
    let mut out = Bounded::exact(HostTensor::new(meta, vec![0.0; n])?);
    for_each_index(&sig.dims, |flat, idx| {
        let ic = bcast_index(idx, &c.meta().dims);
        let t = if c.value.data[ic] != 0.0 { a } else { b };
        let i = bcast_index(idx, &t.meta().dims);
        let (v, e, u) = cast_val(t.val(i), t.err[i], t.dtype(), sig.out);
        out.value.data[flat] = v.as_f64();
        out.err[flat] = e;
        out.unsure[flat] = u || t.unsure[i] || c.unsure[ic];
    });
    Ok(out)
}
