//! Forward hooks (`register_forward_pre_hook`, `register_forward_hook`, and
//! `register_module_forward_hook` for every module), what `summary()` and
//! the activation statistics are built on.
//!
//! A hook fires when a module's forward runs through [`run`]: every
//! standard layer and container does, whoever calls it, and
//! [`super::ModuleExt::call`] does for any module (PyTorch's `module(x)`
//! beside `module.forward(x)`; a layer reached through both fires once). A
//! module is known by its address and size, so a hook belongs to the module
//! value it was registered on (a struct and its first field share an
//! address, not a size; a one-field wrapper of the same size as its field
//! is the one case the two cannot be told apart); dropping the returned
//! [`HookHandle`] removes the hook. With no hook registered, [`run`] costs
//! one atomic load.
//!
//! ```
//! use kiln_frontend::nn::{hooks, Linear, Module};
//! use kiln_frontend::{DType, Tensor};
//! use std::sync::{Arc, Mutex};
//! let l = Linear::new(4, 2, true).unwrap();
//! let seen = Arc::new(Mutex::new(vec![]));
//! let s = seen.clone();
//! let _h = hooks::register_forward_hook(&l, move |_m, _inputs, out| {
//!     s.lock().unwrap().push(out.dims().to_vec());
//!     Ok(None) // keep the output (Some(t) would replace it)
//! });
//! l.forward(&Tensor::zeros(&[3, 4], DType::F32)).unwrap();
//! assert_eq!(*seen.lock().unwrap(), vec![vec![3, 2]]);
//! ```

use super::Module;
use crate::Tensor;
use kiln_ir::Result;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Called before forward with the module and its input.
pub type PreHook = dyn Fn(&dyn Module, &Tensor) -> Result<()> + Send + Sync;
/// Called after forward with the module, its input and its output;
/// `Ok(Some(t))` replaces the output.
pub type PostHook = dyn Fn(&dyn Module, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync;
/// Called instead of the module's own forward (what `quantize_dynamic`
/// swaps into a layer of any module tree).
pub type ReplaceHook = dyn Fn(&dyn Module, &Tensor) -> Result<Tensor> + Send + Sync;

#[derive(Clone)]
enum Hook {
    Pre(Arc<PreHook>),
    Post(Arc<PostHook>),
    Replace(Arc<ReplaceHook>),
}

/// A module's identity for hooks: its address and size (see the module
/// docs), e.g. to find a running module's name in its model.
pub type Key = (usize, usize);

struct Registered {
    id: u64,
    /// The module's key; `None`: every module.
    module: Option<Key>,
    hook: Hook,
}

thread_local! {
    /// The module whose hooks this thread is running the body of.
    static RUNNING: std::cell::Cell<Key> = const { std::cell::Cell::new((0, 0)) };
}

static HOOKS: RwLock<Vec<Registered>> = RwLock::new(Vec::new());
static COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Removes its hook when dropped (or with [`HookHandle::remove`]).
#[must_use = "dropping the handle removes the hook at once"]
pub struct HookHandle(u64);

impl HookHandle {
    /// `handle.remove()`.
    pub fn remove(self) {}
}

impl Drop for HookHandle {
    fn drop(&mut self) {
        let mut hooks = HOOKS.write().unwrap_or_else(|e| e.into_inner());
        let before = hooks.len();
        hooks.retain(|r| r.id != self.0);
        COUNT.fetch_sub(before - hooks.len(), Ordering::SeqCst);
    }
}

/// The identity [`run`] knows `m` by.
pub fn key(m: &dyn Module) -> Key {
    (
        m as *const dyn Module as *const () as usize,
        std::mem::size_of_val(m),
    )
}

fn register(module: Option<Key>, hook: Hook) -> HookHandle {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    HOOKS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .push(Registered { id, module, hook });
    COUNT.fetch_add(1, Ordering::SeqCst);
    HookHandle(id)
}

/// `module.register_forward_pre_hook(hook)`.
pub fn register_forward_pre_hook(
    m: &dyn Module,
    hook: impl Fn(&dyn Module, &Tensor) -> Result<()> + Send + Sync + 'static,
) -> HookHandle {
    register(Some(key(m)), Hook::Pre(Arc::new(hook)))
}

/// `module.register_forward_hook(hook)`.
pub fn register_forward_hook(
    m: &dyn Module,
    hook: impl Fn(&dyn Module, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync + 'static,
) -> HookHandle {
    register(Some(key(m)), Hook::Post(Arc::new(hook)))
}

/// Runs `forward` in place of `m`'s own forward while the handle lives (the
/// last one registered wins): how `quantize_dynamic` swaps a Linear or
/// LSTM inside a module whose forward is the user's own code, as PyTorch
/// swaps the attribute.
pub fn register_forward_replacement(
    m: &dyn Module,
    forward: impl Fn(&dyn Module, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
) -> HookHandle {
    register(Some(key(m)), Hook::Replace(Arc::new(forward)))
}

/// `torch.nn.modules.module.register_module_forward_pre_hook`: every module.
pub fn register_module_forward_pre_hook(
    hook: impl Fn(&dyn Module, &Tensor) -> Result<()> + Send + Sync + 'static,
) -> HookHandle {
    register(None, Hook::Pre(Arc::new(hook)))
}

/// `torch.nn.modules.module.register_module_forward_hook`: every module.
pub fn register_module_forward_hook(
    hook: impl Fn(&dyn Module, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync + 'static,
) -> HookHandle {
    register(None, Hook::Post(Arc::new(hook)))
}

/// Runs `body` (a module's forward), or the replacement registered for `m`,
/// between the hooks registered for `m` and for every module, in
/// registration order. A module's `forward` is
/// `hooks::run(self, x, |x| ...)`.
pub fn run(
    m: &dyn Module,
    x: &Tensor,
    body: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let at = key(m);
    if COUNT.load(Ordering::Relaxed) == 0 || RUNNING.get() == at {
        return body(x);
    }
    // copied out, so a hook may register hooks or run modules itself
    let hooks: Vec<Hook> = HOOKS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|r| r.module.is_none_or(|a| a == at))
        .map(|r| r.hook.clone())
        .collect();
    for h in &hooks {
        if let Hook::Pre(f) = h {
            f(m, x)?;
        }
    }
    let replacement = hooks.iter().rev().find_map(|h| match h {
        Hook::Replace(f) => Some(f.clone()),
        _ => None,
    });
    let outer = RUNNING.replace(at);
    let y = match replacement {
        Some(f) => f(m, x),
        None => body(x),
    };
    RUNNING.set(outer);
    let mut y = y?;
    for h in &hooks {
        if let Hook::Post(f) = h {
            if let Some(new) = f(m, x, &y)? {
                y = new;
            }
        }
    }
    Ok(y)
}
