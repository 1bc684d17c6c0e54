//! Constant folding: a pointwise op whose operands are all constants becomes
//! a constant, computed with the reference scalar interpreter
//! ([`kiln_ir::interp::Interp`] through `lower_unary`/`lower_binary`), in the
//! compute dtype inference gives the op (f16/bf16 in f32) and rounded to the
//! result dtype: the value a kernel would have produced.
//!
//! A result whose operands are all splats is a splat (any shape); otherwise
//! it is folded only up to [`FOLD_LIMIT`] elements, so a graph never grows a
//! large literal.

use super::{data, rw_any, Rw};
use crate::rewrite::analysis::KilnEGraph;
use crate::rewrite::lang::{KilnLang, Lit};
use egg::{Id, Subst};
use kiln_ir::graph::Constant;
use kiln_ir::interp::{eval_binary, eval_unary, Interp, Val};
use kiln_ir::op::infer::{self, Arg};
use kiln_ir::op::{Meta, Op};
use kiln_ir::scalar::ScalarOps;
use kiln_ir::shape::numel;
use kiln_ir::{BinaryOp, DType, Float};

/// The most elements a folded non-splat constant may have.
pub const FOLD_LIMIT: usize = 1 << 16;

#[rustfmt::skip]
pub fn rules() -> Vec<Rw> { vec![
    rw_any("fold-unary",         |eg, c, n| foldable(eg, c, n, Family::Unary),   fold_unary),         // f(c) is a constant
    rw_any("fold-binary",        |eg, c, n| foldable(eg, c, n, Family::Binary),  fold_binary),        // c1 op c2 is a constant
    rw_any("fold-binary-scalar", |eg, c, n| foldable(eg, c, n, Family::Scalar),  fold_binary_scalar), // c op s is a constant
    rw_any("fold-where",         |eg, c, n| foldable(eg, c, n, Family::Where),   fold_where),         // where(c, a, b) of constants
    rw_any("fold-cast",          |eg, c, n| foldable(eg, c, n, Family::Cast),    fold_cast),          // a constant converted
]}

#[derive(Clone, Copy, PartialEq)]
enum Family {
    Unary,
    Binary,
    Scalar,
    Where,
    Cast,
}

fn family(op: &Op) -> Option<Family> {
    Some(match op {
        Op::Unary(_) => Family::Unary,
        Op::Binary(_) => Family::Binary,
        Op::BinaryScalar { .. } => Family::Scalar,
        Op::Where => Family::Where,
        Op::Cast(_) => Family::Cast,
        _ => return None,
    })
}

/// `n` is an op of family `f` over constants, in a class `c` not yet holding one.
fn foldable(eg: &KilnEGraph, c: Id, n: &KilnLang, f: Family) -> bool {
    match n {
        KilnLang::Op(k, ch) => {
            k.op().and_then(family) == Some(f)
                && data(eg, c).value.is_none()
                && ch.iter().all(|&c| data(eg, c).value.is_some())
        }
        _ => false,
    }
}

fn fold_unary(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold_family(eg, root, Family::Unary)
}
fn fold_binary(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold_family(eg, root, Family::Binary)
}
fn fold_binary_scalar(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold_family(eg, root, Family::Scalar)
}
fn fold_where(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold_family(eg, root, Family::Where)
}
fn fold_cast(eg: &mut KilnEGraph, root: Id, _: &Subst) -> Vec<Id> {
    fold_family(eg, root, Family::Cast)
}

/// Folds the first foldable node of family `f` in class `root`.
fn fold_family(eg: &mut KilnEGraph, root: Id, f: Family) -> Vec<Id> {
    let Some(out) = data(eg, root).meta().cloned() else {
        return vec![];
    };
    if data(eg, root).value.is_some() {
        return vec![];
    }
    let folded = eg[root].nodes.iter().find_map(|n| {
        let (KilnLang::Op(k, ch), true) = (n, foldable(eg, root, n, f)) else {
            return None;
        };
        let lits: Vec<Lit> = ch
            .iter()
            .map(|&c| data(eg, c).value.clone())
            .collect::<Option<_>>()?;
        fold(k.op()?, &lits, &out)
    });
    match folded {
        Some(c) => vec![eg.add(KilnLang::Const(Lit::new(c)))],
        None => vec![],
    }
}

/// The element of `c` read at output index `idx` (of shape `out`), broadcasting.
fn element(c: &Constant, out: &[usize], idx: &[usize]) -> f64 {
    if c.is_splat() {
        return c.value(0);
    }
    let d = &c.meta.dims;
    let lead = out.len() - d.len();
    let mut flat = 0;
    for (k, &n) in d.iter().enumerate() {
        let i = if n == 1 { 0 } else { idx[lead + k] };
        flat = flat * n + i;
    }
    c.value(flat)
}

/// A value of dtype `dt` as the interpreter carries it.
fn val(v: f64, dt: DType) -> Val {
    Interp.constant(v, dt)
}

fn to_f64(v: Val) -> f64 {
    v.as_f64()
}

/// Computes one result element from the operand elements (read with broadcasting).
type ElementFn = Box<dyn Fn(&[f64]) -> f64>;

/// The folded constant of type `out`, or `None` if too large or not pointwise.
fn fold(op: &Op, lits: &[Lit], out: &Meta) -> Option<Constant> {
    let cs: Vec<&Constant> = lits.iter().map(|l| &*l.0).collect();
    let ms: Vec<&Meta> = cs.iter().map(|c| &c.meta).collect();
    let eval: ElementFn = match op {
        Op::Unary(u) => {
            let u = *u;
            let sig = infer::unary(u, ms[0]).ok()?;
            let (from, cd) = (ms[0].dtype, sig.compute);
            let rd = if u == kiln_ir::UnaryOp::Not {
                DType::Bool
            } else {
                cd
            };
            Box::new(move |x| {
                let x = Interp.cast(val(x[0], from), from, cd);
                to_f64(Interp.cast(eval_unary(u, x, cd), rd, sig.out))
            })
        }
        Op::Binary(b) => {
            let b = *b;
            let sig = infer::binary(b, Arg::Tensor(ms[0]), Arg::Tensor(ms[1])).ok()?;
            let (da, db) = (ms[0].dtype, ms[1].dtype);
            Box::new(move |x| binary(b, sig.compute, sig.out, [(x[0], da), (x[1], db)]))
        }
        Op::BinaryScalar {
            op: b,
            value,
            reversed,
        } => {
            let (b, reversed) = (*b, *reversed);
            let (t, sc) = (Arg::Tensor(ms[0]), Arg::Scalar(value.category()));
            let sig = if reversed {
                infer::binary(b, sc, t)
            } else {
                infer::binary(b, t, sc)
            }
            .ok()?;
            let sdt = match value.category() {
                kiln_ir::Category::Bool => DType::Bool,
                kiln_ir::Category::Int => DType::I64,
                kiln_ir::Category::Float => DType::F64,
            };
            let (sv, dx) = (value.to_f64(), ms[0].dtype);
            Box::new(move |x| {
                let (tx, sx) = ((x[0], dx), (sv, sdt));
                let ab = if reversed { [sx, tx] } else { [tx, sx] };
                binary(b, sig.compute, sig.out, ab)
            })
        }
        Op::Where => {
            let sig = infer::where_(ms[0], Arg::Tensor(ms[1]), Arg::Tensor(ms[2])).ok()?;
            let dts = [ms[0].dtype, ms[1].dtype, ms[2].dtype];
            Box::new(move |x| {
                let cd = sig.compute;
                let c = Interp.cast(val(x[0], dts[0]), dts[0], DType::Bool);
                let a = Interp.cast(val(x[1], dts[1]), dts[1], cd);
                let b = Interp.cast(val(x[2], dts[2]), dts[2], cd);
                to_f64(Interp.cast(Interp.select(c, a, b, cd), cd, sig.out))
            })
        }
        Op::Cast(to) => {
            let (from, to) = (ms[0].dtype, *to);
            Box::new(move |x| to_f64(Interp.cast(val(x[0], from), from, to)))
        }
        _ => return None,
    };
    let values = if cs.iter().all(|c| c.is_splat()) {
        let xs: Vec<f64> = cs.iter().map(|c| c.value(0)).collect();
        vec![Float(eval(&xs))]
    } else {
        let n = numel(&out.dims);
        if n > FOLD_LIMIT {
            return None;
        }
        let mut idx = vec![0usize; out.dims.len()];
        let mut vals = Vec::with_capacity(n);
        for _ in 0..n {
            let xs: Vec<f64> = cs.iter().map(|c| element(c, &out.dims, &idx)).collect();
            vals.push(Float(eval(&xs)));
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < out.dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        vals
    };
    let c = Constant {
        meta: out.clone(),
        values,
    };
    c.check().ok()?;
    Some(c)
}

/// `a op b` with operands `(value, dtype)`: both converted to the compute
/// dtype `cd`, the result (bool for comparisons) converted to `out`.
fn binary(op: BinaryOp, cd: DType, out: DType, ab: [(f64, DType); 2]) -> f64 {
    let [(a, da), (b, db)] = ab;
    let a = Interp.cast(val(a, da), da, cd);
    let b = Interp.cast(val(b, db), db, cd);
    let rd = if op.is_comparison() { DType::Bool } else { cd };
    to_f64(Interp.cast(eval_binary(op, a, b, cd), rd, out))
}

#[cfg(test)]
mod tests {
    use super::rules;
    use crate::rewrite::rules::testing::{fired, run};

    #[test]
    fn folds_pointwise_ops_over_constants() {
        let (text, r) = run(
            rules(),
            "graph g(%0 x: f32[3]) {
               %1 = constant() {value=2.0} : f32[]
               %2 = sqrt(%1) : f32[]
               %3 = constant() {value=[1.0,2.0,3.0]} : f32[3]
               %4 = mul(%3, %2) : f32[3]
               %5 = add_scalar(%4) {reversed=false, value=1} : f32[3]
               %6 = gt_scalar(%5) {reversed=false, value=3.0} : bool[3]
               %7 = where(%6, %5, %1) : f32[3]
               %8 = cast(%7) {dtype=f16} : f16[3]
               %9 = add(%0, %7) : f32[3]
               return %9, %8
             }",
            &[],
        );
        for rule in [
            "fold-unary",
            "fold-binary",
            "fold-binary-scalar",
            "fold-where",
            "fold-cast",
        ] {
            assert!(fired(&r, rule) >= 1, "{rule} did not fire:\n{r}");
        }
        // sqrt(2) in f32 = 1.4142135; 1*s+1, 2*s+1, 3*s+1 rounded to f32; the
        // first is <= 3 so where() picks 2.0
        assert_eq!(
            text,
            "graph g(%0 x: f32[3]) {
  %1 = constant() {value=[2.0,3.8284270763397217,5.242640495300293]} : f32[3]
  %2 = add(%0, %1) : f32[3]
  %3 = constant() {value=[2.0,3.828125,5.2421875]} : f16[3]
  return %2, %3
}
"
        );
    }

    #[test]
    fn splats_fold_at_any_size_and_inputs_never_fold() {
        let (text, r) = run(
            rules(),
            "graph g(%0 x: f32[1000,1000], %1 w: f32[3]) {
               %2 = constant() {value=0.5} : f32[1000,1000]
               %3 = exp(%2) : f32[1000,1000]
               %4 = mul(%0, %3) : f32[1000,1000]
               %5 = neg(%1) : f32[3]
               return %4, %5
             }",
            &["w"],
        );
        assert_eq!(fired(&r, "fold-unary"), 1, "only exp(0.5), never neg(w)");
        assert!(text.contains("constant() {value=1.6487212181091309} : f32[1000,1000]"));
        assert!(
            text.contains("neg(%1)"),
            "a parameter is not a constant:\n{text}"
        );
    }

    #[test]
    fn large_non_splat_results_are_not_folded() {
        let n = super::FOLD_LIMIT + 1;
        let vals: Vec<String> = (0..2).map(|i| format!("{i}.0")).collect();
        let text = format!(
            "graph g() {{
               %0 = constant() {{value=[{}]}} : f32[2,1]
               %1 = constant() {{value=1.5}} : f32[{n}]
               %2 = add(%0, %1) : f32[2,{n}]
               return %2
             }}",
            vals.join(",")
        );
        let (_, r) = run(rules(), &text, &[]);
        assert_eq!(fired(&r, "fold-binary"), 0);
    }
}
