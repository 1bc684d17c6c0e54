//! [`Recorder::finish`]: the recorded steps become a [`Program`], with the
//! slots' lifetimes placed in buffers by the memory plan.

use super::*;

impl Recorder {
    /// The program, or why there is none.
    pub fn finish(mut self, exec: &Executable) -> std::result::Result<Program, String> {
        let outputs = exec.graph.outputs().to_vec();
        for o in &outputs {
            if self.values[o.index()].is_none() {
                self.fail("an output has no buffer");
            }
        }
        if let Some(f) = self.failed {
            return Err(f);
        }
        let n = self.slots.len();
        let (mut def, mut last) = (vec![usize::MAX; n], vec![0usize; n]);
        for (s, uses) in self.uses.iter().enumerate() {
            for &u in uses {
                def[u] = def[u].min(s);
                last[u] = last[u].max(s);
            }
        }
        for o in &outputs {
            match &self.values[o.index()] {
                Some(Value::One(s, _)) => last[*s] = usize::MAX,
                Some(Value::Many(ps)) => ps.iter().for_each(|p| last[p.0] = usize::MAX),
                None => {}
            }
        }
        // planned slots in order of their first write, one class per dtype
        let mut planned: Vec<usize> = (0..n)
            .filter(|&s| matches!(self.slots[s].kind, SlotKind::Planned) && def[s] != usize::MAX)
            .collect();
        planned.sort_by_key(|&s| (def[s], s));
        let class = |d: DType| DType::ALL.iter().position(|x| *x == d).unwrap_or(0);
        let intervals: Vec<Interval> = planned
            .iter()
            .map(|&s| Interval {
                bytes: self.slots[s].len * self.slots[s].dtype.size(),
                class: class(self.slots[s].dtype),
                def: def[s],
                last: last[s],
            })
            .collect();
        let placed = assign_buffers(&intervals);
        let mut buffer_of = vec![None; n];
        let nb = placed.buffers.len();
        let mut buffers = vec![(DType::F32, 0usize); nb];
        let (mut first, mut end) = (vec![usize::MAX; nb], vec![0usize; nb]);
        for (j, &s) in planned.iter().enumerate() {
            let b = placed.buffer_of[j];
            buffer_of[s] = Some(b);
            let dt = self.slots[s].dtype;
            buffers[b] = (dt, placed.buffers[b] / dt.size());
            first[b] = first[b].min(def[s]);
            end[b] = end[b].max(last[s]);
        }
        let steps = self.steps.len();
        let mut alloc_before = vec![vec![]; steps];
        let mut release_after: Vec<Vec<Release>> = (0..steps).map(|_| vec![]).collect();
        for b in 0..nb {
            alloc_before[first[b]].push(b);
            if end[b] != usize::MAX {
                release_after[end[b]].push(Release::Buffer(b));
            }
        }
        for s in 0..n {
            let owned = matches!(self.slots[s].kind, SlotKind::Planned | SlotKind::Owned);
            if owned && def[s] != usize::MAX && last[s] != usize::MAX {
                release_after[last[s]].push(Release::Slot(s));
            }
        }
        Ok(Program {
            planned_bytes: placed.buffers.iter().sum(),
            slots: self.slots,
            steps: self.steps,
            values: self.values,
            input_layouts: self.input_layouts,
            hoisted_layouts: self.hoisted_layouts,
            buffer_of,
            buffers,
            alloc_before,
            release_after,
        })
    }
}
