//! One compiled entry: trace -> rewrite -> decompose -> fuse -> plan, timed
//! stage by stage, then run under its guards.

use super::disk_cache;
use super::exec::{Executable, HoistCache};
use super::guard::Guards;
use super::joint::{self, TrainPlan};
use super::recompute::save_policy;
use super::trace::{self, Binding, GraphBreak, Trace};
use crate::Tensor;
use kiln_ir::graph::Graph;
use kiln_ir::graph::NodeId;
use kiln_ir::Result;
use kiln_passes::lower::decompose_with_map;
use kiln_passes::partition::partition_with;
use kiln_passes::rewrite::rules::Rw;
use kiln_passes::rewrite::{rewrite, RewriteConfig};
use std::time::{Duration, Instant};

/// Knobs of `compile()`.
#[derive(Clone)]
pub struct CompileOptions {
    /// Guard misses (other than a new batch size) before falling back to eager.
    pub recompile_limit: usize,
    /// Shadow mode: compare against eager on every call within this tolerance.
    pub shadow_tol: Option<f64>,
    /// Read and write planned graphs in the disk cache (see `disk_cache`).
    pub disk_cache: bool,
    /// Rewrite rules added to the built-in ones (tests plant wrong ones to
    /// check shadow mode). A graph rewritten with extra rules never goes to
    /// the disk cache.
    pub extra_rules: Vec<Rw>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            recompile_limit: 8,
            shadow_tol: None,
            disk_cache: true,
            extra_rules: vec![],
        }
    }
}

/// Compile time by stage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageTimes {
    /// Running the function eagerly while recording the graph.
    pub trace: Duration,
    pub rewrite: Duration,
    pub decompose: Duration,
    /// Fusion plan, memory plan and value lifetimes.
    pub plan: Duration,
    /// The first compiled run: Cranelift compiles every kernel not yet cached.
    pub first_run: Duration,
    /// Kernels compiled (cache misses) during the first run.
    pub kernels_compiled: usize,
    /// The passes were skipped: the planned graph came from the disk cache.
    pub from_disk_cache: bool,
}

/// A compiled specialisation: its guards and executable (or the graph break
/// that made it eager).
pub(crate) struct Entry {
    pub guards: Guards,
    pub traced: Option<Graph>,
    pub rewritten: Option<Graph>,
    /// Per output: eager returned it contiguous (a compiled view is then copied, as eager's was).
    pub contiguous_outputs: Vec<bool>,
    /// How often each rewrite rule fired.
    pub rewrites: Vec<(String, usize)>,
    /// Per planned node: the traced node it computes, if any (for shadow mode).
    pub origin: Vec<Option<NodeId>>,
    pub exec: Option<Executable>,
    pub bindings: Vec<Binding>,
    pub hoist: HoistCache,
    pub graph_break: Option<GraphBreak>,
    pub times: StageTimes,
    /// Compiled training: the joint graph's forward and backward halves
    /// (`exec` is then the forward's executable, for reports).
    pub train: Option<TrainPlan>,
    /// Positions of the inputs the call updates in place (num_batches_tracked):
    /// their new values are the graph's last outputs, written back after a run.
    pub mutated: Vec<usize>,
    /// `compile_fn`'s record of the traced ops, replayed on every call to
    /// catch a changed captured value (see `trace::probe`).
    pub captures: Option<super::trace::probe::Script>,
    /// The traced run's values, weakly (see `trace::escapes`).
    pub recorded: Vec<super::trace::escapes::Recorded>,
}

/// The rewritten graph, the lowered (decomposed) one, each lowered node's
/// traced origin, the rules that fired, and each lowered node's owner: the
/// traced node it was made for (the inner nodes of a decomposition
/// included, unlike the origin shadow mode matches values by, which only
/// the decomposition's root has).
type Lowered = (
    Graph,
    Graph,
    Vec<Option<NodeId>>,
    Vec<(String, usize)>,
    Vec<Option<NodeId>>,
);

/// The e-graph rewrites, then composites lowered to primitives.
fn rewrite_and_lower(
    name: &str,
    tr: &Trace,
    options: &CompileOptions,
    times: &mut StageTimes,
) -> Result<Lowered> {
    let t = Instant::now();
    let cfg = RewriteConfig {
        params: tr
            .graph
            .inputs()
            .iter()
            .zip(&tr.bindings)
            .filter(|(_, b)| matches!(b, Binding::Captured(_)))
            .map(|(id, _)| *id)
            .collect(),
        extra_rules: options.extra_rules.clone(),
        ..RewriteConfig::default()
    };
    let rw = rewrite(&tr.graph, &cfg)?;
    times.rewrite = t.elapsed();
    log(
        "rewrites",
        name,
        &format!("{}{}", rw.report, rw.graph.to_text()),
    );
    let rewrites = rw.report.fired.clone().into_iter().collect();
    let (rewritten, rewrite_origin) = (rw.graph, rw.origin);
    let t = Instant::now();
    let (lowered, map) = decompose_with_map(&rewritten)?;
    times.decompose = t.elapsed();
    if cfg!(debug_assertions) {
        // the verifier runs after every pass in debug builds
        rewritten.verify()?;
        lowered.verify()?;
    }
    let mut origin = vec![None; lowered.len()];
    for (old, new) in map.iter().enumerate() {
        let o = &mut origin[new.index()];
        if o.is_none() {
            *o = rewrite_origin[old];
        }
    }
    // decomposition appends: the nodes after the previous root up to this
    // one's root are this node's
    let mut owner = vec![None; lowered.len()];
    let mut next = 0;
    for (old, new) in map.iter().enumerate() {
        for o in owner.iter_mut().take(new.index() + 1).skip(next) {
            *o = rewrite_origin[old];
        }
        next = next.max(new.index() + 1);
    }
    Ok((rewritten, lowered, origin, rewrites, owner))
}

/// Appends the new values of the inputs `tr` updated in place to its
/// outputs; returns those inputs' positions.
fn mutation_outputs(tr: &mut Trace) -> Result<Vec<usize>> {
    let mut pos = vec![];
    for (input, value) in tr.mutations.clone() {
        tr.graph.output(value)?;
        pos.push(
            tr.graph
                .inputs()
                .iter()
                .position(|i| *i == input)
                .expect("an input"),
        );
    }
    Ok(pos)
}

/// Writes each update into the input at its position (after a compiled run).
pub(crate) fn write_back<T: std::borrow::Borrow<Tensor>>(
    positions: &[usize],
    inputs: &[T],
    updates: &[Tensor],
) -> Result<()> {
    let _ng = crate::autograd::no_grad();
    for (&k, value) in positions.iter().zip(updates) {
        inputs[k].borrow().copy_(value)?;
    }
    Ok(())
}

fn log(stage: &str, name: &str, text: &str) {
    if kiln_runtime::log_enabled(stage) {
        eprintln!("[kiln {stage}] {name}\n{text}");
    }
}

impl Entry {
    /// An entry with nothing compiled yet.
    fn new(guards: Guards, times: StageTimes) -> Entry {
        Entry {
            guards,
            traced: None,
            rewritten: None,
            contiguous_outputs: vec![],
            rewrites: vec![],
            origin: vec![],
            exec: None,
            bindings: vec![],
            hoist: HoistCache::default(),
            graph_break: None,
            times,
            train: None,
            mutated: vec![],
            captures: None,
            recorded: vec![],
        }
    }

    /// Traces `f` on `args` and compiles it; returns the entry and the call's results.
    pub fn build(
        name: &str,
        args: &[Tensor],
        names: &[(String, Tensor)],
        f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
        guards: Guards,
        options: &super::CompileOptions,
    ) -> Result<(Entry, Vec<Tensor>)> {
        if guards.needs_grad {
            return Entry::build_joint(name, args, names, f, guards, options);
        }
        let mut times = StageTimes::default();
        let t = Instant::now();
        let traced = {
            let _ng = crate::autograd::no_grad();
            // the traced convs have the compiled graph's geometry (folding a
            // BatchNorm changes weights, not shapes), so they time the
            // candidates and run the winners, and the first compiled run
            // finds the choices remembered: ResNet-18's compile() to first
            // output, empty cache, 1.0-1.2 s -> 0.85-0.9 s
            let _scope = kiln_runtime::externs::conv::select::compiled_scope();
            trace::trace(name, args, names, |xs| f(xs))?
        };
        times.trace = t.elapsed();
        let (mut tr, eager_outs) = match traced {
            Ok(x) => x,
            Err(b) => {
                log("graph_breaks", name, &b.to_string());
                let outs = f(args)?;
                let entry = Entry {
                    graph_break: Some(b),
                    ..Entry::new(guards, times)
                };
                return Ok((entry, outs));
            }
        };
        tr.undo_side_effects()?;
        // a closure over tensors that require grad (compile_fn's parameters),
        // called in grad mode: differentiate through them (torch.compile does)
        let grad_captures = tr
            .bindings
            .iter()
            .any(|b| matches!(b, Binding::Captured(t) if t.requires_grad()));
        if grad_captures && crate::autograd::is_grad_enabled() {
            let guards = Guards {
                needs_grad: true,
                ..guards
            };
            return Entry::build_joint(name, args, names, f, guards, options);
        }
        let mutated = mutation_outputs(&mut tr)?;
        if cfg!(debug_assertions) {
            tr.graph.verify()?;
        }
        log("graph", name, &tr.graph.to_text());

        // shadow mode needs to know where planned nodes came from, which a
        // cached plan does not record
        let use_disk =
            options.disk_cache && options.shadow_tol.is_none() && options.extra_rules.is_empty();
        let cached = use_disk.then(|| disk_cache::load(&tr.graph)).flatten();
        let (rewritten, lowered, origin, rewrites) = match cached {
            Some(planned) => {
                times.from_disk_cache = true;
                (None, planned, vec![], vec![])
            }
            None => {
                let (rw, lowered, origin, rewrites, _) =
                    rewrite_and_lower(name, &tr, options, &mut times)?;
                if use_disk {
                    disk_cache::store(&tr.graph, &lowered);
                }
                (Some(rw), lowered, origin, rewrites)
            }
        };

        let t = Instant::now();
        let captured: Vec<bool> = tr
            .bindings
            .iter()
            .map(|b| matches!(b, Binding::Captured(_)))
            .collect();
        let exec = Executable::new(lowered, &captured);
        times.plan = t.elapsed();
        log(
            "fusion",
            name,
            &format!(
                "{}{}",
                exec.graph.to_text(),
                kiln_passes::fusion::dump(&exec.graph, &exec.plan)
            ),
        );

        let mut entry = Entry {
            guards,
            traced: Some(tr.graph),
            rewritten,
            contiguous_outputs: eager_outs.iter().map(|t| t.is_contiguous()).collect(),
            rewrites,
            origin,
            exec: Some(exec),
            bindings: tr.bindings,
            hoist: HoistCache::default(),
            graph_break: None,
            times,
            train: None,
            mutated,
            captures: None,
            recorded: tr.recorded,
        };
        let outs = entry.first_run(args)?;
        entry.shadow(name, args, &outs, &eager_outs, options)?;
        Ok((entry, outs))
    }

    /// [`Entry::build`] for a call autograd records: a joint graph, split
    /// into compiled forward and backward halves (see `joint.rs`).
    fn build_joint(
        name: &str,
        args: &[Tensor],
        names: &[(String, Tensor)],
        f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
        guards: Guards,
        options: &CompileOptions,
    ) -> Result<(Entry, Vec<Tensor>)> {
        let mut times = StageTimes::default();
        let t = Instant::now();
        let traced = {
            // convs time their candidates while traced (see `build`)
            let _scope = kiln_runtime::externs::conv::select::compiled_scope();
            joint::trace_joint(name, args, names, f)?
        };
        times.trace = t.elapsed();
        let mut entry = Entry::new(guards, times);
        let (mut jt, eager_outs) = match traced {
            Ok(x) => x,
            Err(b) => {
                log("graph_breaks", name, &b.to_string());
                entry.graph_break = Some(b);
                return Ok((entry, f(args)?));
            }
        };
        jt.trace.undo_side_effects()?;
        if cfg!(debug_assertions) {
            jt.trace.graph.verify()?;
        }
        log("graph", name, &jt.trace.graph.to_text());
        let (rewritten, lowered, origin, rewrites, owner) =
            rewrite_and_lower(name, &jt.trace, options, &mut entry.times)?;
        let t = Instant::now();
        // passes keep the inputs and their order: bindings index them
        if lowered.inputs().len() != jt.trace.bindings.len() {
            kiln_ir::bail!("compile", "the passes changed the joint graph's inputs");
        }
        let tangents: Vec<NodeId> = lowered
            .inputs()
            .iter()
            .zip(&jt.trace.bindings)
            .filter(|(_, b)| matches!(b, Binding::Tangent(_)))
            .map(|(id, _)| *id)
            .collect();
        let policy = save_policy(&lowered, &origin, &owner, &jt.trace.regions);
        let part = partition_with(&lowered, &tangents, jt.n_forward_outputs(), &policy)?;
        if cfg!(debug_assertions) {
            part.forward.verify()?;
            part.backward.verify()?;
        }
        log(
            "partition",
            name,
            &format!("{}{}", part.forward.to_text(), part.backward.to_text()),
        );
        let (plan, forward) = TrainPlan::new(&jt, part);
        entry.times.plan = t.elapsed();
        entry.contiguous_outputs = eager_outs.iter().map(|t| t.is_contiguous()).collect();
        entry.rewrites = rewrites;
        entry.rewritten = Some(rewritten);
        entry.exec = Some(forward);
        entry.traced = Some(jt.trace.graph);
        entry.recorded = jt.trace.recorded;
        entry.bindings = jt.trace.bindings;
        entry.train = Some(plan);
        let outs = entry.first_run(args)?;
        Ok((entry, outs))
    }

    /// Why this entry may not be cached: a value of the traced run is still
    /// held by state the function wrote (see `trace::escapes`). Call once
    /// the traced run's own tensors are gone.
    pub fn stale_state(&self, name: &str) -> Option<String> {
        let g = self.traced.as_ref()?;
        let known = |s: &std::sync::Arc<kiln_runtime::Storage>| {
            self.captures.as_ref().map(|c| c.holds(s)).unwrap_or(0)
        };
        trace::escapes::stale_state(name, g, &self.bindings, &self.recorded, known)
    }

    /// The first compiled run, timed, counting the kernels it compiles.
    fn first_run(&mut self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let before = kiln_runtime::cache_stats().compiles;
        let t = Instant::now();
        let outs = self.run_compiled(args)?;
        self.times.first_run = t.elapsed();
        self.times.kernels_compiled = kiln_runtime::cache_stats().compiles - before;
        Ok(outs)
    }

    /// One tensor per graph input (None for a tangent: the backward's) and
    /// the captured tensors' version counters; random inputs are drawn now.
    fn bound_inputs(&self, args: &[Tensor]) -> Result<(Vec<Option<Tensor>>, Vec<u64>)> {
        let mut versions = vec![];
        let ins = self
            .bindings
            .iter()
            .map(|b| {
                Ok(match b {
                    Binding::Arg(i) => Some(args[*i].clone()),
                    Binding::Captured(t) => {
                        versions.push(t.version.get());
                        Some(t.clone())
                    }
                    Binding::Tangent(_) => None,
                    Binding::Random(spec) => Some(spec.draw()?),
                })
            })
            .collect::<Result<_>>()?;
        Ok((ins, versions))
    }

    /// [`Entry::bound_inputs`] of an inference entry (no tangents).
    fn inputs(&self, args: &[Tensor]) -> Result<(Vec<Tensor>, Vec<u64>)> {
        let (ins, versions) = self.bound_inputs(args)?;
        let ins = ins
            .into_iter()
            .map(|t| t.expect("only joint graphs have tangents"))
            .collect();
        Ok((ins, versions))
    }

    fn run_compiled(&mut self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        if let Some(plan) = &self.train {
            let (ins, versions) = self.bound_inputs(args)?;
            let forward = self.exec.as_ref().expect("compiled entry");
            return plan.run(
                forward,
                &ins,
                &versions,
                &mut self.hoist,
                &self.contiguous_outputs,
            );
        }
        let exec = self.exec.as_ref().expect("compiled entry");
        let (ins, versions) = self.inputs(args)?;
        let mut outs = exec.run(&ins, &versions, &mut self.hoist)?;
        let updates = outs.split_off(outs.len() - self.mutated.len());
        write_back(&self.mutated, &ins, &updates)?;
        for (o, want) in outs.iter_mut().zip(&self.contiguous_outputs) {
            if *want && !o.is_contiguous() {
                *o = o.contiguous()?;
            }
        }
        Ok(outs)
    }

    /// Runs the entry: compiled, or eagerly after a graph break.
    pub fn run(
        &mut self,
        name: &str,
        args: &[Tensor],
        f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
        options: &super::CompileOptions,
    ) -> Result<Vec<Tensor>> {
        if self.exec.is_none() {
            return f(args);
        }
        let outs = self.run_compiled(args)?;
        if options.shadow_tol.is_some() {
            let eager = {
                let _ng = crate::autograd::no_grad();
                f(args)?
            };
            self.shadow(name, args, &outs, &eager, options)?;
        }
        Ok(outs)
    }

    fn shadow(
        &self,
        name: &str,
        args: &[Tensor],
        compiled: &[Tensor],
        eager: &[Tensor],
        options: &super::CompileOptions,
    ) -> Result<()> {
        let (Some(tol), Some(traced), Some(exec)) = (options.shadow_tol, &self.traced, &self.exec)
        else {
            return Ok(());
        };
        // eager's run drew its own random numbers: nothing to compare
        if self
            .bindings
            .iter()
            .any(|b| matches!(b, Binding::Random(_)))
        {
            return Ok(());
        }
        let (ins, _) = self.inputs(args)?;
        super::shadow::check(name, traced, exec, &self.origin, &ins, compiled, eager, tol)
    }
}
