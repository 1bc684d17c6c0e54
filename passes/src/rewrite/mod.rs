//! The e-graph rewrite stage of `compile()`: a graph is lowered into an egg
//! e-graph ([`lang`]), whose classes carry type and constness ([`analysis`]);
//! the rule sets ([`rules`]: algebra, constant folding, BatchNorm folding) run
//! to saturation or to the limits of [`RewriteConfig`]; the cheapest
//! equivalent graph under a bytes-moved cost model is extracted ([`extract`]).
//!
//! ```
//! use kiln_ir::graph::Graph;
//! use kiln_passes::rewrite::{rewrite, RewriteConfig};
//! let g = Graph::parse("graph g(%0 x: f32[4]) {
//!   %1 = relu(%0) : f32[4]
//!   %2 = relu(%1) : f32[4]
//!   return %2
//! }").unwrap();
//! let out = rewrite(&g, &RewriteConfig::default()).unwrap();
//! assert_eq!(out.graph.to_text(), "graph g(%0 x: f32[4]) {\n  %1 = relu(%0) : f32[4]\n  return %1\n}\n");
//! assert_eq!(out.report.stop_reason, "Saturated");
//! ```
//!
//! The graph's inputs come back unchanged (the first nodes, in order, with
//! their names and types, used or not), and so do its outputs (order and
//! types); nodes no output depends on are dropped.

pub mod analysis;
pub mod extract;
pub mod lang;
pub mod rules;

use analysis::{KilnEGraph, MetaAnalysis};
use egg::{Runner, SimpleScheduler};
use extract::{graph_cost, Choice};
use kiln_ir::graph::{Graph, NodeId};
use kiln_ir::{bail, Result};
use lang::{KilnLang, Signature};
use rules::Rw;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

/// Limits and inputs of one rewrite.
pub struct RewriteConfig {
    /// Stop when the e-graph holds this many e-nodes.
    pub node_limit: usize,
    /// Stop after this many iterations (one search and apply of every rule).
    pub iter_limit: usize,
    /// Stop after this long (checked between rules).
    pub time_limit: Duration,
    /// Graph inputs that are parameters or buffers (fixed between calls until changed).
    pub params: BTreeSet<NodeId>,
    /// Rules run after the built-in ones (for tests, e.g. a deliberately wrong rewrite).
    pub extra_rules: Vec<Rw>,
}

impl Default for RewriteConfig {
    fn default() -> Self {
        RewriteConfig {
            node_limit: 10_000,
            iter_limit: 30,
            time_limit: Duration::from_millis(50),
            params: BTreeSet::new(),
            extra_rules: Vec::new(),
        }
    }
}

/// What a rewrite did.
#[derive(Debug, Clone, PartialEq)]
pub struct RewriteReport {
    /// egg's stop reason: `Saturated`, `IterationLimit(30)`, `NodeLimit(10000)`, `TimeLimit(0.05)`.
    pub stop_reason: String,
    pub iterations: usize,
    /// E-nodes and e-classes in the e-graph at the end.
    pub enodes: usize,
    pub eclasses: usize,
    /// How often each rule changed the e-graph, by rule name.
    pub fired: BTreeMap<String, usize>,
    /// The cost model (see [`extract`]) of the graph before and after.
    pub cost_before: f64,
    pub cost_after: f64,
    pub time: Duration,
}

/// One fact per line (`KILN_LOG=rewrites`); every line but `time` is the same
/// from run to run for a graph that saturates.
impl fmt::Display for RewriteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "stop: {}", self.stop_reason)?;
        writeln!(f, "iterations: {}", self.iterations)?;
        writeln!(f, "enodes: {}", self.enodes)?;
        writeln!(f, "eclasses: {}", self.eclasses)?;
        for (rule, n) in &self.fired {
            writeln!(f, "fired {rule}: {n}")?;
        }
        writeln!(f, "cost before: {:.0}", self.cost_before)?;
        writeln!(f, "cost after: {:.0}", self.cost_after)?;
        writeln!(f, "time: {:.3}ms", self.time.as_secs_f64() * 1e3)
    }
}

/// The rewritten graph and what happened.
#[derive(Debug)]
pub struct Rewritten {
    pub graph: Graph,
    pub report: RewriteReport,
    /// Per node of `graph`: the node of the original graph whose value it
    /// computes (same e-class), if any — how shadow mode matches kernels to
    /// traced ops.
    pub origin: Vec<Option<NodeId>>,
}

/// Rewrites `g` with the built-in rules and `cfg.extra_rules`.
pub fn rewrite(g: &Graph, cfg: &RewriteConfig) -> Result<Rewritten> {
    let mut rules = rules::all();
    rules.extend(cfg.extra_rules.iter().cloned());
    rewrite_with(g, cfg, &rules)
}

/// Rewrites `g` with exactly `rules` (`cfg.extra_rules` is ignored).
pub fn rewrite_with(g: &Graph, cfg: &RewriteConfig, rules: &[Rw]) -> Result<Rewritten> {
    let start = Instant::now();
    g.verify()?;
    let sig = Signature::of(g);
    let is_param: Vec<bool> = g.inputs().iter().map(|i| cfg.params.contains(i)).collect();
    if let Some(p) = cfg.params.iter().find(|p| !g.inputs().contains(p)) {
        bail!(
            "rewrite",
            "parameter {p:?} is not an input of graph {}",
            g.name()
        );
    }
    let metas = sig.inputs.iter().map(|(_, m)| m.clone()).collect();
    let mut eg = KilnEGraph::new(MetaAnalysis::new(metas, is_param.clone()));
    let ids = lang::lower(g, |n| eg.add(n))?;
    let outputs: Vec<_> = g.outputs().iter().map(|o| ids[o.index()]).collect();
    eg.analysis.set_outputs(outputs.clone());

    let runner = Runner::<KilnLang, MetaAnalysis, ()>::new(MetaAnalysis::default())
        .with_egraph(eg)
        .with_scheduler(SimpleScheduler)
        .with_node_limit(cfg.node_limit)
        .with_iter_limit(cfg.iter_limit)
        .with_time_limit(cfg.time_limit)
        .run(rules);
    let eg = &runner.egraph;
    if let Some(e) = eg.analysis.errors().first() {
        let fired: Vec<String> = fired(&runner).into_keys().collect();
        bail!("rewrite", "{e} (rules that fired: {})", fired.join(", "));
    }

    let choice = Choice::new(eg);
    let (out, classes) = choice.build_with_classes(eg, &outputs, &sig)?;
    // each new node computes the value of the first original node in its e-class
    let mut first_in_class: std::collections::HashMap<egg::Id, NodeId> = Default::default();
    for (i, id) in ids.iter().enumerate() {
        first_in_class
            .entry(eg.find(*id))
            .or_insert(NodeId(i as u32));
    }
    let origin = (0..out.len())
        .map(|i| {
            classes
                .get(&NodeId(i as u32))
                .and_then(|c| first_in_class.get(c).copied())
        })
        .collect();
    out.verify()?;
    check_interface(g, &out)?;
    let report = RewriteReport {
        stop_reason: match &runner.stop_reason {
            Some(r) => format!("{r:?}"),
            None => "none".into(),
        },
        iterations: runner.iterations.len(),
        enodes: eg.total_number_of_nodes(),
        eclasses: eg.number_of_classes(),
        fired: fired(&runner),
        cost_before: graph_cost(g, &cfg.params),
        cost_after: graph_cost(&out, &params_of(&out, &is_param)),
        time: start.elapsed(),
    };
    Ok(Rewritten {
        graph: out,
        report,
        origin,
    })
}

/// The input nodes of `g` at the positions `is_param` marks.
fn params_of(g: &Graph, is_param: &[bool]) -> BTreeSet<NodeId> {
    let inputs = g.inputs().iter().zip(is_param);
    inputs.filter(|(_, &p)| p).map(|(&i, _)| i).collect()
}

fn fired(runner: &Runner<KilnLang, MetaAnalysis, ()>) -> BTreeMap<String, usize> {
    let mut fired = BTreeMap::new();
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            *fired.entry(rule.to_string()).or_insert(0) += n;
        }
    }
    fired
}

/// The rewritten graph binds the same inputs and returns values of the same types.
fn check_interface(before: &Graph, after: &Graph) -> Result<()> {
    if Signature::of(before).inputs != Signature::of(after).inputs {
        bail!("rewrite", "the inputs of graph {} changed", before.name());
    }
    let types = |g: &Graph| -> Vec<_> { g.outputs().iter().map(|&o| g.meta(o).cloned()).collect() };
    if types(before) != types(after) {
        bail!(
            "rewrite",
            "the outputs of graph {} changed type",
            before.name()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
