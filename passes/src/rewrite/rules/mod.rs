//! The rule sets, each a table in its own file (`lhs => rhs`, a one-line
//! reason per rule), and the few helpers their rows are written with.
//!
//! Habits (after Cranelift's "rules for writing optimization rules"): the
//! right-hand side is never worse than the left; no blanket commutativity or
//! associativity, only targeted variants; a rule that must compute something
//! (compose permutations, fold constants, fold BatchNorm into conv weights)
//! is a function applier, everything else a pattern; a rule never changes a
//! value's dtype or shape (conditions compare types with the analysis, and
//! the analysis rejects a merge of different types).

pub mod algebra;
pub mod batchnorm_fold;
pub mod constant_fold;

use super::analysis::{ClassData, KilnEGraph, MetaAnalysis};
use super::lang::{KilnLang, Kind};
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use kiln_ir::op::{Meta, Op};

pub type Rw = Rewrite<KilnLang, MetaAnalysis>;

/// A side condition on a match: the e-graph, the matched class, the substitution.
pub type Cond = Box<dyn Fn(&KilnEGraph, Id, &Subst) -> bool + Send + Sync>;

/// A computed right-hand side: adds what it needs and returns the classes
/// equal to the matched one (none: the rule does not apply here).
pub type BuildFn = fn(&mut KilnEGraph, Id, &Subst) -> Vec<Id>;

/// Every built-in rule.
pub fn all() -> Vec<Rw> {
    let mut v = algebra::rules();
    v.extend(constant_fold::rules());
    v.extend(batchnorm_fold::rules());
    v
}

/// A pattern of a rule table (a typo there is a bug in kiln: it panics, and
/// every table is built by a test).
pub fn pat(s: &str) -> Pattern<KilnLang> {
    s.parse()
        .unwrap_or_else(|e| panic!("bad rule pattern {s:?}: {e}"))
}

/// `lhs => rhs`.
pub fn rw(name: &str, lhs: &str, rhs: &str) -> Rw {
    Rewrite::new(name, pat(lhs), pat(rhs)).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// `lhs => rhs if every condition holds`.
pub fn rw_if(name: &str, lhs: &str, rhs: &str, conds: impl IntoIterator<Item = Cond>) -> Rw {
    let rhs = Guarded {
        rhs: pat(rhs),
        conds: conds.into_iter().collect(),
    };
    Rewrite::new(name, pat(lhs), rhs).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// `lhs => f(match)`.
pub fn rw_fn(name: &str, lhs: &str, f: BuildFn) -> Rw {
    Rewrite::new(name, pat(lhs), Build(f)).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// `<every class holding an e-node named op_name> => f(match)`, for rules
/// whose left-hand side has no fixed arity (optional operands).
pub fn rw_named(name: &str, op_name: &str, f: BuildFn) -> Rw {
    let s = NodeSearcher {
        kind: Some(op_name.into()),
        pred: |_, _, _| true,
    };
    Rewrite::new(name, s, Build(f)).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// A test on one e-node (and its class), for rules that look at every class.
pub type NodePred = fn(&KilnEGraph, Id, &KilnLang) -> bool;

/// `<every class holding an e-node for which pred holds> => f(match)`.
pub fn rw_any(name: &str, pred: NodePred, f: BuildFn) -> Rw {
    let s = NodeSearcher { kind: None, pred };
    Rewrite::new(name, s, Build(f)).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

struct Guarded {
    rhs: Pattern<KilnLang>,
    conds: Vec<Cond>,
}

impl Applier<KilnLang, MetaAnalysis> for Guarded {
    fn apply_one(
        &self,
        eg: &mut KilnEGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<KilnLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        if !self.conds.iter().all(|c| c(eg, eclass, subst)) {
            return vec![];
        }
        // no searcher ast: it may hold wildcards, which must never be instantiated
        self.rhs.apply_one(eg, eclass, subst, None, rule)
    }

    fn vars(&self) -> Vec<Var> {
        self.rhs.vars()
    }
}

struct Build(BuildFn);

impl Applier<KilnLang, MetaAnalysis> for Build {
    fn apply_one(
        &self,
        eg: &mut KilnEGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<KilnLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let mut changed = vec![];
        for new in (self.0)(eg, eclass, subst) {
            if eg.union_trusted(eclass, new, rule) {
                changed.push(eclass);
            }
        }
        changed
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// Matches every class holding an e-node (named `kind`, if given) for which
/// `pred` holds: one empty substitution each, in class id order.
struct NodeSearcher {
    kind: Option<String>,
    pred: NodePred,
}

impl NodeSearcher {
    fn hit(&self, eg: &KilnEGraph, c: Id) -> bool {
        eg[c].nodes.iter().any(|n| {
            let named = match (&self.kind, n) {
                (None, _) => true,
                (Some(k), KilnLang::Op(key, _)) => key.name() == k,
                _ => false,
            };
            named && (self.pred)(eg, c, n)
        })
    }
}

impl Searcher<KilnLang, MetaAnalysis> for NodeSearcher {
    fn search_eclass_with_limit(
        &self,
        eg: &KilnEGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, KilnLang>> {
        (limit > 0 && self.hit(eg, eclass)).then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn search_with_limit(&self, eg: &KilnEGraph, limit: usize) -> Vec<SearchMatches<'_, KilnLang>> {
        let mut ids: Vec<Id> = match &self.kind {
            Some(k) => match eg.classes_for_op(&Kind::Op(k.clone())) {
                Some(it) => it.collect(),
                None => return vec![],
            },
            None => eg.classes().map(|c| c.id).collect(),
        };
        ids.sort();
        ids.into_iter()
            .filter_map(|id| self.search_eclass_with_limit(eg, id, 1))
            .take(limit)
            .collect()
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// The e-nodes of class `c` that are ops named `name`: each op and its operands.
pub fn nodes_named<'a>(
    eg: &'a KilnEGraph,
    c: Id,
    name: &'a str,
) -> impl Iterator<Item = (&'a Op, &'a [Id])> + 'a {
    eg[c].nodes.iter().filter_map(move |n| match n {
        KilnLang::Op(k, ch) if k.name() == name => k.op().map(|op| (op, &ch[..])),
        _ => None,
    })
}

/// The class bound to `var` (a pattern variable such as `"?x"`).
pub fn var(subst: &Subst, v: &str) -> Id {
    subst[v.parse::<Var>().expect("a pattern variable")]
}

pub fn data(eg: &KilnEGraph, c: Id) -> &ClassData {
    &eg[c].data
}

/// The type of single-valued class `c`.
pub fn meta(eg: &KilnEGraph, c: Id) -> Option<&Meta> {
    eg[c].data.meta()
}

/// Adds `op(operands)` if its types infer (never records a type error).
pub fn add_op(eg: &mut KilnEGraph, op: Op, operands: &[Id]) -> Option<Id> {
    let ins: Option<Vec<Meta>> = operands.iter().map(|&c| meta(eg, c).cloned()).collect();
    let metas = op.infer(&ins?).ok()?;
    let id = eg.add(KilnLang::op(op, operands));
    (eg[id].data.metas.as_slice() == metas.as_slice()).then_some(id)
}

/// `?v` has the matched class's type (so replacing the match by `?v` keeps dtype and shape).
pub fn same_type(v: &str) -> Cond {
    let v: Var = v.parse().expect("a pattern variable");
    Box::new(move |eg, root, s| {
        let (a, b) = (meta(eg, s[v]), meta(eg, root));
        a.is_some() && a == b
    })
}

/// `?v` is a constant with every element equal to `x`.
pub fn is_splat(v: &str, x: f64) -> Cond {
    let v: Var = v.parse().expect("a pattern variable");
    Box::new(move |eg, _, s| splat_of(eg, s[v]) == Some(x))
}

/// The value of a class holding a splat constant.
pub fn splat_of(eg: &KilnEGraph, c: Id) -> Option<f64> {
    eg[c].data.value.as_ref().and_then(|l| l.splat())
}

#[cfg(test)]
pub(crate) mod testing {
    //! Running one rule set on a graph text, for the per-rule tests.
    use super::Rw;
    use crate::rewrite::{rewrite_with, RewriteConfig, RewriteReport};
    use kiln_ir::graph::Graph;

    /// Rewrites `text` with only `rules` (params: the inputs named in `params`);
    /// returns the result's text and the report.
    pub fn run(rules: Vec<Rw>, text: &str, params: &[&str]) -> (String, RewriteReport) {
        let g = Graph::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let params = g
            .inputs()
            .iter()
            .copied()
            .filter(|&i| match &g.node(i).op {
                kiln_ir::graph::NodeOp::Input { name } => params.contains(&name.as_str()),
                _ => false,
            })
            .collect();
        let cfg = RewriteConfig {
            params,
            ..RewriteConfig::default()
        };
        let out = rewrite_with(&g, &cfg, &rules).unwrap_or_else(|e| panic!("{e}\n{text}"));
        (out.graph.to_text(), out.report)
    }

    /// How often rule `name` fired.
    pub fn fired(r: &RewriteReport, name: &str) -> usize {
        r.fired.get(name).copied().unwrap_or(0)
    }
}
