//! Tensor gradient hooks (`Tensor.register_hook`): a function of the
//! gradient flowing into a tensor that observes it (returns `None`) or
//! replaces it (returns `Some(new)`), as in PyTorch.
//!
//! A non-leaf tensor's hooks run on its summed gradient just before its
//! backward node uses it; a leaf's (a parameter's) on its summed gradient
//! just before it is added to `.grad` — after every use's gradient arrived,
//! as PyTorch's hooks on `AccumulateGrad` do. Inside `compile()`, a leaf's
//! hooks run when the compiled backward hands the gradient over (the same
//! leaf edges); a hook on a tensor *inside* a compiled function is a graph
//! break (that function runs eagerly, where the hook runs).
//!
//! ```
//! use kiln_frontend::{DType, Tensor};
//! let w = Tensor::ones(&[3], DType::F32).requires_grad_(true);
//! use kiln_ir::BinaryOp::Mul;
//! let y = w.binary_scalar(Mul, 2.0, false).unwrap();
//! // double the gradient flowing into y
//! let _h = y.register_hook(|g| Ok(Some(g.binary_scalar(Mul, 2.0, false)?))).unwrap();
//! y.sum(None, false).unwrap().backward().unwrap();
//! assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![4.0; 3]);
//! ```

use super::node::Node;
use super::AutogradMeta;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

type GradHook = dyn Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync;

enum Target {
    Node(Weak<Node>),
    Leaf(Weak<AutogradMeta>),
}

struct Registered {
    id: u64,
    target: Target,
    f: Arc<GradHook>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// How many hooks are registered: zero keeps backward free of lookups.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn registry() -> std::sync::MutexGuard<'static, Vec<Registered>> {
    static R: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
    R.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes its gradient hook when dropped (or by [`GradHookHandle::remove`]).
#[must_use = "the hook is removed when the handle drops"]
pub struct GradHookHandle {
    id: u64,
}

impl GradHookHandle {
    /// Removes the hook now.
    pub fn remove(self) {}
}

impl Drop for GradHookHandle {
    fn drop(&mut self) {
        let mut r = registry();
        let before = r.len();
        r.retain(|h| h.id != self.id);
        COUNT.fetch_sub(before - r.len(), Ordering::SeqCst);
    }
}

impl Tensor {
    /// `tensor.register_hook(hook)`: `hook(grad)` runs each backward with
    /// the gradient flowing into this tensor; `Ok(Some(g))` replaces it,
    /// `Ok(None)` keeps it. The tensor must require grad. Hooks run in the
    /// order registered, each on the previous one's result.
    ///
    /// ```
    /// use kiln_frontend::{DType, Tensor};
    /// use std::sync::{Arc, Mutex};
    /// let w = Tensor::ones(&[2], DType::F32).requires_grad_(true);
    /// let seen = Arc::new(Mutex::new(None));
    /// let s = seen.clone();
    /// let _h = w.register_hook(move |g| {
    ///     *s.lock().unwrap() = Some(g.to_vec::<f32>()?);
    ///     Ok(None)
    /// }).unwrap();
    /// w.mul(&w).unwrap().sum(None, false).unwrap().backward().unwrap();
    /// assert_eq!(seen.lock().unwrap().clone(), Some(vec![2.0, 2.0]));
    /// ```
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync + 'static,
    ) -> Result<GradHookHandle> {
        let Some(meta) = self.autograd.as_ref().filter(|_| self.requires_grad()) else {
            bail!(
                "register_hook",
                "cannot register a hook on a tensor that does not require grad (shape {})",
                fmt_dims(self.dims())
            );
        };
        let target = match &meta.grad_fn {
            Some(n) => Target::Node(Arc::downgrade(n)),
            None => Target::Leaf(Arc::downgrade(meta)),
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        registry().push(Registered {
            id,
            target,
            f: Arc::new(hook),
        });
        COUNT.fetch_add(1, Ordering::SeqCst);
        Ok(GradHookHandle { id })
    }
}

/// Runs `hooks` on `g` in order, each on the previous one's result.
fn apply(what: &str, hooks: &[Arc<GradHook>], mut g: Tensor) -> Result<Tensor> {
    for f in hooks {
        if let Some(new) = f(&g)? {
            if new.dims() != g.dims() {
                bail!(
                    "register_hook",
                    "a hook on {what} returned a gradient of shape {} for one of shape {}",
                    fmt_dims(new.dims()),
                    fmt_dims(g.dims())
                );
            }
            g = new;
        }
    }
    Ok(g)
}

/// The gradient `g` of `node`'s output after the hooks of that tensor
/// (called by the engine before the node runs). While tracing, a hook is a
/// graph break: the traced backward cannot call back into Rust.
pub(crate) fn on_node(node: &Arc<Node>, g: Tensor) -> Result<Tensor> {
    if COUNT.load(Ordering::SeqCst) == 0 {
        return Ok(g);
    }
    let hooks: Vec<Arc<GradHook>> = registry()
        .iter()
        .filter(
            |h| matches!(&h.target, Target::Node(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(node))),
        )
        .map(|h| h.f.clone())
        .collect();
    if hooks.is_empty() {
        return Ok(g);
    }
    crate::compile::trace::unsupported(
        "register_hook",
        "a gradient hook on a tensor inside the compiled function (hooks on its inputs and \
         parameters run, as the compiled backward hands their gradients over)",
    )?;
    apply(&format!("the output of {}", node.name()), &hooks, g)
}

type Key = *const AutogradMeta;
type LeafSink<'a> = dyn FnMut(&Arc<AutogradMeta>, Tensor) -> Result<()> + 'a;

/// Wraps the `.grad` sink of one backward so that a hooked leaf's
/// gradients are summed and passed through its hooks before they reach
/// the sink (once every edge into it delivered, or at the end).
pub(crate) fn with_leaf_hooks(
    roots: &[&Tensor],
    sink: &mut LeafSink<'_>,
    run: impl FnOnce(&mut LeafSink<'_>) -> Result<()>,
) -> Result<()> {
    if COUNT.load(Ordering::SeqCst) == 0 {
        return run(sink);
    }
    let mut hooks: HashMap<Key, Vec<Arc<GradHook>>> = HashMap::new();
    for h in registry().iter() {
        if let Target::Leaf(w) = &h.target {
            if let Some(m) = w.upgrade() {
                hooks.entry(Arc::as_ptr(&m)).or_default().push(h.f.clone());
            }
        }
    }
    if hooks.is_empty() {
        return run(sink);
    }
    let hooked: HashSet<Key> = hooks.keys().copied().collect();
    let mut pending = super::hooks::pending_counts(roots, &hooked);
    let mut held: HashMap<Key, (Arc<AutogradMeta>, Tensor)> = HashMap::new();
    let hooked_grad =
        |m: &Arc<AutogradMeta>, g: Tensor| apply("a leaf", &hooks[&Arc::as_ptr(m)], g);
    run(&mut |m, g| {
        let k = Arc::as_ptr(m);
        if !hooked.contains(&k) {
            return sink(m, g);
        }
        let sum = match held.remove(&k) {
            Some((_, old)) => old.add(&g)?,
            None => g,
        };
        let left = pending.get_mut(&k).map(|c| {
            *c = c.saturating_sub(1);
            *c
        });
        match left {
            Some(0) | None => sink(m, hooked_grad(m, sum)?),
            Some(_) => {
                held.insert(k, (m.clone(), sum));
                Ok(())
            }
        }
    })?;
    // edges that delivered no gradient: hand over what arrived
    for (_, (m, g)) in held {
        sink(&m, hooked_grad(&m, g)?)?;
    }
    Ok(())
}
