//! The compiled executable: a planned graph run node by node, where pointwise
//! values are pending expressions ([`Lazy`]) that become one Cranelift kernel
//! each time the fusion plan says a value is stored. A reduction compiles its
//! pending prologue into its loop; an extern (matmul, conv) runs on stored
//! operands and its epilogue writes over its output in place.
//!
//! Values computed only from parameters and constants (BatchNorm folded into a
//! conv's weight, a transposed weight) are hoisted: computed on the first call
//! and reused while no parameter's version counter has moved.

use super::dispatch::run_op;
use super::program::{Program, Recorder, Source};
use crate::ops::fuse::{Fuser, Lazy};
use crate::Tensor;
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::op::Op;
use kiln_ir::{
    bail, DType,
    ReduceKind::{LogSumExp, Welford},
    Result,
};
use kiln_passes::decompose::Builder;
use kiln_passes::fusion::{self, FusionPlan, KernelKind, NodeKind};
use kiln_passes::memory_plan::{self, MemoryPlan};
use std::collections::HashMap;
use std::sync::OnceLock;

/// A graph ready to run: its fusion plan, memory plan and value lifetimes.
pub struct Executable {
    pub graph: Graph,
    pub plan: FusionPlan,
    pub memory: MemoryPlan,
    /// Per node: computed only from captured tensors and constants.
    hoisted: Vec<bool>,
    /// Per node: hoisted and read by a node that is not (its value is cached).
    frontier: Vec<bool>,
    /// Per node: the position after which no node reads it.
    last_use: Vec<usize>,
    /// Per node: its index among the graph inputs.
    input_index: Vec<Option<usize>>,
    /// Per node: the root of a conv epilogue applied per output tile; the
    /// value is the kernel's index in the plan.
    tiled_root: Vec<Option<usize>>,
    /// Per node: computed inside a tiled conv epilogue, not on its own.
    deferred: Vec<bool>,
    /// Per node: the multi-output kernel (index in the plan) it is a stored
    /// root of; its value appears when the kernel runs, at the last root.
    multi: Vec<Option<usize>>,
    /// Per node: some `getitem` reads its result 1 (a `max_pool2d`'s indices).
    indices_read: Vec<bool>,
    /// Conv outputs with fewer elements per sample take their epilogue in one pass.
    pub(crate) min_tiled_sample: usize,
    /// Some node's value is cached between calls ([`HoistCache`]).
    has_frontier: bool,
    /// The launch list recorded on the first call that can replay (see
    /// `program.rs`), or why there is none.
    program: OnceLock<std::result::Result<Program, String>>,
}

/// One stored value of a kernel-by-kernel run and the kernels that computed it.
pub struct KernelRun {
    pub node: NodeId,
    pub value: Tensor,
    pub kernels: Vec<kiln_codegen::Kernel>,
}

/// Hoisted values and the parameter versions they were computed at.
#[derive(Default)]
pub struct HoistCache {
    versions: Vec<u64>,
    values: HashMap<usize, Tensor>,
}

impl HoistCache {
    /// The cached value of node `index`.
    pub(super) fn value(&self, index: usize) -> Option<&Tensor> {
        self.values.get(&index)
    }
}

use super::value::parts;
pub(super) use super::value::{pointwise, Val};

mod multi_out;
mod plan;

impl Executable {
    /// The recorded launch list's shape: (replayed launches, node steps,
    /// planned buffer bytes), or why calls run node by node. None before the
    /// first call that could record it.
    pub fn program_summary(&self) -> Option<std::result::Result<(usize, usize, usize), String>> {
        self.program.get().map(|p| match p {
            Ok(p) => {
                let (l, n) = p.step_counts();
                Ok((l, n, p.planned_bytes))
            }
            Err(e) => Err(e.clone()),
        })
    }

    /// The nodes whose values evaluating `id` reads: its operands, and for a
    /// conv or matrix product with an epilogue, everything the epilogue reads.
    pub(super) fn reads_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut reads: Vec<NodeId> = self.graph.node(id).operands.to_vec();
        if let Some(k) = self.tiled_root[id.index()] {
            let kernel = &self.plan.kernels[k];
            reads.extend(self.graph.node(kernel.root).operands.iter().copied());
            for f in &kernel.fused {
                reads.extend(self.graph.node(*f).operands.iter().copied());
            }
            reads.retain(|r| *r != kernel.root && !kernel.fused.contains(r));
        }
        reads.sort();
        reads.dedup();
        reads
    }

    /// The operands of the extern whose epilogue is rooted at `id`.
    pub(super) fn extern_reads(&self, id: NodeId) -> Vec<NodeId> {
        let k = self.tiled_root[id.index()].expect("an epilogue root");
        self.graph.node(self.plan.kernels[k].root).operands.to_vec()
    }

    /// The extern whose epilogue is rooted at `id`, without its epilogue.
    pub(super) fn eval_extern_only(&self, id: NodeId, vals: &[Option<Val>]) -> Result<Tensor> {
        let k = self.tiled_root[id.index()].expect("an epilogue root");
        let value = |o: NodeId| match &vals[o.index()] {
            Some(v) => v.lazy()?.materialize(),
            None => bail!("compile", "extern operand {o:?} was freed"),
        };
        super::epilogue::run_extern_only(&self.graph, &self.plan.kernels[k], &value)
    }

    /// [`Executable::eval_tiled`] while recording: a CPU extern whose
    /// epilogue runs in one pass is noted as the extern alone plus the
    /// epilogue's launches; a tiled conv as a tile step.
    fn record_tiled(
        &self,
        id: NodeId,
        k: usize,
        vals: &[Option<Val>],
        rec: &mut Recorder,
    ) -> Result<Tensor> {
        use super::epilogue::{self, CpuEpilogue};
        use kiln_runtime::launch::capture_launches;
        let kernel = &self.plan.kernels[k];
        let value = |o: NodeId| match &vals[o.index()] {
            Some(v) => v.lazy()?.materialize(),
            None => bail!("compile", "extern operand {o:?} was freed"),
        };
        let g = &self.graph;
        match epilogue::cpu_epilogue(g, kernel, &value, self.min_tiled_sample)? {
            Some(CpuEpilogue::OnePass) => {
                let ext = epilogue::run_extern_only(g, kernel, &value)?;
                rec.extern_step(self, id, &ext);
                let (r, events) =
                    capture_launches(|| epilogue::run_epilogue_over(g, kernel, id, &value, &ext));
                r?;
                let v = Val::One(Lazy::tensor(&ext));
                rec.node(self, id, Some(&v), events, Source::Computed);
                Ok(ext)
            }
            Some(CpuEpilogue::InKernel) => {
                // the extern applies its epilogue per tile itself: one node step
                let t = self.eval_tiled(id, k, vals)?;
                rec.whole_step(self, id, &t);
                Ok(t)
            }
            Some(CpuEpilogue::Tiled) => {
                let tk = super::tile_replay::prepare(g, kernel, id, &value)?;
                let t = self.eval_tiled(id, k, vals)?;
                let NodeOp::Op(Op::Conv { params, spatial }) = &g.node(kernel.root).op else {
                    bail!("compile", "a tiled epilogue on a node that is not a conv");
                };
                rec.tile_step(self, id, tk, (params, *spatial), &t);
                Ok(t)
            }
            None => {
                let (t, events) = capture_launches(|| self.eval_tiled(id, k, vals));
                let t = t?;
                let v = Val::One(Lazy::tensor(&t));
                rec.node(self, id, Some(&v), events, Source::Computed);
                Ok(t)
            }
        }
    }

    /// Evaluates node `id` (not deferred, not cached) over `vals`.
    pub(super) fn eval_any(
        &self,
        id: NodeId,
        inputs: &[Tensor],
        vals: &[Option<Val>],
    ) -> Result<Val> {
        match self.tiled_root[id.index()] {
            Some(k) => Ok(Val::One(Lazy::tensor(&self.eval_tiled(id, k, vals)?))),
            None => self.eval(id, inputs, vals),
        }
    }

    /// An extern with its epilogue, run at the epilogue's root `id`.
    fn eval_tiled(&self, id: NodeId, k: usize, vals: &[Option<Val>]) -> Result<Tensor> {
        let value = |o: NodeId| match &vals[o.index()] {
            Some(v) => v.lazy()?.materialize(),
            None => bail!("compile", "conv operand {o:?} was freed"),
        };
        let kernel = &self.plan.kernels[k];
        let min = self.min_tiled_sample;
        super::epilogue::run_extern_with_epilogue(&self.graph, kernel, id, &value, min)
    }

    /// Whether `id` is computed only from parameters and constants (hoisted:
    /// once per parameter version, not every call).
    pub fn is_hoisted(&self, id: NodeId) -> bool {
        self.hoisted[id.index()]
    }

    /// Runs the graph on its inputs (arguments and captured tensors, in graph
    /// input order). `versions` are the captured tensors' version counters.
    ///
    /// A call whose hoisted values are cached (or that has none) replays the
    /// recorded launch list; the first such call records it.
    pub fn run(
        &self,
        inputs: &[Tensor],
        versions: &[u64],
        cache: &mut HoistCache,
    ) -> Result<Vec<Tensor>> {
        let cached = !cache.values.is_empty() && cache.versions == versions;
        if programs_enabled() && (cached || !self.has_frontier) {
            match self.program.get() {
                Some(Ok(p)) => {
                    if let Some(outs) = p.run(self, inputs, cache)? {
                        return Ok(outs);
                    }
                }
                Some(Err(_)) => {}
                None => {
                    let mut rec = Recorder::new(self, inputs);
                    let outs = self.run_inner(inputs, versions, cache, None, Some(&mut rec))?;
                    let program = rec.finish(self);
                    if let (Err(why), true) = (&program, kiln_runtime::log_enabled("program")) {
                        eprintln!("[kiln program] no launch list: {why}");
                    }
                    let _ = self.program.set(program);
                    return Ok(outs);
                }
            }
        }
        self.run_inner(inputs, versions, cache, None, None)
    }

    /// Runs without hoisting and returns every kernel's stored value with the
    /// KernelIR it launched, in schedule order (shadow mode's kernel-by-kernel rerun).
    pub fn run_each_kernel(&self, inputs: &[Tensor]) -> Result<Vec<KernelRun>> {
        let mut runs = vec![];
        self.run_inner(
            inputs,
            &[],
            &mut HoistCache::default(),
            Some(&mut runs),
            None,
        )?;
        Ok(runs)
    }

    fn run_inner(
        &self,
        inputs: &[Tensor],
        versions: &[u64],
        cache: &mut HoistCache,
        mut debug: Option<&mut Vec<KernelRun>>,
        mut rec: Option<&mut Recorder>,
    ) -> Result<Vec<Tensor>> {
        let _ng = crate::autograd::no_grad();
        let valid = !cache.values.is_empty() && cache.versions == versions;
        if !valid {
            cache.values.clear();
            cache.versions = versions.to_vec();
        }
        let n = self.graph.len();
        let mut vals: Vec<Option<Val>> = (0..n).map(|_| None).collect();
        for (id, node) in self.graph.iter() {
            let i = id.index();
            let cached = !matches!(node.op, NodeOp::Const(_)) && self.input_index[i].is_none();
            // a hoisted epilogue root (a matmul of parameters and constants
            // with its bias: an RNN's hidden product from a zero initial
            // state) is cached like any hoisted value; its operands are not
            // computed on such a call
            let from_cache = valid && self.hoisted[i] && cached && !self.deferred[i];
            if let (Some(r), Some(k), false, false) = (
                rec.as_deref_mut(),
                self.tiled_root[i],
                self.deferred[i],
                from_cache,
            ) {
                let t = self.record_tiled(id, k, &vals, r)?;
                vals[i] = Some(Val::One(Lazy::tensor(&t)));
                for o in &node.operands {
                    if self.last_use[o.index()] == i {
                        vals[o.index()] = None;
                    }
                }
                continue;
            }
            let (v, events) = match rec.is_some() {
                true => kiln_runtime::launch::capture_launches(|| {
                    self.eval_node(id, inputs, &vals, valid, cache, debug.as_deref_mut())
                }),
                false => (
                    self.eval_node(id, inputs, &vals, valid, cache, debug.as_deref_mut()),
                    vec![],
                ),
            };
            let v = match v? {
                Some(Val::One(l)) if self.frontier[i] && !valid => {
                    let t = l.materialize()?;
                    // nothing writes a cached value: convs may keep its packed forms
                    kiln_runtime::externs::packed::mark_stable(&t.storage);
                    cache.values.insert(i, t.clone());
                    Some(Val::One(Lazy::tensor(&t)))
                }
                v => v,
            };
            if let Some(r) = rec.as_deref_mut() {
                let source = match (self.input_index[i], from_cache) {
                    (Some(k), _) => Source::Input(k),
                    (None, true) => Source::Cache,
                    (None, false) => Source::Computed,
                };
                r.node(self, id, v.as_ref(), events, source);
            }
            let v = match (self.launched_roots(id), v) {
                (Some(roots), Some(Val::Many(ts))) => {
                    if let Some(r) = rec.as_deref_mut() {
                        r.hand_over(id, &roots);
                    }
                    self.hand_over(&roots, ts, &mut vals)?
                }
                (_, v) => v,
            };
            vals[i] = v;
            for o in &node.operands {
                if self.last_use[o.index()] == i {
                    vals[o.index()] = None;
                }
            }
        }
        self.graph
            .outputs()
            .iter()
            .map(|o| match &vals[o.index()] {
                Some(Val::One(l)) => l.materialize(),
                _ => bail!("compile", "graph output {o:?} has no value"),
            })
            .collect()
    }

    /// Node `id`'s value in a node-by-node run: None when it is computed
    /// elsewhere (inside a tiled epilogue) or consumed only by cached values.
    fn eval_node(
        &self,
        id: NodeId,
        inputs: &[Tensor],
        vals: &[Option<Val>],
        valid: bool,
        cache: &HoistCache,
        debug: Option<&mut Vec<KernelRun>>,
    ) -> Result<Option<Val>> {
        let i = id.index();
        let node = self.graph.node(id);
        let cached = !matches!(node.op, NodeOp::Const(_)) && self.input_index[i].is_none();
        if self.deferred[i] {
            return Ok(None);
        }
        if valid && self.hoisted[i] && cached && self.tiled_root[i].is_some() {
            return Ok(cache.values.get(&i).map(|t| Val::One(Lazy::tensor(t))));
        }
        if let Some(k) = self.tiled_root[i] {
            let t = match debug {
                Some(runs) => {
                    // (tiles that ran on other threads are not recorded)
                    let (t, kernels) =
                        kiln_runtime::record_kernels(|| self.eval_tiled(id, k, vals));
                    let t = t?;
                    runs.push(KernelRun {
                        node: id,
                        value: t.clone(),
                        kernels,
                    });
                    t
                }
                None => self.eval_tiled(id, k, vals)?,
            };
            return Ok(Some(Val::One(Lazy::tensor(&t))));
        }
        if valid && self.hoisted[i] && cached {
            // None: consumed only inside the hoisted part
            return Ok(cache.values.get(&i).map(|t| Val::One(Lazy::tensor(t))));
        }
        let Some(runs) = debug else {
            return Ok(Some(self.eval(id, inputs, vals)?));
        };
        let (v, kernels) = kiln_runtime::record_kernels(|| self.eval(id, inputs, vals));
        let v = v?;
        let kernel = matches!(
            fusion::node_kind(&node.op),
            NodeKind::Pointwise | NodeKind::Reduction | NodeKind::Extern
        );
        if let (Some(roots), Val::Many(ts)) = (self.launched_roots(id), &v) {
            // one run per stored root; the kernel is listed with the first
            let mut kernels = Some(kernels);
            for (r, t) in roots.iter().zip(ts) {
                runs.push(KernelRun {
                    node: *r,
                    value: t.clone(),
                    kernels: kernels.take().unwrap_or_default(),
                });
            }
            return Ok(Some(v));
        }
        if let (Val::One(l), true) = (&v, self.plan.stored[i] && kernel) {
            runs.push(KernelRun {
                node: id,
                value: l.materialize()?,
                kernels,
            });
        }
        Ok(Some(v))
    }

    fn eval(&self, id: NodeId, inputs: &[Tensor], vals: &[Option<Val>]) -> Result<Val> {
        let node = self.graph.node(id);
        let i = id.index();
        let arg = |k: usize| -> Result<&Lazy> {
            match &vals[node.operands[k].index()] {
                Some(v) => v.lazy(),
                None => bail!("compile", "operand {k} of {} was freed", node.op_name()),
            }
        };
        let f = &mut Fuser;
        let lazy = match &node.op {
            NodeOp::Input { .. } => Lazy::tensor(&inputs[self.input_index[i].expect("input")]),
            NodeOp::Const(c) if c.is_splat() && c.meta.dims.is_empty() => {
                Lazy::constant(c.value(0), c.meta.dtype)
            }
            NodeOp::Const(c) => {
                let n = c.meta.dims.iter().product::<usize>();
                let vals: Vec<f64> = (0..n).map(|k| c.value(k)).collect();
                let t = Tensor::from_vec(vals, &c.meta.dims)?
                    .to_dtype(c.meta.dtype)?
                    .to_device(crate::device::device_of(inputs))?;
                Lazy::tensor(&t)
            }
            NodeOp::Project(k) => match &vals[node.operands[0].index()] {
                Some(Val::Many(ts)) => Lazy::tensor(&ts[*k]),
                Some(Val::Parts(ls)) => ls[*k].clone(),
                _ => bail!("compile", "getitem of a value that is not a tuple"),
            },
            NodeOp::Op(op) => match fusion::node_kind(&node.op) {
                NodeKind::Pointwise => {
                    let args = (0..node.operands.len())
                        .map(arg)
                        .collect::<Result<Vec<_>>>()?;
                    return self.store(id, pointwise(op, &args)?, vals);
                }
                NodeKind::Reduction => {
                    // a reduction loops over its input's tensors: give a
                    // constants-only input one
                    let owned;
                    let x = match arg(0)? {
                        x if x.is_constant() => {
                            owned = Lazy::tensor(&x.materialize()?);
                            &owned
                        }
                        x => x,
                    };
                    let all: Vec<i64> = (0..x.meta().dims.len() as i64).collect();
                    let pick = |d: &Vec<i64>| if d.is_empty() { all.clone() } else { d.clone() };
                    match op {
                        Op::Reduce {
                            kind,
                            dims,
                            keepdim,
                        } => f.reduce(*kind, x, &pick(dims), *keepdim)?,
                        Op::Mean { dims, keepdim } => f.mean(x, &pick(dims), *keepdim)?,
                        Op::LseParts { dims } => {
                            let defer = self.plan.row_pass_of[i].is_some();
                            let ps = f.one_pass(LogSumExp, x, &pick(dims), 0.0, defer)?;
                            return parts(ps);
                        }
                        Op::Moments { dims, eps } => {
                            let defer = self.plan.row_pass_of[i].is_some();
                            let ps = f.one_pass(Welford, x, &pick(dims), eps.0, defer)?;
                            return parts(ps);
                        }
                        _ => unreachable!("node_kind says reduction"),
                    }
                }
                _ => {
                    let ts = (0..node.operands.len())
                        .map(|k| arg(k)?.materialize())
                        .collect::<Result<Vec<_>>>()?;
                    if let (Op::MaxPool2d(p), false) = (op, self.indices_read[i]) {
                        return max_pool_values_only(&ts[0], p);
                    }
                    let mut outs = run_op(op, &ts)?;
                    if node.metas.len() != 1 {
                        return Ok(Val::Many(outs));
                    }
                    Lazy::tensor(&outs.pop().expect("one result"))
                }
            },
        };
        Ok(Val::One(lazy))
    }

    /// A pointwise value: stays pending, or runs as one kernel where the plan
    /// stores it — over the extern's output when it is that extern's epilogue.
    fn store(&self, id: NodeId, l: Lazy, vals: &[Option<Val>]) -> Result<Val> {
        let i = id.index();
        if !self.plan.stored[i] {
            return Ok(Val::One(l));
        }
        if let Some(k) = self.multi[i] {
            return self.store_many(&self.plan.kernels[k], id, l, vals);
        }
        if let Some(e) = self.plan.epilogue_of[i] {
            if let Some(Val::One(ext)) = &vals[e.index()] {
                let out = ext.materialize()?;
                l.materialize_into(&out)?;
                return Ok(Val::One(Lazy::tensor(&out)));
            }
        }
        Ok(Val::One(Lazy::tensor(&l.materialize()?)))
    }
}

/// A `max_pool2d` node whose indices no node reads (an eval graph): the
/// values-only kernel, and an unread one-element stand-in for the indices.
fn max_pool_values_only(x: &Tensor, p: &kiln_ir::op::pool::Pool2dParams) -> Result<Val> {
    let y = crate::functional::max_pool2d_values(x, p)?;
    let dims: Vec<i64> = y.dims().iter().map(|&d| d as i64).collect();
    let unread = Tensor::zeros(&[1], DType::I64).expand(&dims)?;
    Ok(Val::Many(vec![y, unread]))
}

/// Whether warm calls replay recorded launch lists: on unless `KILN_PROGRAM=0`
/// (the off switch runs every call node by node, as the first one does).
fn programs_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_PROGRAM").map_or(true, |v| v != "0"))
}
