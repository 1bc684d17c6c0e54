//! Tracing: how `compile()` turns a run of eager code into an `ir::Graph`.
//!
//! kiln traces by recording while computing (as `torch.jit.trace` does): the
//! first call runs the user's code eagerly and every public op records one
//! graph node through [`record`]. A tensor is known to the tracer by its
//! storage and layout; a tensor the tracer has not seen (a parameter, a buffer,
//! a tensor captured by a closure) becomes a graph input bound to that tensor,
//! so later calls read its current contents.
//!
//! Ops nest (softmax runs several kernels, `linear` calls `matmul`): only the
//! outermost op records; what runs inside it is its implementation. Anything
//! that would make the graph silently wrong is refused: reading a value
//! (`item()`), random numbers, in-place writes to traced values, or a kernel
//! launched on a traced value by code that recorded no op ([`check_launch`]).
//! Each refusal is a [`GraphBreak`] naming the op; `compile` reports it and
//! runs that function eagerly.
//!
//! ```ignore
//! // inside an eager op:
//! pub fn relu(&self) -> Result<Tensor> {
//!     trace::record(|| Op::Unary(UnaryOp::Relu), &[self], || self.unary(UnaryOp::Relu))
//! }
//! ```

use crate::Tensor;
use kiln_ir::graph::{Graph, NodeId};
use kiln_ir::op::{Layout, Op};
use kiln_ir::{Error, Result};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// Why tracing stopped: the op and what it needed that a graph cannot express.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphBreak {
    pub op: String,
    pub reason: String,
}

impl std::fmt::Display for GraphBreak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "graph break at `{}`: {}", self.op, self.reason)
    }
}

/// What a graph input is bound to.
#[derive(Clone)]
pub enum Binding {
    /// The `i`-th argument of the compiled function.
    Arg(usize),
    /// A tensor the traced code used but did not compute (parameter, buffer,
    /// captured tensor), read afresh on every call.
    Captured(Tensor),
    /// The gradient flowing into the `i`-th differentiable output (joint
    /// forward+backward graphs only; see [`tangent_input`]).
    Tangent(usize),
    /// Random numbers drawn afresh on every call, from the default generator
    /// in trace order (Dropout's mask; see [`random_input`]).
    Random(RandomSpec),
}

/// A finished trace: the graph and what each of its inputs is bound to.
pub struct Trace {
    pub graph: Graph,
    /// One per `graph.inputs()`, in order.
    pub bindings: Vec<Binding>,
    /// Tensors the traced run updated in place, with their values before it:
    /// [`Trace::undo_side_effects`] puts them back.
    restore: Vec<(Tensor, Tensor)>,
    /// In-place updates recorded as values (see [`record_mutation`]): the
    /// graph input written and the node holding its new value.
    pub mutations: Vec<(NodeId, NodeId)>,
    /// The default generator's state before the trace drew random numbers.
    rng: Option<crate::random::GeneratorState>,
    /// What checkpoint regions tagged (see [`checkpoint_region`]).
    pub regions: Regions,
    /// Every value recorded, weakly: what outlives the traced run is state
    /// the function wrote (see `escapes`).
    pub(crate) recorded: Vec<escapes::Recorded>,
    /// Module calls an exporter may write as one node (see [`export_scope`]).
    pub scopes: Vec<ExportScope>,
}

impl Trace {
    /// Undoes the in-place updates of the traced run (BatchNorm's running
    /// stats), so a compiled run of the same call applies them exactly once.
    pub fn undo_side_effects(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad();
        for (t, old) in self.restore.drain(..).rev() {
            t.copy_(&old)?;
        }
        // the compiled run draws the same numbers again
        if let Some(s) = self.rng.take() {
            crate::random::set_rng_state(&s);
        }
        Ok(())
    }
}

/// Operands an op writes in place.
fn mutated_operands(op: &Op) -> &'static [usize] {
    match op {
        Op::BatchNorm {
            training: true,
            has_running_stats: true,
            ..
        } => &[1, 2],
        _ => &[],
    }
}

type Key = (usize, Layout);

/// The storage's process-unique id, not its address: a value dropped
/// mid-trace may free its buffer for a later one (see [`Tracer::hold`]).
fn storage_of(t: &Tensor) -> usize {
    t.storage.id() as usize
}

fn key(t: &Tensor) -> Key {
    (storage_of(t), t.layout.clone())
}

struct Tracer {
    graph: Graph,
    values: HashMap<Key, NodeId>,
    bindings: Vec<Binding>,
    /// Names for captured tensors (a module's parameter and buffer names), by storage.
    names: HashMap<usize, String>,
    /// The tensors seen that have a backward closure, for
    /// [`release_traced_graph`] (see [`Tracer::hold`]).
    keep: Vec<Tensor>,
    /// Storages holding graph values (arguments and fresh op results): an
    /// unseen view of one was made by an op that recorded nothing.
    graph_storages: HashSet<usize>,
    /// How many recording ops are running (only the outermost records).
    depth: usize,
    broken: Option<GraphBreak>,
    restore: Vec<(Tensor, Tensor)>,
    /// Copies (`clone`, a copying `contiguous`) that share their source's node.
    copies: std::collections::HashSet<Key>,
    /// One flag per running [`record_multi`]: its op was inlined (see
    /// [`inline_decomposition`]), so its primitives recorded instead.
    inlined: Vec<bool>,
    mutations: Vec<(NodeId, NodeId)>,
    rng: Option<crate::random::GeneratorState>,
    regions: Regions,
    recorded: Vec<escapes::Recorded>,
    /// How many [`export_scope`]s are running (only the outermost notes).
    scope_open: usize,
    scopes: Vec<ExportScope>,
}

thread_local! {
    static TRACING: Cell<bool> = const { Cell::new(false) };
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
}

/// True while this thread is tracing (one load of a thread-local flag).
pub fn is_tracing() -> bool {
    TRACING.with(|t| t.get())
}

/// True while tracing outside any recording op: an op called now records a
/// node (ops with no exact graph op use this to compute through ones that do).
pub fn is_recording() -> bool {
    is_tracing() && with(|t| t.depth == 0).unwrap_or(false)
}

fn with<R>(f: impl FnOnce(&mut Tracer) -> R) -> Option<R> {
    TRACER.with(|t| t.borrow_mut().as_mut().map(f))
}

/// How many traces this process has run (each compiled entry's first
/// call traces once; a warm call traces nothing). Tests count on it.
pub fn traces_run() -> usize {
    TRACES.load(std::sync::atomic::Ordering::Relaxed)
}

static TRACES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Traces `f(args)`: `args` become graph inputs `x0, x1, ...` and the tensors
/// `f` returns the graph outputs. `names` gives captured tensors (by storage)
/// readable input names, e.g. a module's `conv1.weight`.
///
/// Returns the trace and `f`'s (eagerly computed) results, or the graph break
/// that stopped it.
pub fn trace(
    name: &str,
    args: &[Tensor],
    names: &[(String, Tensor)],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<std::result::Result<(Trace, Vec<Tensor>), GraphBreak>> {
    if is_tracing() {
        return Err(Error::op("compile", "cannot trace while already tracing"));
    }
    TRACES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tr = Tracer {
        graph: Graph::new(name),
        values: HashMap::new(),
        bindings: vec![],
        names: names
            .iter()
            .map(|(n, t)| (storage_of(t), n.clone()))
            .collect(),
        keep: vec![],
        graph_storages: HashSet::new(),
        depth: 0,
        broken: None,
        restore: vec![],
        copies: Default::default(),
        inlined: vec![],
        mutations: vec![],
        rng: None,
        regions: Regions::default(),
        recorded: vec![],
        scope_open: 0,
        scopes: vec![],
    };
    for (i, a) in args.iter().enumerate() {
        let id = tr.graph.input(format!("x{i}"), a.meta());
        tr.bindings.push(Binding::Arg(i));
        tr.values.insert(key(a), id);
        tr.graph_storages.insert(storage_of(a));
        tr.hold(a);
    }
    TRACER.with(|t| *t.borrow_mut() = Some(tr));
    TRACING.with(|t| t.set(true));
    let result = f(args);
    TRACING.with(|t| t.set(false));
    let mut tr = TRACER
        .with(|t| t.borrow_mut().take())
        .expect("tracer installed");
    // a failed trace leaves no side effects: the caller reruns eagerly
    let undo = |restore: Vec<(Tensor, Tensor)>, rng| {
        Trace {
            graph: Graph::new(""),
            bindings: vec![],
            restore,
            mutations: vec![],
            rng,
            regions: Regions::default(),
            recorded: vec![],
            scopes: vec![],
        }
        .undo_side_effects()
    };
    if let Some(b) = tr.broken.take() {
        undo(tr.restore, tr.rng)?;
        return Ok(Err(b));
    }
    let outs = match result {
        Ok(o) => o,
        Err(e) => {
            undo(tr.restore, tr.rng)?;
            return Err(e);
        }
    };
    let mut ids = vec![];
    for o in &outs {
        ids.push(tr.value_of(o));
    }
    if let Some(b) = tr.broken.take() {
        undo(tr.restore, tr.rng)?;
        return Ok(Err(b));
    }
    for id in ids {
        tr.graph.output(id)?;
    }
    Ok(Ok((
        Trace {
            graph: tr.graph,
            bindings: tr.bindings,
            restore: tr.restore,
            mutations: tr.mutations,
            rng: tr.rng,
            regions: tr.regions,
            recorded: tr.recorded,
            scopes: tr.scopes,
        },
        outs,
    )))
}

impl Tracer {
    fn is_traced(&self, t: &Tensor) -> bool {
        self.values.contains_key(&key(t))
    }

    /// Keeps `t` for [`release_traced_graph`] when it has a backward
    /// closure. Nothing else is kept: values are known by storage id, so an
    /// intermediate the traced code drops frees its buffer for the next op,
    /// as in an eager run (keeping every one had ResNet-18's trace touch
    /// ~250 MiB of fresh pages, twice an eager run's).
    fn hold(&mut self, t: &Tensor) {
        if t.grad_fn().is_some() {
            self.keep.push(t.clone());
        }
    }

    /// The node holding `t`'s value; an unseen tensor becomes a captured input.
    fn value_of(&mut self, t: &Tensor) -> NodeId {
        if let Some(&id) = self.values.get(&key(t)) {
            return id;
        }
        let storage = storage_of(t);
        if self.graph_storages.contains(&storage) {
            self.stop(
                "view",
                "a view of a traced value was made by an op that recorded no graph node \
                 (not supported by the tracer yet)"
                    .into(),
            );
        }
        let name = match self.names.get(&storage) {
            // a view of a named tensor keeps the name with a suffix
            Some(n) if self.values.keys().any(|(s, _)| *s == storage) => {
                format!("{n}.view{}", self.bindings.len())
            }
            Some(n) => n.clone(),
            None => format!("c{}", self.bindings.len()),
        };
        let id = self.graph.input(name, t.meta());
        self.bindings.push(Binding::Captured(t.clone()));
        self.values.insert(key(t), id);
        self.hold(t);
        id
    }

    fn stop(&mut self, op: &str, reason: String) {
        if self.broken.is_none() {
            self.broken = Some(GraphBreak {
                op: op.into(),
                reason,
            });
        }
    }
}

fn break_error(b: &GraphBreak) -> Error {
    Error::op("compile", b.to_string())
}

/// Runs `f`, an op's eager implementation; while tracing (outermost op only),
/// records `op(inputs)` as the node that produced its result.
pub fn record(
    op: impl FnOnce() -> Op,
    inputs: &[&Tensor],
    f: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    if !is_tracing() && !probe::replaying() {
        return f();
    }
    let mut out = record_multi(op, inputs, || f().map(|t| vec![t]))?;
    Ok(out.pop().expect("one output"))
}

/// [`record`] for ops with several results (`max_pool2d` with indices, `chunk`):
/// one node whose value is a tuple, then one `getitem` per result.
pub fn record_multi(
    op: impl FnOnce() -> Op,
    inputs: &[&Tensor],
    f: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    if !is_tracing() {
        if probe::replaying() {
            return probe::replay_op(Some(op()), inputs, f);
        }
        return f();
    }
    if with(|t| t.depth > 0).unwrap_or(true) {
        return f();
    }
    // an op inside an inlined decomposition is part of the outer op's step
    let outermost = with(|t| t.inlined.is_empty()).unwrap_or(false);
    with(|t| {
        t.depth += 1;
        t.inlined.push(false);
    });
    let op = op();
    let scripted = (outermost && probe::recording()).then(|| op.clone());
    // an op that updates operands in place (BatchNorm's running stats) runs
    // again in the compiled first call: keep their old values to put back
    let saved: Result<Vec<(Tensor, Tensor)>> = mutated_operands(&op)
        .iter()
        .filter_map(|&i| inputs.get(i))
        .map(|t| Ok(((*t).clone(), t.copy()?)))
        .collect();
    let outs = saved.and_then(|saved| {
        with(|t| t.restore.extend(saved));
        f()
    });
    let inlined = with(|t| {
        t.depth -= 1;
        t.inlined.pop().unwrap_or(false)
    })
    .unwrap_or(false);
    let outs = outs?;
    let r = with(|t| -> Result<()> {
        if t.broken.is_some() || inlined {
            return Ok(());
        }
        let mut operands: SmallVec<[NodeId; 4]> = inputs.iter().map(|x| t.value_of(x)).collect();
        // a copy that the op updates in place must not share its source's
        // node (the update would reach the source): make the copy explicit
        for &i in mutated_operands(&op) {
            if let Some(x) = inputs.get(i).filter(|x| t.copies.contains(&key(x))) {
                let c = t.graph.op(Op::Cat { dim: 0 }, &[operands[i]])?;
                t.values.insert(key(x), c);
                operands[i] = c;
            }
        }
        let name = op.name();
        let id = t.graph.op(op, &operands)?;
        let metas = t.graph.node(id).metas.clone();
        if metas.len() != outs.len() {
            return Err(Error::op(
                "compile",
                format!(
                    "tracer: `{name}` gave {} results but its graph node has {}",
                    outs.len(),
                    metas.len()
                ),
            ));
        }
        for (i, (o, m)) in outs.iter().zip(&metas).enumerate() {
            if o.meta() != *m {
                return Err(Error::op(
                    "compile",
                    format!(
                        "tracer: `{name}` result {i} is {} {:?} but inference says {} {:?}",
                        o.dtype(),
                        o.dims(),
                        m.dtype,
                        m.dims
                    ),
                ));
            }
            let v = if metas.len() == 1 {
                id
            } else {
                t.graph.project(id, i)?
            };
            t.values.insert(key(o), v);
            if !inputs.iter().any(|x| x.shares_storage(o)) {
                t.graph_storages.insert(storage_of(o));
                t.recorded.push(escapes::Recorded::of(o, v));
            }
            t.hold(o);
        }
        Ok(())
    });
    r.unwrap_or(Ok(()))?;
    if let Some(op) = scripted {
        probe::push(Some(op), inputs, &outs);
    }
    Ok(outs)
}

/// Records that `output` holds the same value as `input` (`contiguous`,
/// `clone`, `detach`): no node, the output maps to the input's node.
pub fn same_value(input: &Tensor, output: &Tensor) {
    if !is_tracing() {
        return;
    }
    with(|t| {
        if t.depth == 0 {
            let id = t.value_of(input);
            t.values.insert(key(output), id);
            if !input.shares_storage(output) {
                t.graph_storages.insert(storage_of(output));
                t.copies.insert(key(output));
                t.recorded.push(escapes::Recorded::of(output, id));
            }
            t.hold(output);
        }
    });
}

/// [`record`] for ops whose result holds the same value as `input` (`clone`,
/// a copying `contiguous`): runs `f`, the op's implementation, then
/// [`same_value`].
pub fn record_same(input: &Tensor, f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    if !is_tracing() {
        if probe::replaying() {
            let mut outs = probe::replay_op(None, &[input], || f().map(|t| vec![t]))?;
            return Ok(outs.pop().expect("one result"));
        }
        return f();
    }
    if with(|t| t.depth > 0).unwrap_or(true) {
        return f();
    }
    let outermost = with(|t| t.inlined.is_empty()).unwrap_or(false);
    with(|t| t.depth += 1);
    let out = f();
    with(|t| t.depth -= 1);
    let out = out?;
    same_value(input, &out);
    if outermost && probe::recording() {
        probe::push(None, &[input], std::slice::from_ref(&out));
    }
    Ok(out)
}

/// Frees the backward closures (and what they saved) of every value the
/// trace has recorded so far: a joint trace calls this once it has traced
/// the backward. Nothing backpropagates through the traced run's eager
/// graph afterwards (a compiled call returns the compiled run's results),
/// and a node the traced backward never reached would otherwise keep its
/// saved values alive for as long as anything holds its output.
pub(crate) fn release_traced_graph() {
    with(|t| {
        for x in &t.keep {
            if let Some(n) = x.grad_fn() {
                *n.f.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
    });
}

pub(crate) mod escapes;
mod joint_hooks;
pub(crate) mod probe;
mod refusals;
mod regions;
mod scopes;
pub use joint_hooks::{
    inline_decomposition, random_input, record_mutation, tangent_input, untraced, InlineGuard,
    RandomSpec,
};
pub use refusals::{check_launch, read_value, unsupported};
pub use regions::{checkpoint_boundary, checkpoint_region, Regions};
pub use scopes::{export_scope, recording_scopes, scopes_wanted, ExportScope};
