//! [`Program::run`]: a warm call replaying the recorded steps over the
//! slots and planned buffers (the recording is in `program.rs`).

use super::*;

impl Program {
    /// Runs the program, or returns None when `inputs` or the hoisted values
    /// are not laid out as recorded (the caller then runs node by node).
    pub fn run(
        &self,
        exec: &Executable,
        inputs: &[Tensor],
        cache: &HoistCache,
    ) -> Result<Option<Vec<Tensor>>> {
        if inputs.len() != self.input_layouts.len()
            || inputs
                .iter()
                .zip(&self.input_layouts)
                .any(|(t, l)| t.layout() != l || t.device().is_cuda())
        {
            return Ok(None);
        }
        let mut slot: Vec<Option<Tensor>> = vec![None; self.slots.len()];
        for (s, info) in self.slots.iter().enumerate() {
            slot[s] = match &info.kind {
                SlotKind::Input(k) => Some(inputs[*k].clone()),
                SlotKind::Const(t) => Some(t.clone()),
                SlotKind::Hoisted(node) => {
                    let Some(t) = cache.value(*node) else {
                        return Ok(None);
                    };
                    Some(t.clone())
                }
                SlotKind::Planned | SlotKind::Owned => None,
            };
        }
        for (s, l) in &self.hoisted_layouts {
            let t = slot[*s].as_ref().expect("hoisted slots are bound");
            if t.layout() != l || t.storage.len() != self.slots[*s].len {
                return Ok(None);
            }
        }
        let _ng = crate::autograd::no_grad();
        let mut buffers: Vec<Option<Tensor>> = vec![None; self.buffers.len()];
        let mut vals: Vec<Option<Val>> = vec![];
        let recording = kiln_runtime::launch::recording_kernels();
        for (i, step) in self.steps.iter().enumerate() {
            for &b in &self.alloc_before[i] {
                let (dt, len) = self.buffers[b];
                buffers[b] = Some(Tensor::empty_on(&[len], dt, kiln_runtime::Device::Cpu)?);
            }
            match step {
                Step::Launch(l) => {
                    let mut ptrs = Vec::with_capacity(l.operands.len());
                    for &(s, off) in &l.operands {
                        if slot[s].is_none() {
                            let b = self.buffer_of[s].expect("a planned slot");
                            slot[s] = buffers[b].clone();
                        }
                        let t = slot[s].as_ref().expect("a bound slot");
                        // SAFETY: offsets were taken from live views of this layout
                        ptrs.push(unsafe { t.storage.ptr().add(off * self.slots[s].dtype.size()) });
                    }
                    let _p = kiln_runtime::profiler::scope_with(
                        kiln_runtime::profiler::Category::Kernel,
                        || l.kernel.name.clone(),
                    );
                    if recording {
                        kiln_runtime::launch::note_launched(&l.kernel);
                    }
                    // SAFETY: every operand is bound to a buffer of the recorded size
                    unsafe {
                        kiln_runtime::launch::run_launch(
                            &l.code,
                            ptrs,
                            &l.strides,
                            &l.dims,
                            &l.scalars,
                            l.splittable,
                        )
                    };
                }
                Step::Tile(t) => {
                    let ins: Vec<Tensor> = t
                        .conv
                        .iter()
                        .map(|r| match self.value(*r, &mut slot, &buffers) {
                            Val::One(l) => Ok(tensor_of(&l).expect("a tensor").clone()),
                            Val::Many(_) | Val::Parts(_) => {
                                kiln_ir::bail!("compile", "a tuple conv operand")
                            }
                        })
                        .collect::<Result<_>>()?;
                    let bases: Vec<Option<Tensor>> = t
                        .slots
                        .iter()
                        .map(|s| s.map(|s| self.bound(s, &mut slot, &buffers).clone()))
                        .collect();
                    let out = super::super::tile_replay::run(
                        (&ins[0], &ins[1], ins.get(2)),
                        &t.params,
                        t.spatial,
                        &t.code,
                        &bases,
                    )?;
                    slot[t.out] = Some(out);
                }
                Step::Node {
                    id,
                    reads,
                    outs,
                    extern_only,
                } => {
                    if vals.is_empty() {
                        vals = (0..exec.graph.len()).map(|_| None).collect();
                    }
                    for r in reads {
                        vals[r.index()] = Some(self.value(*r, &mut slot, &buffers));
                    }
                    let v = match extern_only {
                        true => Val::One(Lazy::tensor(&exec.eval_extern_only(*id, &vals)?)),
                        false => exec.eval_any(*id, inputs, &vals)?,
                    };
                    for r in reads {
                        vals[r.index()] = None;
                    }
                    let ts: Vec<Tensor> = match &v {
                        Val::One(l) => tensor_of(l).into_iter().cloned().collect(),
                        Val::Many(ts) => ts.clone(),
                        Val::Parts(_) => {
                            kiln_ir::bail!("compile", "a replayed node left a reduction pending")
                        }
                    };
                    let mut k = 0;
                    for t in ts {
                        let p = &t.storage;
                        let known = outs[..k].iter().any(|s| {
                            slot[*s]
                                .as_ref()
                                .is_some_and(|u| Arc::ptr_eq(&u.storage, p))
                        });
                        if !known {
                            match outs.get(k) {
                                Some(s) => slot[*s] = Some(t),
                                None => {
                                    kiln_ir::bail!("compile", "a replayed node changed its results")
                                }
                            }
                            k += 1;
                        }
                    }
                }
            }
            for r in &self.release_after[i] {
                match r {
                    Release::Slot(s) => slot[*s] = None,
                    Release::Buffer(b) => buffers[*b] = None,
                }
            }
        }
        let mut outs = vec![];
        for o in exec.graph.outputs() {
            match self.value(*o, &mut slot, &buffers) {
                Val::One(l) => outs.push(tensor_of(&l).expect("a tensor").clone()),
                Val::Many(_) | Val::Parts(_) => kiln_ir::bail!("compile", "a tuple graph output"),
            }
        }
        Ok(Some(outs))
    }

    /// The tensor bound to slot `s` (a planned slot takes its buffer).
    fn bound<'a>(
        &self,
        s: usize,
        slot: &'a mut [Option<Tensor>],
        buffers: &[Option<Tensor>],
    ) -> &'a Tensor {
        if slot[s].is_none() {
            if let Some(b) = self.buffer_of[s] {
                slot[s] = buffers[b].clone();
            }
        }
        slot[s].as_ref().expect("a bound slot")
    }

    /// Node `id`'s value as tensors over the bound slots.
    fn value(&self, id: NodeId, slot: &mut [Option<Tensor>], buffers: &[Option<Tensor>]) -> Val {
        let mut view = |s: usize, l: &Layout| -> Tensor {
            if slot[s].is_none() {
                if let Some(b) = self.buffer_of[s] {
                    slot[s] = buffers[b].clone();
                }
            }
            slot[s]
                .as_ref()
                .expect("a bound slot")
                .with_layout(l.clone())
        };
        match self.values[id.index()].as_ref().expect("a recorded value") {
            Value::One(s, l) => Val::One(Lazy::tensor(&view(*s, l))),
            Value::Many(ps) => Val::Many(ps.iter().map(|(s, l)| view(*s, l)).collect()),
        }
    }

    /// Steps that replay launches, and steps that run a node's own code.
    pub fn step_counts(&self) -> (usize, usize) {
        let launches = self
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Launch(_) | Step::Tile(_)))
            .count();
        (launches, self.steps.len() - launches)
    }
}
