//! The compiled executor's warm path: a list of launches recorded once per
//! entry and replayed on every later call.
//!
//! The first call of an entry whose hoisted values are cached runs the
//! executable node by node (building KernelIR and looking machine code up,
//! as eager does) while [`Recorder`] captures every launch
//! ([`kiln_runtime::launch::capture_launches`]) and which value each operand
//! was. The result, a [`Program`], is a list of steps over *slots* — graph
//! inputs, hoisted values, constants, buffers placed by the memory plan
//! ([`kiln_passes::memory_plan::assign_buffers`] over the slots' lifetimes),
//! and values computed by nodes that cannot be replayed as raw launches
//! (externs: matmul, conv, pools, which run through their own code every
//! call). A warm call allocates each planned buffer when its first value is
//! written, releases it after the last reader of its last value, and calls
//! each captured kernel's machine code directly: no KernelIR is built and
//! no kernel is hashed.

use super::exec::{Executable, HoistCache, Val};
use super::tile_replay::{TileCode, TileKernel};
use crate::ops::fuse::Lazy;
use crate::Tensor;
use kiln_codegen::Kernel;
use kiln_ir::graph::{NodeId, NodeOp};
use kiln_ir::op::Layout;
use kiln_ir::{DType, Result};
use kiln_passes::memory_plan::{assign_buffers, Interval};
use kiln_runtime::launch::{Captured, CapturedLaunch, Executable as Code};
use kiln_runtime::Storage;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

mod finish;
mod node_step;
mod replay;

/// Where a slot's storage comes from on a warm call.
enum SlotKind {
    /// Graph input `k` (its layout is checked against the recorded one).
    Input(usize),
    /// The hoisted value of this node, from the [`HoistCache`].
    Hoisted(usize),
    /// A constant, kept by the program.
    Const(Tensor),
    /// Written by a replayed launch: lives in a planned buffer.
    Planned,
    /// Computed by a node step (an extern's own output).
    Owned,
}

struct Slot {
    kind: SlotKind,
    dtype: DType,
    len: usize,
}

/// One replayed launch: machine code and where each operand lives.
struct LaunchStep {
    code: Arc<Code>,
    kernel: Arc<Kernel>,
    dims: Vec<usize>,
    strides: Vec<isize>,
    scalars: Vec<u64>,
    /// Per operand (outputs first): slot and element offset.
    operands: Vec<(usize, usize)>,
    splittable: bool,
}

enum Step {
    Launch(LaunchStep),
    /// A node run through the executable's own evaluation (an extern, or a
    /// conv with its tiled epilogue); `reads` are the nodes whose values it
    /// reads, `outs` the slots of its results (one per tuple part). With
    /// `extern_only`, only the extern of an extern + epilogue (replayed
    /// launches apply the epilogue after it).
    Node {
        id: NodeId,
        reads: Vec<NodeId>,
        outs: Vec<usize>,
        extern_only: bool,
    },
    /// A CPU conv whose epilogue runs per output tile through a kernel
    /// compiled once (see `tile_replay.rs`).
    Tile(TileStep),
}

struct TileStep {
    /// The conv's input, weight and bias nodes.
    conv: Vec<NodeId>,
    params: kiln_ir::op::conv::ConvParams,
    spatial: usize,
    code: TileCode,
    /// Per operand: the slot it reads (None: the conv's output).
    slots: Vec<Option<usize>>,
    out: usize,
}

/// A node's value on a warm call: views of slots.
#[derive(Clone)]
enum Value {
    One(usize, Layout),
    Many(Vec<(usize, Layout)>),
}

/// What to do after a step.
enum Release {
    Slot(usize),
    Buffer(usize),
}

/// The recorded launch list of one entry (see the module docs).
pub(crate) struct Program {
    slots: Vec<Slot>,
    steps: Vec<Step>,
    /// Per node: its value (nodes read by node steps, and the outputs).
    values: Vec<Option<Value>>,
    input_layouts: Vec<Layout>,
    /// Hoisted slots' recorded layouts (checked against the cache).
    hoisted_layouts: Vec<(usize, Layout)>,
    /// Per planned slot: its buffer.
    buffer_of: Vec<Option<usize>>,
    /// Per buffer: dtype and length in elements.
    buffers: Vec<(DType, usize)>,
    /// Per step: buffers first written there.
    alloc_before: Vec<Vec<usize>>,
    release_after: Vec<Vec<Release>>,
    /// Bytes of all planned buffers.
    pub planned_bytes: usize,
}

/// How a node's value came to be in the recorded run.
pub(crate) enum Source {
    Input(usize),
    /// A hoisted value read from the cache.
    Cache,
    Computed,
}

/// Builds a [`Program`] while the executable runs once (see the module docs).
pub(crate) struct Recorder {
    slots: Vec<Slot>,
    /// Slots whose storage is pinned by a weak reference (its address is not
    /// reused while the recording runs), by storage address.
    slot_of: HashMap<*const Storage, (usize, Weak<Storage>)>,
    steps: Vec<Step>,
    /// Per step: the slots it reads or writes.
    uses: Vec<Vec<usize>>,
    values: Vec<Option<Value>>,
    input_layouts: Vec<Layout>,
    hoisted_layouts: Vec<(usize, Layout)>,
    /// Why no program can be built (the entry then always runs node by node).
    pub failed: Option<String>,
}

fn tensor_of(l: &Lazy) -> Option<&Tensor> {
    l.as_leaf()
}

/// Whether a launch's output view covers all of its fresh storage (so the
/// replay may hand it an uninitialised buffer).
fn covers(c: &CapturedLaunch, k: usize, parts: usize) -> bool {
    if c.offsets[k] != 0 {
        return false;
    }
    let rank = c.dims.len();
    let st = &c.strides[k * rank..(k + 1) * rank];
    let mut dims: Vec<(isize, usize)> = st
        .iter()
        .zip(&c.dims)
        .filter(|(s, d)| **s != 0 && **d > 1)
        .map(|(s, d)| (*s, *d))
        .collect();
    dims.sort();
    let mut want = parts as isize;
    for (s, d) in dims {
        if s != want {
            return false;
        }
        want *= d as isize;
    }
    want as usize == c.lens[k]
}

impl Recorder {
    pub fn new(exec: &Executable, inputs: &[Tensor]) -> Recorder {
        let mut r = Recorder {
            slots: vec![],
            slot_of: HashMap::new(),
            steps: vec![],
            uses: vec![],
            values: vec![None; exec.graph.len()],
            input_layouts: inputs.iter().map(|t| t.layout().clone()).collect(),
            hoisted_layouts: vec![],
            failed: None,
        };
        for (k, t) in inputs.iter().enumerate() {
            if t.device().is_cuda() {
                r.fail("inputs on a CUDA device");
            }
            let p = Arc::as_ptr(&t.storage);
            if r.slot_of.contains_key(&p) {
                r.fail("two inputs share a storage");
                continue;
            }
            r.new_slot(SlotKind::Input(k), &t.storage);
        }
        r
    }

    fn fail(&mut self, why: &str) {
        self.failed.get_or_insert_with(|| why.to_string());
    }

    fn new_slot(&mut self, kind: SlotKind, s: &Arc<Storage>) -> usize {
        self.slots.push(Slot {
            kind,
            dtype: s.dtype(),
            len: s.len(),
        });
        let i = self.slots.len() - 1;
        self.slot_of.insert(Arc::as_ptr(s), (i, Arc::downgrade(s)));
        i
    }

    /// The live slot holding storage `p`, if any.
    fn live_slot(&self, p: *const Storage) -> Option<usize> {
        let (i, w) = self.slot_of.get(&p)?;
        (w.strong_count() > 0 && w.as_ptr() == p).then_some(*i)
    }

    /// Notes node `id`'s value `v` (None: not computed here) and the
    /// launches its evaluation made.
    pub fn node(
        &mut self,
        exec: &Executable,
        id: NodeId,
        v: Option<&Val>,
        events: Vec<Captured>,
        source: Source,
    ) {
        if self.failed.is_some() {
            return;
        }
        let Some(v) = v else { return };
        let i = id.index();
        match source {
            Source::Input(k) => {
                let slot = self.live_slot(Arc::as_ptr(&v_tensor(v).expect("input").storage));
                self.values[i] = slot.map(|s| Value::One(s, self.input_layouts[k].clone()));
                return;
            }
            Source::Cache => {
                let Some(t) = v_tensor(v) else {
                    return self.fail("a hoisted value is not a tensor");
                };
                let slot = match self.live_slot(Arc::as_ptr(&t.storage)) {
                    Some(s) => s,
                    None => {
                        let s = self.new_slot(SlotKind::Hoisted(i), &t.storage);
                        self.hoisted_layouts.push((s, t.layout().clone()));
                        s
                    }
                };
                self.values[i] = Some(Value::One(slot, t.layout().clone()));
                return;
            }
            Source::Computed => {}
        }
        if matches!(exec.graph.node(id).op, NodeOp::Const(_)) {
            if let Some(t) = v_tensor(v) {
                let s = self.new_slot(SlotKind::Const(t.clone()), &t.storage);
                self.values[i] = Some(Value::One(s, t.layout().clone()));
            }
            return;
        }
        // a reduction its reader runs as a row pass: nothing ran yet
        if let Val::Parts(_) = v {
            if !events.is_empty() {
                self.fail("a pending reduction launched kernels");
            }
            return;
        }
        // a pending pointwise value: its readers' launches load its leaves
        if let Val::One(l) = v {
            if tensor_of(l).is_none() {
                if !events.is_empty() {
                    self.fail("a pending value launched kernels");
                }
                return;
            }
        }
        let before = self.slots.len();
        if let Some((steps, fresh)) = self.launches(&events) {
            if let Some(value) = self.known_value(v, &fresh) {
                for (step, uses) in steps {
                    self.steps.push(Step::Launch(step));
                    self.uses.push(uses);
                }
                // pin the value's storages: later nodes find them by address
                self.pin(v, &fresh);
                self.values[i] = Some(value);
                return;
            }
            self.slots.truncate(before);
        }
        if self.failed.is_some() {
            return;
        }
        if let Some(Step::Node {
            id: last,
            extern_only: true,
            ..
        }) = self.steps.last()
        {
            if *last == id {
                return self.fail("an extern's epilogue cannot be replayed");
            }
        }
        self.node_step(exec, id, v);
    }

    /// The replayable steps of `events` with the slots each uses, and the
    /// fresh slots made for their new outputs (by [`Storage::id`]: a
    /// temporary freed inside the node frees its address for the next
    /// storage, which may be one the node made on the host, not by a
    /// launch); None when one is not replayable.
    #[allow(clippy::type_complexity)]
    fn launches(
        &mut self,
        events: &[Captured],
    ) -> Option<(Vec<(LaunchStep, Vec<usize>)>, HashMap<u64, usize>)> {
        let mut fresh: HashMap<u64, usize> = HashMap::new();
        let mut out = vec![];
        let before = self.slots.len();
        let reject = |r: &mut Recorder| {
            r.slots.truncate(before);
            None
        };
        for e in events {
            let Captured::Launch(c) = e else {
                return reject(self);
            };
            let nout = c.kernel.outputs();
            let parts = if c.kernel.reduce.is_some() {
                1 + c.kernel.extra_out.len()
            } else {
                1
            };
            let mut operands = vec![];
            for (k, &p) in c.storages.iter().enumerate() {
                let same = |s: &usize| {
                    self.slots[*s].len == c.lens[k] && self.slots[*s].dtype == c.dtypes[k]
                };
                let found = fresh.get(&c.ids[k]).copied();
                let found = found.or_else(|| self.live_slot(p).filter(same));
                let slot = match found {
                    Some(s) => {
                        let fixed = matches!(
                            self.slots[s].kind,
                            SlotKind::Input(_) | SlotKind::Hoisted(_) | SlotKind::Const(_)
                        );
                        if k < nout && fixed {
                            self.fail("a launch writes an input, constant or hoisted value");
                            return reject(self);
                        }
                        s
                    }
                    None if k < nout => {
                        let reads_itself = c
                            .kernel
                            .body
                            .iter()
                            .any(|(ins, _)| *ins == kiln_codegen::Instr::Load(k));
                        if reads_itself || !covers(c, k, if k == 0 { parts } else { 1 }) {
                            return reject(self);
                        }
                        self.slots.push(Slot {
                            kind: SlotKind::Planned,
                            dtype: c.dtypes[k],
                            len: c.lens[k],
                        });
                        let s = self.slots.len() - 1;
                        fresh.insert(c.ids[k], s);
                        s
                    }
                    None => return reject(self),
                };
                operands.push((slot, c.offsets[k]));
            }
            let uses = operands.iter().map(|o| o.0).collect();
            out.push((
                LaunchStep {
                    code: c.exec.clone(),
                    kernel: c.kernel.clone(),
                    dims: c.dims.clone(),
                    strides: c.strides.clone(),
                    scalars: c.scalars.clone(),
                    operands,
                    splittable: c.splittable,
                },
                uses,
            ));
        }
        Some((out, fresh))
    }

    /// `v` as views of known slots: live ones, or `fresh` ones of this node.
    fn known_value(&self, v: &Val, fresh: &HashMap<u64, usize>) -> Option<Value> {
        let find = |t: &Tensor| -> Option<(usize, Layout)> {
            let p = Arc::as_ptr(&t.storage);
            let s = fresh
                .get(&t.storage.id())
                .copied()
                .or_else(|| self.live_slot(p))?;
            Some((s, t.layout().clone()))
        };
        match v {
            Val::One(l) => {
                let (s, layout) = find(tensor_of(l)?)?;
                Some(Value::One(s, layout))
            }
            Val::Many(ts) => Some(Value::Many(ts.iter().map(find).collect::<Option<_>>()?)),
            Val::Parts(_) => None,
        }
    }

    /// Pins the storages of `v` that are `fresh` slots of this node, so
    /// later nodes find them by address.
    fn pin(&mut self, v: &Val, fresh: &HashMap<u64, usize>) {
        let ts: Vec<&Tensor> = match v {
            Val::One(l) => tensor_of(l).into_iter().collect(),
            Val::Many(ts) => ts.iter().collect(),
            Val::Parts(_) => vec![],
        };
        for t in ts {
            let p = Arc::as_ptr(&t.storage);
            if let Some(&s) = fresh.get(&t.storage.id()) {
                self.slot_of.insert(p, (s, Arc::downgrade(&t.storage)));
            }
        }
    }

    /// The multi-output kernel launched at `id` stored `roots`: each root's
    /// value is its part of what [`Recorder::node`] noted for `id`.
    pub fn hand_over(&mut self, id: NodeId, roots: &[NodeId]) {
        if self.failed.is_some() {
            return;
        }
        if !matches!(self.steps.last(), Some(Step::Launch(_))) {
            return self.fail("a multi-output kernel did not record as a launch");
        }
        match self.values[id.index()].take() {
            Some(Value::Many(parts)) if parts.len() == roots.len() => {
                for (r, (s, l)) in roots.iter().zip(parts) {
                    self.values[r.index()] = Some(Value::One(s, l));
                }
            }
            _ => self.fail("a multi-output kernel's values have no slots"),
        }
    }

    /// `id`'s extern alone becomes a node step (its epilogue's launches,
    /// captured next, are noted by [`Recorder::node`]).
    pub fn extern_step(&mut self, exec: &Executable, id: NodeId, ext: &Tensor) {
        if self.failed.is_none() {
            let reads = exec.extern_reads(id);
            self.push_node_step(exec, id, &Val::One(Lazy::tensor(ext)), reads, true);
        }
    }

    /// `id`, a CPU conv with a tiled epilogue, becomes a tile step (a node
    /// step when `tk` is None or reads a value with no slot).
    pub fn tile_step(
        &mut self,
        exec: &Executable,
        id: NodeId,
        tk: Option<TileKernel>,
        conv: (&kiln_ir::op::conv::ConvParams, usize),
        out: &Tensor,
    ) {
        if self.failed.is_some() {
            return;
        }
        let v = Val::One(Lazy::tensor(out));
        let Some(tk) = tk else {
            return self.node_step(exec, id, &v);
        };
        let mut slots = vec![];
        for t in &tk.tensors {
            match t {
                None => slots.push(None),
                Some(t) => match self.live_slot(Arc::as_ptr(&t.storage)) {
                    Some(s) => slots.push(Some(s)),
                    None => return self.node_step(exec, id, &v),
                },
            }
        }
        let reads = exec.extern_reads(id);
        let before = self.steps.len();
        self.push_node_step(exec, id, &v, reads.clone(), false);
        if self.failed.is_some() || self.steps.len() == before {
            return;
        }
        let Some(Step::Node { outs, .. }) = self.steps.pop() else {
            unreachable!("a node step was pushed")
        };
        self.uses
            .last_mut()
            .expect("uses of the step")
            .extend(slots.iter().flatten());
        self.steps.push(Step::Tile(TileStep {
            conv: reads,
            params: conv.0.clone(),
            spatial: conv.1,
            code: tk.code,
            slots,
            out: outs[0],
        }));
    }

    /// `id`, an extern that applies its epilogue itself (a quantized
    /// Linear, per output tile), becomes one node step.
    pub fn whole_step(&mut self, exec: &Executable, id: NodeId, out: &Tensor) {
        if self.failed.is_none() {
            self.node_step(exec, id, &Val::One(Lazy::tensor(out)));
        }
    }
}

fn v_tensor(v: &Val) -> Option<&Tensor> {
    match v {
        Val::One(l) => tensor_of(l),
        Val::Many(_) | Val::Parts(_) => None,
    }
}
