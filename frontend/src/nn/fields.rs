//! What `#[derive(Module)]` (the `kiln-derive` crate) builds on: the
//! [`Training`] flag a module can own, and [`ModuleField`], how a field
//! holds a child module.

use super::Module;
use std::sync::atomic::{AtomicBool, Ordering};

/// A module's train/eval flag (`self.training` in PyTorch): true when made.
/// A `#[derive(Module)]` struct with a `Training` field reports it from
/// `is_training()`, and `train()` / `eval()` set it.
///
/// ```
/// use kiln_frontend::nn::Training;
/// let t = Training::default();
/// assert!(t.get());
/// t.set(false);
/// assert!(!t.get());
/// ```
#[derive(Debug)]
pub struct Training(AtomicBool);

impl Default for Training {
    fn default() -> Training {
        Training(AtomicBool::new(true))
    }
}

impl Clone for Training {
    fn clone(&self) -> Training {
        Training(AtomicBool::new(self.get()))
    }
}

impl Training {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed)
    }
}

/// A struct field that may hold a child module: a module itself, an
/// `Option` of one (a child only when `Some`), or a `Box<dyn Module>`.
/// A list of modules goes in a [`super::ModuleList`] (a `Vec` would hide
/// its parameters from `parameters()`, the optimizer and `state_dict`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a module, so #[derive(Module)] cannot register it as a child",
    note = "mark configuration fields #[module(skip)]; put lists of layers in a ModuleList \
            or Sequential; tensors are parameters unless #[module(buffer)]"
)]
pub trait ModuleField {
    fn child(&self) -> Option<&dyn Module>;
    fn child_mut(&mut self) -> Option<&mut dyn Module>;
}

impl<M: Module> ModuleField for M {
    fn child(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn child_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

impl<M: Module> ModuleField for Option<M> {
    fn child(&self) -> Option<&dyn Module> {
        self.as_ref().map(|m| m as &dyn Module)
    }
    fn child_mut(&mut self) -> Option<&mut dyn Module> {
        self.as_mut().map(|m| m as &mut dyn Module)
    }
}

impl ModuleField for Box<dyn Module> {
    fn child(&self) -> Option<&dyn Module> {
        Some(self.as_ref())
    }
    fn child_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self.as_mut())
    }
}
