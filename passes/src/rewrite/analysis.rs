//! [`MetaAnalysis`]: what every e-class knows about its value — its type
//! ([`Meta`]: dtype and shape, several for a multi-output op), whether it is
//! parameter-only, and its literal value when it holds a constant.
//!
//! A class is *parameter-only* (`konst`) when it depends only on constants
//! and on graph inputs listed as parameters (weights and buffers, which stay
//! fixed between calls until changed): later stages compute such values once
//! per parameter version, so the cost model counts them as nearly free.
//!
//! Types are inferred with [`Op::infer`](kiln_ir::op::Op::infer), the same
//! code the graph builder runs. Two classes of different types must never be
//! merged: a rule that would change a value's dtype or shape is a bug, so
//! such a merge (or an e-node whose types do not infer) is recorded in
//! [`MetaAnalysis::errors`] and fails the rewrite.

use super::lang::{KilnLang, Lit};
use egg::{Analysis, DidMerge, EGraph, Id};
use kiln_ir::op::Meta;
use kiln_ir::shape::fmt_dims;
use smallvec::SmallVec;

/// The analysis state: the graph's input types and which inputs are parameters.
#[derive(Debug, Default, Clone)]
pub struct MetaAnalysis {
    inputs: Vec<Meta>,
    params: Vec<bool>,
    errors: Vec<String>,
    outputs: Vec<Id>,
}

impl MetaAnalysis {
    /// `inputs[i]` is the type of graph input `i`; `params[i]` whether it is a parameter.
    pub fn new(inputs: Vec<Meta>, params: Vec<bool>) -> MetaAnalysis {
        MetaAnalysis {
            inputs,
            params,
            errors: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Records the graph's outputs: values used outside the e-graph.
    pub fn set_outputs(&mut self, outputs: Vec<Id>) {
        self.outputs = outputs;
    }

    /// The graph's outputs (not canonical: compare with `find`).
    pub fn outputs(&self) -> &[Id] {
        &self.outputs
    }

    /// Type conflicts seen so far (empty unless a rule is wrong).
    pub fn errors(&self) -> &[String] {
        &self.errors
    }
}

/// What one e-class knows.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassData {
    /// One meta per value (several for a multi-output op); empty if unknown (an error).
    pub metas: SmallVec<[Meta; 1]>,
    /// Depends only on constants and parameter inputs.
    pub konst: bool,
    /// The literal, when the class holds a constant.
    pub value: Option<Lit>,
}

impl ClassData {
    /// The type of a single-valued class.
    pub fn meta(&self) -> Option<&Meta> {
        match self.metas.as_slice() {
            [m] => Some(m),
            _ => None,
        }
    }
}

/// `f32[2,3]`, or `(f32[2], i64[2])` for several values.
pub fn fmt_metas(ms: &[Meta]) -> String {
    let v: Vec<String> = ms
        .iter()
        .map(|m| format!("{}{}", m.dtype, fmt_dims(&m.dims)))
        .collect();
    match v.as_slice() {
        [one] => one.clone(),
        _ => format!("({})", v.join(", ")),
    }
}

pub type KilnEGraph = EGraph<KilnLang, MetaAnalysis>;

impl Analysis<KilnLang> for MetaAnalysis {
    type Data = ClassData;

    fn make(eg: &mut KilnEGraph, enode: &KilnLang, _id: Id) -> ClassData {
        let (metas, konst, value) = match enode {
            KilnLang::Input(i) => {
                let i = *i as usize;
                let a = &eg.analysis;
                let m = a.inputs.get(i).cloned();
                let p = a.params.get(i).copied().unwrap_or(false);
                (m.into_iter().collect(), p, None)
            }
            KilnLang::Const(c) => (
                std::iter::once(c.0.meta.clone()).collect(),
                true,
                Some(c.clone()),
            ),
            KilnLang::Op(k, ch) => {
                let ins: Option<Vec<Meta>> =
                    ch.iter().map(|&c| eg[c].data.meta().cloned()).collect();
                let konst = ch.iter().all(|&c| eg[c].data.konst);
                let metas = match (k.op(), ins) {
                    (Some(op), Some(ins)) => match op.infer(&ins) {
                        Ok(m) => m.into_iter().collect(),
                        Err(e) => {
                            eg.analysis.errors.push(format!("{k}: {e}"));
                            SmallVec::new()
                        }
                    },
                    _ => {
                        eg.analysis
                            .errors
                            .push(format!("{k}: operand types unknown or wildcard"));
                        SmallVec::new()
                    }
                };
                (metas, konst, None)
            }
            KilnLang::Project(i, [t]) => {
                let d = &eg[*t].data;
                let m = d.metas.get(*i as usize).cloned();
                (m.into_iter().collect(), d.konst, None)
            }
        };
        if metas.is_empty() && !matches!(enode, KilnLang::Op(..)) {
            eg.analysis.errors.push(format!("{enode}: no type"));
        }
        ClassData {
            metas,
            konst,
            value,
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        let mut changed_b = false;
        if a.metas != b.metas {
            if a.metas.is_empty() {
                a.metas = b.metas.clone();
                changed_a = true;
            } else if b.metas.is_empty() {
                changed_b = true;
            } else {
                self.errors.push(format!(
                    "a rewrite merged values of types {} and {}",
                    fmt_metas(&a.metas),
                    fmt_metas(&b.metas)
                ));
            }
        }
        if a.konst != b.konst {
            if a.konst {
                changed_b = true;
            } else {
                a.konst = true;
                changed_a = true;
            }
        }
        match (&a.value, &b.value) {
            (None, Some(v)) => {
                a.value = Some(v.clone());
                changed_a = true;
            }
            (Some(_), None) => changed_b = true,
            _ => {}
        }
        DidMerge(changed_a, changed_b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::lang::lower;
    use kiln_ir::graph::Graph;

    fn egraph(text: &str, params: &[bool]) -> (KilnEGraph, Vec<Id>) {
        let g = Graph::parse(text).unwrap();
        let metas = g.inputs().iter().map(|&i| g.meta(i).unwrap().clone());
        let mut eg = KilnEGraph::new(MetaAnalysis::new(metas.collect(), params.to_vec()));
        let ids = lower(&g, |n| eg.add(n)).unwrap();
        eg.rebuild();
        (eg, ids)
    }

    #[test]
    fn types_and_constness() {
        let (eg, ids) = egraph(
            "graph g(%0 x: f32[2,3], %1 w: f32[3]) {
               %2 = mul(%0, %1) : f32[2,3]
               %3 = constant() {value=2.0} : f32[]
               %4 = mul(%1, %3) : f32[3]
               return %2, %4
             }",
            &[false, true],
        );
        let d = |i: usize| &eg[ids[i]].data;
        assert_eq!(d(2).meta(), Some(&Meta::new(kiln_ir::DType::F32, &[2, 3])));
        assert!(!d(2).konst, "depends on the activation x");
        assert!(d(4).konst, "weight times a constant is parameter-only");
        assert!(d(3).value.is_some() && d(4).value.is_none());
        assert!(
            eg.analysis.errors().is_empty(),
            "{:?}",
            eg.analysis.errors()
        );
    }

    #[test]
    fn merging_different_types_is_an_error() {
        let (mut eg, ids) = egraph(
            "graph g(%0 x: f32[2,3]) {
               %1 = sum(%0) {dims=[1], keepdim=false} : f32[2]
               return %1
             }",
            &[false],
        );
        eg.union(ids[0], ids[1]);
        eg.rebuild();
        assert_eq!(
            eg.analysis.errors(),
            ["a rewrite merged values of types f32[2,3] and f32[2]"]
        );
    }
}
