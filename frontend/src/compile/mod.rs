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
mod pipeline;
mod program;
mod shadow;
mod tile_replay;
pub mod trace;

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
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    recompiles: Vec<RecompileReason>,
    /// Set once the recompile limit is hit: every later call runs eagerly.
    gave_up: Option<String>,
}

/// Compiles a module's `forward` (see the module docs); any `&dyn Module`
/// will do, a `Box<dyn Module>` too (`compile(boxed.as_ref())`).
/// [`Compiled::forward`] runs `Module::forward`; [`Compiled::call`] with
/// several inputs runs `Module::forward_many`.
pub fn compile(m: &dyn Module) -> Compiled<'_> {
    let mut names = m.named_parameters();
    names.extend(m.named_buffers());
    Compiled {
        name: "forward".into(),
        f: Box::new(move |xs: &[Tensor]| match xs {
            [x] => Ok(vec![m.forward(x)?]),
            _ => m.forward_many(&xs.iter().map(Some).collect::<Vec<_>>()),
        }),
        names,
        training: Box::new(move || tree_training(m)),
        options: CompileOptions::default(),
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
/// an atomic or a `Mutex` can, and the compiled graph would not see the
/// change. Pass such a value as an input instead, a 0-dim tensor read afresh
/// on every call:
///
/// ```
/// use kiln_frontend::{compile::compile_fn, Tensor};
/// let f = compile_fn("scale", |t| Ok(vec![t[0].mul(&t[1])?]));
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// for lr in [0.5f32, 0.25] {
///     let y = f.call(&[x.clone(), Tensor::scalar(lr)]).unwrap();
///     assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![lr, 2.0 * lr]);
/// }
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

    /// `forward(x)` for a compiled module (or a one-input, one-output function).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.call(std::slice::from_ref(x))?;
        Ok(out.swap_remove(0))
    }

    /// Calls the compiled function.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let guards = Guards::of(args, (self.training)(), self.needs_grad(args));
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.gave_up.is_some() {
            drop(st);
            return (self.f)(args);
        }
        if let Some(e) = st.entries.iter_mut().find(|e| e.guards == guards) {
            return e.run(&self.name, args, &*self.f, &self.options);
        }
        let reason = st.entries.last().map(|e| e.guards.miss_reason(&guards));
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
        let (entry, outs) = Entry::build(
            &self.name,
            args,
            &self.names,
            &*self.f,
            guards,
            &self.options,
        )?;
        st.entries.push(entry);
        Ok(outs)
    }

    fn needs_grad(&self, args: &[Tensor]) -> bool {
        crate::autograd::is_grad_enabled()
            && (args.iter().any(|a| a.requires_grad())
                || self.names.iter().any(|(_, t)| t.requires_grad()))
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
