//! The captured-value guard of `compile_fn`: Rust cannot look inside a
//! closure, so a compiled entry remembers the op sequence its trace saw
//! (each op with its constants, each operand as an argument, an earlier
//! op's result or a captured tensor) and, on every call, runs the closure
//! again in *replay* mode: every recording op compares itself with the
//! recorded step and returns the recorded result instead of computing. No
//! kernel runs for a recorded op, so the check costs the closure's own Rust
//! code plus one `Op` comparison per op. Any difference — a scalar read
//! through a `Cell` or an atomic, a captured flag that changes which ops
//! run, a tensor made afresh from a captured value — is a mismatch, and the
//! caller recompiles.
//!
//! ```ignore
//! let script = probe::recording(args, || f(args));   // while tracing
//! if let Some(why) = probe::replay_matches(&mut script, args, f) { /* recompile */ }
//! ```

use super::{key, Key};
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::Result;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// What an op's operand was when traced.
#[derive(Clone)]
enum Operand {
    /// The `i`-th argument of the call.
    Arg(usize),
    /// Result `j` of recorded step `k`.
    Out(usize, usize),
    /// A tensor the closure holds or made itself.
    Captured(Tensor),
}

/// One outermost op of the traced run.
#[derive(Clone)]
struct Step {
    /// `None` for a copy that records no op of its own (`clone`).
    op: Option<Op>,
    operands: SmallVec<[Operand; 4]>,
    /// What a replay returns: stand-ins for the traced results (see
    /// [`Recorder::stand_in`]).
    outs: Vec<Tensor>,
}

/// The ops a compiled closure ran when traced, replayed on every call.
#[derive(Clone, Default)]
pub struct Script {
    steps: Vec<Step>,
    /// Each recorded result by its storage and layout.
    outs: HashMap<Key, (usize, usize)>,
    /// What the closure returned.
    results: Vec<Operand>,
    grad_enabled: bool,
}

impl Script {
    /// How many of the tensors the script keeps share `storage` (a traced
    /// run's values it holds for the replay).
    pub(crate) fn holds(&self, storage: &std::sync::Arc<kiln_runtime::Storage>) -> usize {
        let mine = |t: &Tensor| std::sync::Arc::ptr_eq(&t.storage, storage) as usize;
        self.steps
            .iter()
            .map(|s| {
                let ops: usize = s
                    .operands
                    .iter()
                    .map(|o| match o {
                        Operand::Captured(t) => mine(t),
                        _ => 0,
                    })
                    .sum();
                ops + s.outs.iter().map(mine).sum::<usize>()
            })
            .sum::<usize>()
            + self
                .results
                .iter()
                .map(|o| match o {
                    Operand::Captured(t) => mine(t),
                    _ => 0,
                })
                .sum::<usize>()
    }
}

enum Mode {
    Record,
    Replay {
        pos: usize,
        mismatch: Option<String>,
    },
}

struct State {
    mode: Mode,
    args: HashMap<Key, usize>,
    script: Script,
    /// The stand-ins made while recording (empty in a replay).
    recorder: Recorder,
}

/// Stand-ins for the traced run's results, by the id of the storage they
/// stand in for.
#[derive(Default)]
struct Recorder {
    stand_ins: HashMap<u64, std::sync::Arc<kiln_runtime::Storage>>,
}

impl Recorder {
    /// What the script keeps for `o`, a result of an op on `inputs`: a
    /// tensor of the same layout on a deferred storage (no memory unless
    /// something reads it), views of one result sharing one stand-in. A
    /// replay only hands results on to later recorded ops (which compute
    /// nothing) and compares them by identity; a read is a mismatch. The
    /// traced values themselves are freed as the traced run drops them
    /// (keeping them had `compile_fn` of ResNet-18 hold 306 MiB after its
    /// first call, 43 MiB as a module). A result sharing an operand's storage
    /// (a view of an argument or a parameter), one that requires grad, or
    /// one off the host's ordinary memory stays itself.
    fn stand_in(&mut self, o: &Tensor, inputs: &[&Tensor]) -> Tensor {
        let id = o.storage.id();
        if let Some(s) = self.stand_ins.get(&id) {
            return Tensor::from_parts(s.clone(), o.layout.clone());
        }
        let ordinary =
            o.storage.device() == kiln_runtime::memory::Device::Cpu && !o.storage.is_pinned();
        if !ordinary || o.requires_grad() || inputs.iter().any(|t| t.shares_storage(o)) {
            return o.clone();
        }
        match kiln_runtime::Storage::deferred(o.dtype(), o.storage.len()) {
            Ok(s) => {
                let s = std::sync::Arc::new(s);
                self.stand_ins.insert(id, s.clone());
                Tensor::from_parts(s, o.layout.clone())
            }
            Err(_) => o.clone(),
        }
    }
}

thread_local! {
    static REPLAYING: Cell<bool> = const { Cell::new(false) };
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// True while a replay runs on this thread (one thread-local load).
pub fn replaying() -> bool {
    REPLAYING.with(|r| r.get())
}

/// True while a trace records a script on this thread.
pub(super) fn recording() -> bool {
    STATE.with(|s| {
        matches!(
            s.borrow().as_ref(),
            Some(State {
                mode: Mode::Record,
                ..
            })
        )
    })
}

fn arg_keys(args: &[Tensor]) -> HashMap<Key, usize> {
    let mut m = HashMap::new();
    for (i, a) in args.iter().enumerate() {
        m.entry(key(a)).or_insert(i);
    }
    m
}

fn resolve(args: &HashMap<Key, usize>, outs: &HashMap<Key, (usize, usize)>, t: &Tensor) -> Operand {
    let k = key(t);
    if let Some(&i) = args.get(&k) {
        return Operand::Arg(i);
    }
    match outs.get(&k) {
        Some(&(s, j)) => Operand::Out(s, j),
        None => Operand::Captured(t.clone()),
    }
}

/// Most elements of a tensor the closure made afresh that are compared by
/// value (a bigger one made anew on each call always recompiles).
const COMPARE_MAX: usize = 1 << 16;

/// The same captured tensor, or a fresh one with the same values (what the
/// compiled graph, bound to the traced one, would read).
fn same_capture(traced: &Tensor, now: &Tensor) -> bool {
    if key(traced) == key(now) {
        return true;
    }
    if traced.meta() != now.meta() || now.numel() > COMPARE_MAX {
        return false;
    }
    let bits = |t: &Tensor| -> Vec<u64> {
        let _ng = crate::autograd::no_grad();
        t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
    };
    // the reads run eagerly, not as replayed ops
    REPLAYING.with(|r| r.set(false));
    let equal = bits(traced) == bits(now);
    REPLAYING.with(|r| r.set(true));
    equal
}

fn same(a: &Operand, b: &Operand) -> bool {
    match (a, b) {
        (Operand::Arg(x), Operand::Arg(y)) => x == y,
        (Operand::Out(s, j), Operand::Out(t, k)) => s == t && j == k,
        (Operand::Captured(x), Operand::Captured(y)) => same_capture(x, y),
        _ => false,
    }
}

fn describe(op: &Option<Op>) -> String {
    match op {
        Some(o) => format!("{o:?}"),
        None => "a copy".into(),
    }
}

/// Runs `f` (a trace of the compiled closure on `args`) while recording its
/// outermost ops; returns `f`'s result and the script.
pub(crate) fn record(
    args: &[Tensor],
    f: impl FnOnce() -> Result<Vec<Tensor>>,
) -> (Result<Vec<Tensor>>, Script) {
    let state = State {
        mode: Mode::Record,
        args: arg_keys(args),
        script: Script {
            grad_enabled: crate::autograd::is_grad_enabled(),
            ..Script::default()
        },
        recorder: Recorder::default(),
    };
    let outer = STATE.with(|s| s.borrow_mut().replace(state));
    let r = f();
    let mut st = STATE
        .with(|s| std::mem::replace(&mut *s.borrow_mut(), outer))
        .expect("recording state");
    if let Ok(outs) = &r {
        st.script.results = outs
            .iter()
            .map(|o| resolve(&st.args, &st.script.outs, o))
            .collect();
    }
    // a replay sees the stand-ins: key the steps' results by them (a
    // stand-in shares a layout and storage exactly where the traced
    // results did, so the map is the same one)
    let mut by_stand_in = HashMap::new();
    for (k, step) in st.script.steps.iter().enumerate() {
        for (j, o) in step.outs.iter().enumerate() {
            by_stand_in.entry(key(o)).or_insert((k, j));
        }
    }
    st.script.outs = by_stand_in;
    (r, st.script)
}

/// Called by an outermost op of a trace that records a script: appends it.
pub(super) fn push(op: Option<Op>, inputs: &[&Tensor], outs: &[Tensor]) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(st) = s.as_mut().filter(|st| matches!(st.mode, Mode::Record)) else {
            return;
        };
        let k = st.script.steps.len();
        let operands = inputs
            .iter()
            .map(|t| resolve(&st.args, &st.script.outs, t))
            .collect();
        for (j, o) in outs.iter().enumerate() {
            st.script.outs.entry(key(o)).or_insert((k, j));
        }
        let outs = outs
            .iter()
            .map(|o| st.recorder.stand_in(o, inputs))
            .collect();
        st.script.steps.push(Step { op, operands, outs });
    });
}

/// An op called during a replay: checks it against the next recorded step
/// and returns that step's results (nothing is computed). Once the replay
/// has differed, ops run eagerly (`f`, the op's implementation) so the
/// closure finishes normally — operators that unwrap must not panic — and
/// the caller recompiles; an op's in-place updates (BatchNorm's running
/// stats) are undone so that call applies them once.
pub(super) fn replay_op(
    op: Option<Op>,
    inputs: &[&Tensor],
    f: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    match check_step(&op, inputs) {
        Some(outs) => Ok(outs),
        None => eager_after_mismatch(op.as_ref(), inputs, f),
    }
}

fn eager_after_mismatch(
    op: Option<&Op>,
    inputs: &[&Tensor],
    f: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let mutated = op.map_or(&[][..], super::mutated_operands);
    let saved: Vec<(Tensor, Tensor)> = {
        let _eager = Eager::new();
        mutated
            .iter()
            .filter_map(|&i| inputs.get(i))
            .map(|t| Ok(((*t).clone(), t.copy()?)))
            .collect::<Result<_>>()?
    };
    let _eager = Eager::new();
    let outs = f();
    let _ng = crate::autograd::no_grad();
    for (t, old) in saved {
        t.copy_(&old)?;
    }
    outs
}

/// Turns replaying off while it lives (eager work inside a replay).
struct Eager;

impl Eager {
    fn new() -> Eager {
        REPLAYING.with(|r| r.set(false));
        Eager
    }
}

impl Drop for Eager {
    fn drop(&mut self) {
        REPLAYING.with(|r| r.set(true));
    }
}

/// The recorded results when `op` matches the next step; `None` (and the
/// replay marked as differing) otherwise.
fn check_step(op: &Option<Op>, inputs: &[&Tensor]) -> Option<Vec<Tensor>> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let st = s.as_mut().expect("replay state");
        let Mode::Replay { pos, mismatch } = &mut st.mode else {
            unreachable!("replay_op outside a replay")
        };
        if mismatch.is_some() {
            return None;
        }
        let k = *pos;
        let why = match st.script.steps.get(k) {
            None => Some(format!(
                "the function now runs more ops than the {} it ran when traced ({})",
                st.script.steps.len(),
                describe(op)
            )),
            Some(step) if step.op != *op => Some(format!(
                "op #{k} was {} when traced, now {}",
                describe(&step.op),
                describe(op)
            )),
            Some(step) => inputs
                .iter()
                .zip(&step.operands)
                .position(|(t, want)| !same(want, &resolve(&st.args, &st.script.outs, t)))
                .or((inputs.len() != step.operands.len()).then_some(inputs.len()))
                .map(|i| {
                    format!(
                        "operand {i} of op #{k} ({}) is not the tensor (or value) it was when traced",
                        describe(&step.op)
                    )
                }),
        };
        if let Some(w) = why {
            *mismatch = Some(w);
            return None;
        }
        *pos += 1;
        Some(st.script.steps[k].outs.clone())
    })
}

/// Called where code reads a value on the host during a replay: the
/// recorded results hold the traced call's values, so this is a mismatch.
pub(super) fn replay_read(op: &str, t: &Tensor) -> Result<()> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(State {
            mode: Mode::Replay { mismatch, .. },
            script,
            ..
        }) = s.as_mut()
        {
            if script.outs.contains_key(&key(t)) {
                // the recorded value is the traced call's: a real one is needed
                mismatch.get_or_insert(format!("`{op}` reads a traced value on the host"));
            }
        }
        Ok(())
    })
}

/// Replays `f(args)` against `script`; `None` when the closure ran exactly
/// the recorded ops, otherwise what differed. Puts back the default
/// generator's state, so a replay draws no random numbers.
pub(crate) fn replay_mismatch(
    script: &mut Script,
    args: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Option<String> {
    let rng = crate::random::get_rng_state();
    let state = State {
        mode: Mode::Replay {
            pos: 0,
            mismatch: None,
        },
        args: arg_keys(args),
        script: std::mem::take(script),
        recorder: Recorder::default(),
    };
    let grad = state.script.grad_enabled;
    let mut guard = Installed {
        outer: STATE.with(|s| s.borrow_mut().replace(state)),
    };
    REPLAYING.with(|r| r.set(true));
    let r = {
        let _g = crate::autograd::set_grad_enabled(grad);
        f(args)
    };
    let st = guard.take();
    crate::random::set_rng_state(&rng);
    *script = st.script;
    let Mode::Replay { pos, mismatch } = st.mode else {
        unreachable!("replay state")
    };
    if mismatch.is_some() {
        return mismatch;
    }
    let outs = match r {
        Ok(o) => o,
        Err(e) => return Some(format!("the function failed when replayed: {e}")),
    };
    if pos != script.steps.len() {
        return Some(format!(
            "the function now runs {pos} ops, {} when traced",
            script.steps.len()
        ));
    }
    let now: Vec<Operand> = outs
        .iter()
        .map(|o| resolve(&st.args, &script.outs, o))
        .collect();
    if now.len() != script.results.len()
        || !now.iter().zip(&script.results).all(|(a, b)| same(b, a))
    {
        return Some("the function now returns different tensors".into());
    }
    None
}

/// Puts the thread's replay state back as it was, also when the closure panics.
struct Installed {
    outer: Option<State>,
}

impl Installed {
    /// Ends the replay: the state it ran with.
    fn take(&mut self) -> State {
        REPLAYING.with(|r| r.set(false));
        let outer = self.outer.take();
        STATE
            .with(|s| std::mem::replace(&mut *s.borrow_mut(), outer))
            .expect("replay state")
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if REPLAYING.with(|r| r.get()) {
            REPLAYING.with(|r| r.set(false));
            let outer = self.outer.take();
            STATE.with(|s| *s.borrow_mut() = outer);
        }
    }
}
