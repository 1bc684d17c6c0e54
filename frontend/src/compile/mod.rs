//! `compile()`: trace eager code into an `ir::Graph`, rewrite and fuse it,
//! and run the result as a cached executable under guards.
//!
//! ```no_run
//! use kiln_frontend::{compile, nn, Tensor};
//! let model = nn::Linear::new(4, 2, true).unwrap();
//! let fast = compile::compile(&model);
//! let y = fast.forward(&Tensor::zeros(&[8, 4], kiln_frontend::DType::F32)).unwrap();
//! println!("{}", fast.explain());
//! ```
//!
//! The first call traces (running the code eagerly once); later calls whose
//! inputs match the entry's guards run the compiled executable. A new batch
//! size re-plans the graph but compiles no new machine code (kernels take
//! sizes as arguments); any other guard miss recompiles, with the reason
//! shown by `KILN_LOG=recompiles`. Past the recompile limit, calls run eagerly.

mod conv_report;
mod disk_cache;
/// Where compiled plans are cached on disk (see `KILN_CACHE_DIR`); None when off.
pub use disk_cache::dir as plan_cache_dir;
pub mod dispatch;
mod dump;
pub(crate) mod epilogue;
pub mod exec;
mod explain;
mod guard;
mod joint;
mod multi_backward;
mod pipeline;
mod program;
mod recompute;
mod shadow;
mod tile_replay;
pub mod trace;
mod value;

pub use dump::Stage;
pub use explain::{BackwardReport, EntryReport, LaunchList, Report};
pub use guard::{Guards, RecompileReason};
pub use pipeline::{CompileOptions, StageTimes};

use crate::nn::{Module, ModuleExt};
use crate::Tensor;
use kiln_ir::Result;
use pipeline::Entry;
use std::sync::Mutex;

type Func<'a> = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'a>;

/// A compiled function or module; call it like the original.
pub struct Compiled<'a> {
    name: String,
    f: Func<'a>,
    /// Names for tensors the function captures (a module's parameters and buffers).
    names: Vec<(String, Tensor)>,
    training: Box<dyn Fn() -> bool + Send + Sync + 'a>,
    options: CompileOptions,
    /// Replay the closure on every call to catch changed captured values
    /// (`compile_fn`; see [`Compiled::trust_captures`]).
    guard_captures: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    recompiles: Vec<RecompileReason>,
    /// Set once the recompile limit is hit: every later call runs eagerly.
    gave_up: Option<String>,
    /// Tensors a trace found the function capturing that require grad
    /// (`compile_fn`'s parameters): a call in grad mode differentiates
    /// through them, as torch.compile does, even with no argument that
    /// requires grad.
    grad_captures: Vec<Tensor>,
}

/// Compiles a module's `forward` (see the module docs); any `&dyn Module`
/// will do, a `Box<dyn Module>` too (`compile(boxed.as_ref())`).
/// [`Compiled::call`] runs `Module::forward_many` (whose default, for one
/// input, is `Module::forward`); [`Compiled::forward`] returns its first
/// output.
pub fn compile(m: &dyn Module) -> Compiled<'_> {
    let mut names = m.named_parameters();
    names.extend(m.named_buffers());
    Compiled {
        name: "forward".into(),
        // forward_many even for one input: its default is `forward`, and a
        // module with several outputs (an LSTM's output, h_n, c_n) returns
        // them all; `Compiled::forward` keeps the first
        f: Box::new(move |xs: &[Tensor]| m.forward_many(&xs.iter().map(Some).collect::<Vec<_>>())),
        names,
        training: Box::new(move || tree_training(m)),
        options: CompileOptions::default(),
        guard_captures: false,
        state: Mutex::default(),
    }
}

/// The mode a module tree runs in: false when any module in it is in eval
/// mode. (A container such as `Sequential` keeps no flag of its own — its
/// `is_training()` is always true — so the guard asks every descendant;
/// otherwise an entry traced in train mode would be reused after `eval()`.)
fn tree_training(m: &dyn Module) -> bool {
    let mut on = m.is_training();
    m.visit(&mut |e| {
        if let crate::nn::Entry::Child(_, c) = e {
            on &= tree_training(c);
        }
    });
    on
}

/// Compiles a function of several tensors returning several tensors.
///
/// Rust scalars the closure uses are constants of the traced graph: the
/// tracer sees `x * lr` as a `mul_scalar` node with the value `lr` had when
/// it traced. A plain captured `f32` cannot change while the `Compiled`
/// lives (the closure owns or borrows it), but one read through a `Cell`,
/// an atomic or a `Mutex` can. So `compile_fn` guards on captured values:
/// on every call it first *replays* the closure — each op compares itself
/// (its kind, constants and operands) with what the trace recorded and
/// returns the recorded result without computing anything — and a
/// difference (a new scalar, a captured flag taking another branch, a
/// tensor made afresh with other values) recompiles, with the reason in
/// `explain()` and `KILN_LOG=recompiles`. The replay costs the closure's own
/// Rust code plus one op comparison per op (a few µs for a small graph; see
/// the README), and keeps the traced call's intermediate tensors alive while
/// the entry lives. [`Compiled::trust_captures`] turns it off.
///
/// A value that changes on every call recompiles every call until the
/// recompile limit, then runs eagerly: pass it as an input instead, a 0-dim
/// tensor read afresh on every call:
///
/// ```
/// use kiln_frontend::{compile::compile_fn, Tensor};
/// use std::sync::atomic::{AtomicU32, Ordering};
/// let f = compile_fn("scale", |t| Ok(vec![t[0].mul(&t[1])?]));
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// for lr in [0.5f32, 0.25] {
///     let y = f.call(&[x.clone(), Tensor::scalar(lr)]).unwrap();
///     assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![lr, 2.0 * lr]);
/// }
/// // a captured value that changes is seen (and recompiles)
/// let k = AtomicU32::new(2.0f32.to_bits());
/// let g = compile_fn("times_k", |t| {
///     Ok(vec![t[0].binary_scalar(kiln_ir::BinaryOp::Mul, f32::from_bits(k.load(Ordering::Relaxed)), false)?])
/// });
/// assert_eq!(g.call(&[x.clone()]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
/// k.store(3.0f32.to_bits(), Ordering::Relaxed);
/// assert_eq!(g.call(&[x.clone()]).unwrap()[0].to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
/// ```
pub fn compile_fn<'a>(
    name: &str,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'a,
) -> Compiled<'a> {
    Compiled {
        name: name.into(),
        f: Box::new(f),
        names: vec![],
        training: Box::new(|| false),
        options: CompileOptions::default(),
        guard_captures: true,
        state: Mutex::default(),
    }
}

impl<'a> Compiled<'a> {
    /// Replaces the options (recompile limit, rewrite limits, shadow check).
    pub fn with_options(mut self, options: CompileOptions) -> Compiled<'a> {
        self.options = options;
        self
    }

    /// Runs eager alongside compiled on every call; a mismatch beyond `tol`
    /// is an error naming the first fused kernel whose output diverges.
    pub fn with_shadow_check(mut self, tol: f64) -> Compiled<'a> {
        self.options.shadow_tol = Some(tol);
        self
    }

    /// Skips the captured-value replay of every call (see [`compile_fn`]):
    /// for a closure whose captured values never change, it saves the
    /// replay's cost; a changed value then goes unseen.
    pub fn trust_captures(mut self) -> Compiled<'a> {
        self.guard_captures = false;
        self
    }

    /// `forward(x)` for a compiled module (or a one-input, one-output function).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.call(std::slice::from_ref(x))?;
        Ok(out.swap_remove(0))
    }

    /// Calls the compiled function.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let guards = Guards::of(
            args,
            (self.training)(),
            self.needs_grad(args, &st.grad_captures),
        );
        if st.gave_up.is_some() {
            drop(st);
            return (self.f)(args);
        }
        let mut reason = None;
        if let Some(i) = st.entries.iter().position(|e| e.guards == guards) {
            let stale = match st.entries[i].captures.as_mut() {
                Some(script) if self.guard_captures => {
                    trace::probe::replay_mismatch(script, args, &*self.f)
                }
                _ => None,
            };
            match stale {
                None => return st.entries[i].run(&self.name, args, &*self.f, &self.options),
                Some(why) => {
                    st.entries.remove(i);
                    reason = Some(RecompileReason::Captured(why));
                }
            }
        }
        let reason = reason.or_else(|| st.entries.last().map(|e| e.guards.miss_reason(&guards)));
        if let Some(r) = &reason {
            if kiln_runtime::log_enabled("recompiles") {
                eprintln!("[kiln recompiles] {}: {r}", self.name);
            }
            let counted = st.recompiles.iter().filter(|r| r.counts()).count();
            if r.counts() && counted + 1 >= self.options.recompile_limit {
                let why = format!(
                    "compile: `{}` hit the recompile limit ({}); running eagerly from now on. Last reason: {r}",
                    self.name, self.options.recompile_limit
                );
                crate::warnings::warn(&why);
                st.gave_up = Some(why);
                drop(st);
                return (self.f)(args);
            }
            st.recompiles.push(r.clone());
        }
        let script = std::cell::RefCell::new(None);
        let f = &*self.f;
        // while tracing, record the ops the closure runs for the replay guard
        let recorded = |xs: &[Tensor]| {
            if !(self.guard_captures && trace::is_tracing()) {
                return f(xs);
            }
            let (r, s) = trace::probe::record(xs, || f(xs));
            *script.borrow_mut() = Some(s);
            r
        };
        let (mut entry, outs) = Entry::build(
            &self.name,
            args,
            &self.names,
            &recorded,
            guards,
            &self.options,
        )?;
        if entry.graph_break.is_none() {
            entry.captures = script.into_inner();
            // a forward that stashed a value (`self.probs`) would read the
            // first call's on every cached call: refuse
            if let Some(why) = entry.stale_state(&self.name) {
                return Err(kiln_ir::Error::op("compile", why));
            }
        }
        for b in &entry.bindings {
            if let trace::Binding::Captured(t) = b {
                let known = st.grad_captures.iter().any(|c| c.shares_storage(t));
                if t.requires_grad() && !known {
                    st.grad_captures.push(t.clone());
                }
            }
        }
        st.entries.push(entry);
        Ok(outs)
    }

    /// Whether autograd would record this call: grad mode on and an
    /// argument, a named tensor or a captured one seen by a trace
    /// (`captures`) requires grad.
    fn needs_grad(&self, args: &[Tensor], captures: &[Tensor]) -> bool {
        crate::autograd::is_grad_enabled()
            && (args.iter().any(|a| a.requires_grad())
                || self.names.iter().any(|(_, t)| t.requires_grad())
                || captures.iter().any(|t| t.requires_grad()))
    }

    /// What compile did: kernels and what each fused, what stayed unfused and
    /// why, graph breaks, planned memory, compile time by stage.
    pub fn explain(&self) -> Report {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Report {
            name: self.name.clone(),
            entries: st.entries.iter().map(|e| e.report()).collect(),
            recompiles: st.recompiles.clone(),
            gave_up: st.gave_up.clone(),
        }
    }
}

#[cfg(test)]
mod exec_tests;
