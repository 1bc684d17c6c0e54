//! Algebraic simplification: identities that hold exactly (bit for bit, in
//! every dtype the condition admits), idempotence, and collapsing chains of
//! layout ops. No rule changes a value's dtype or shape: `same_type("?x")`
//! checks that the replacement has the matched value's type (so `i32 * 1.0`,
//! which is f32, or `x[3] * ones[2,3]`, which broadcasts, stay as they are).

use super::{
    add_op, data, is_splat, meta, nodes_named, rw, rw_fn, rw_if, same_type, splat_of, var, Cond, Rw,
};
use crate::rewrite::analysis::KilnEGraph;
use crate::rewrite::lang::{KilnLang, Lit};
use egg::{Id, Subst, Var};
use kiln_ir::graph::Constant;
use kiln_ir::op::Op;
use kiln_ir::shape::norm_dim;

#[rustfmt::skip]
pub fn rules() -> Vec<Rw> { vec![
    // identities: x*1, x/1, x-(+0) are exact for every float, x+0 is not
    // (-0 + 0 = +0), so floats drop only x+(-0); integers any zero
    rw_if("mul-one",         "(mul ?x ?c)",         "?x", [is_splat("?c", 1.0), same_type("?x")]), // x*1 = x
    rw_if("mul-one-left",    "(mul ?c ?x)",         "?x", [is_splat("?c", 1.0), same_type("?x")]), // 1*x = x
    rw_if("div-one",         "(div ?x ?c)",         "?x", [is_splat("?c", 1.0), same_type("?x")]), // x/1 = x
    rw_if("sub-zero",        "(sub ?x ?c)",         "?x", [is_sub_zero("?c"), same_type("?x")]),   // x-0 = x
    rw_if("add-zero",        "(add ?x ?c)",         "?x", [is_add_zero("?c"), same_type("?x")]),   // x+0 = x
    rw_if("add-zero-left",   "(add ?c ?x)",         "?x", [is_add_zero("?c"), same_type("?x")]),   // 0+x = x
    rw_if("mul-scalar-one",  "(mul_scalar<*> ?x)",  "?x", [scalar("mul_scalar", true, |v, _| v == 1.0), same_type("?x")]),  // x*1 = x
    rw_if("div-scalar-one",  "(div_scalar<*> ?x)",  "?x", [scalar("div_scalar", false, |v, _| v == 1.0), same_type("?x")]), // x/1 = x
    rw_if("sub-scalar-zero", "(sub_scalar<*> ?x)",  "?x", [scalar("sub_scalar", false, sub_zero), same_type("?x")]),        // x-0 = x
    rw_if("add-scalar-zero", "(add_scalar<*> ?x)",  "?x", [scalar("add_scalar", true, add_zero), same_type("?x")]),         // x+0 = x
    rw(   "neg-neg",         "(neg (neg ?x))",      "?x"),                                         // -(-x) = x
    rw(   "relu-relu",       "(relu (relu ?x))",    "(relu ?x)"),                                  // relu is idempotent
    rw_if("cast-id",         "(cast<*> ?x)",        "?x", [same_type("?x")]),                      // a cast to its own dtype
    // layout chains
    rw_fn("permute-permute", "(permute<*> (permute<*> ?x))", compose_permutes),     // permute(permute(x,p),q) = permute(x,p[q])
    rw_if("permute-id",      "(permute<*> ?x)",     "?x", [identity_permute()]),   // permute(x,[0,1,..]) = x
    rw_fn("view-view",       "(view<*> (view<*> ?x))",     view_of_view),         // reshape(reshape(x)) = reshape(x) to the outer shape
    rw_if("view-id",         "(view<*> ?x)",        "?x", [same_type("?x")]),      // reshape to its own shape
    rw_fn("expand-expand",   "(expand<*> (expand<*> ?x))", expand_of_expand),     // broadcasts compose
    rw_if("expand-id",       "(expand<*> ?x)",      "?x", [same_type("?x")]),      // expand to its own shape
    // a splat constant seen through a layout op is a splat constant of the new shape
    rw_fn("splat-view",      "(view<*> ?c)",        splat_relaid),
    rw_fn("splat-expand",    "(expand<*> ?c)",      splat_relaid),
    rw_fn("splat-permute",   "(permute<*> ?c)",     splat_relaid),
    rw_fn("splat-slice",     "(slice<*> ?c)",       splat_relaid),
    rw_fn("splat-select",    "(select<*> ?c)",      splat_relaid),
]}

/// `?c` is a zero that `x + ?c` keeps `x` for (the matched class's dtype
/// decides): any zero for integers and bools, only `-0.0` for floats.
fn is_add_zero(c: &str) -> Cond {
    let c: Var = c.parse().expect("a pattern variable");
    Box::new(
        move |eg, root, s| match (splat_of(eg, s[c]), meta(eg, root)) {
            (Some(v), Some(m)) => add_zero(v, m.dtype.is_float()),
            _ => false,
        },
    )
}

/// `?c` is a zero that `x - ?c` keeps `x` for: `+0` (`x - (-0)` is `x + 0`).
fn is_sub_zero(c: &str) -> Cond {
    let c: Var = c.parse().expect("a pattern variable");
    Box::new(
        move |eg, root, s| match (splat_of(eg, s[c]), meta(eg, root)) {
            (Some(v), Some(m)) => sub_zero(v, m.dtype.is_float()),
            _ => false,
        },
    )
}

fn add_zero(v: f64, float: bool) -> bool {
    if float {
        v == 0.0 && v.is_sign_negative()
    } else {
        v == 0.0
    }
}

fn sub_zero(v: f64, _float: bool) -> bool {
    v == 0.0 && v.is_sign_positive()
}

/// The matched class holds `<name>(?x)` with a scalar `v` for which
/// `ok(v, result is float)`; `reversed` (`v op x`) only if `either_side`.
fn scalar(name: &'static str, either_side: bool, ok: fn(f64, bool) -> bool) -> Cond {
    Box::new(move |eg, root, s| {
        let x = eg.find(var(s, "?x"));
        let Some(m) = meta(eg, root) else {
            return false;
        };
        let float = m.dtype.is_float();
        nodes_named(eg, root, name).any(|(op, ch)| match op {
            Op::BinaryScalar {
                value, reversed, ..
            } => eg.find(ch[0]) == x && (either_side || !reversed) && ok(value.to_f64(), float),
            _ => false,
        })
    })
}

/// Normalised permutation dims, or `None` if `p` is not one for that rank.
fn perm(p: &[i64], rank: usize) -> Option<Vec<usize>> {
    let v: Option<Vec<usize>> = p
        .iter()
        .map(|&d| norm_dim("permute", d, rank).ok())
        .collect();
    v.filter(|v| v.len() == rank)
}

fn identity_permute() -> Cond {
    Box::new(|eg, root, s| {
        let x = eg.find(var(s, "?x"));
        let Some(rank) = meta(eg, x).map(|m| m.dims.len()) else {
            return false;
        };
        nodes_named(eg, root, "permute").any(|(op, ch)| match op {
            Op::Permute(p) => {
                eg.find(ch[0]) == x
                    && perm(p, rank).is_some_and(|p| p.iter().enumerate().all(|(i, &d)| i == d))
            }
            _ => false,
        })
    })
}

/// The layout ops named `name` in `outer` whose operand holds one named
/// `name` over `x`: (outer op, inner op) pairs.
fn chains(eg: &KilnEGraph, outer: Id, x: Id, name: &str) -> Vec<(Op, Op)> {
    let x = eg.find(x);
    let mut out = vec![];
    for (o, och) in nodes_named(eg, outer, name) {
        for (i, ich) in nodes_named(eg, och[0], name) {
            if eg.find(ich[0]) == x {
                out.push((o.clone(), i.clone()));
            }
        }
    }
    out
}

fn compose_permutes(eg: &mut KilnEGraph, root: Id, s: &Subst) -> Vec<Id> {
    let x = var(s, "?x");
    let Some(rank) = meta(eg, x).map(|m| m.dims.len()) else {
        return vec![];
    };
    let mut out = vec![];
    for (outer, inner) in chains(eg, root, x, "permute") {
        let (Op::Permute(q), Op::Permute(p)) = (outer, inner) else {
            continue;
        };
        let (Some(q), Some(p)) = (perm(&q, rank), perm(&p, rank)) else {
            continue;
        };
        // result dim j is inner dim q[j], which is x's dim p[q[j]]
        let r: Vec<usize> = q.iter().map(|&j| p[j]).collect();
        if r.iter().enumerate().all(|(i, &d)| i == d) {
            out.push(x);
        } else if let Some(id) =
            add_op(eg, Op::Permute(r.iter().map(|&d| d as i64).collect()), &[x])
        {
            out.push(id);
        }
    }
    out
}

/// Reshaping or broadcasting twice is doing it once, to the outer result's shape.
fn relayout_once(eg: &mut KilnEGraph, root: Id, s: &Subst, name: &str) -> Vec<Id> {
    let x = var(s, "?x");
    let Some(dims) = meta(eg, root).map(|m| m.dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
    else {
        return vec![];
    };
    if chains(eg, root, x, name).is_empty() {
        return vec![];
    }
    let op = match name {
        "view" => Op::View(dims),
        _ => Op::Expand(dims),
    };
    add_op(eg, op, &[x]).into_iter().collect()
}

fn view_of_view(eg: &mut KilnEGraph, root: Id, s: &Subst) -> Vec<Id> {
    relayout_once(eg, root, s, "view")
}

fn expand_of_expand(eg: &mut KilnEGraph, root: Id, s: &Subst) -> Vec<Id> {
    relayout_once(eg, root, s, "expand")
}

fn splat_relaid(eg: &mut KilnEGraph, root: Id, s: &Subst) -> Vec<Id> {
    let (Some(v), Some(m)) = (splat_of(eg, var(s, "?c")), meta(eg, root)) else {
        return vec![];
    };
    if data(eg, root).value.is_some() {
        return vec![];
    }
    let c = Constant::full(v, m.clone());
    vec![eg.add(KilnLang::Const(Lit::new(c)))]
}

#[cfg(test)]
#[path = "algebra_tests.rs"]
mod tests;
