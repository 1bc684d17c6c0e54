//! Hooks into the backward pass: a per-leaf hook that fires once the leaf's
//! gradient is complete (`Tensor.register_post_accumulate_grad_hook`) and
//! callbacks queued to run when the current backward ends
//! (`Variable._execution_engine.queue_callback`). Distributed data parallel
//! uses both: a parameter's hook marks it ready so its bucket's all-reduce
//! starts while the rest of backward runs, and one queued callback waits for
//! the reductions before `backward()` returns.
//!
//! "Complete" means every edge of the graph into the leaf has delivered its
//! gradient, so a parameter used twice fires once, after the second use's
//! gradient is added. The compiled backward (`CompiledBackward`) hands its
//! parameter gradients to the same leaf edges, so its hooks fire alike.
//!
//! ```
//! use kiln_frontend::autograd::hooks;
//! use kiln_frontend::{DType, Tensor};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! let w = Tensor::ones(&[3], DType::F32).requires_grad_(true);
//! let fired = Arc::new(AtomicUsize::new(0));
//! let f = fired.clone();
//! let _h = hooks::register_post_accumulate_grad_hook(&w, move || {
//!     f.fetch_add(1, Ordering::SeqCst);
//!     Ok(())
//! }).unwrap();
//! let y = (&w * &w).sum(None, false).unwrap(); // w is used twice: one firing
//! y.backward().unwrap();
//! assert_eq!(fired.load(Ordering::SeqCst), 1);
//! ```

use super::node::{Edge, Node};
use super::AutogradMeta;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

type HookFn = dyn Fn() -> Result<()> + Send + Sync;
type Callback = Box<dyn FnOnce() -> Result<()> + Send>;

struct Registered {
    id: u64,
    meta: Weak<AutogradMeta>,
    f: Arc<HookFn>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// How many hooks are registered: zero keeps backward free of any bookkeeping.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn registry() -> std::sync::MutexGuard<'static, Vec<Registered>> {
    static R: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
    R.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// Callbacks of the backward running on this thread (`None` outside one);
    /// nested backward calls share the outermost one's list.
    static QUEUE: RefCell<Option<Vec<Callback>>> = const { RefCell::new(None) };
}

/// Removes its hook when dropped (or by [`HookHandle::remove`]).
#[must_use = "the hook is removed when the handle drops"]
pub struct HookHandle {
    id: u64,
}

impl HookHandle {
    /// Removes the hook now.
    pub fn remove(self) {}
}

impl Drop for HookHandle {
    fn drop(&mut self) {
        let mut r = registry();
        let before = r.len();
        r.retain(|h| h.id != self.id);
        COUNT.fetch_sub(before - r.len(), Ordering::SeqCst);
    }
}

/// Runs `f` each time a backward has delivered all of `leaf`'s gradient
/// (after it was added to `.grad`). `leaf` must be a leaf that requires grad.
pub fn register_post_accumulate_grad_hook(
    leaf: &Tensor,
    f: impl Fn() -> Result<()> + Send + Sync + 'static,
) -> Result<HookHandle> {
    let op = "register_post_accumulate_grad_hook";
    let Some(meta) = leaf.autograd.as_ref().filter(|_| leaf.requires_grad()) else {
        bail!(
            op,
            "the tensor of shape {} does not require grad",
            fmt_dims(leaf.dims())
        );
    };
    if meta.grad_fn.is_some() {
        bail!(
            op,
            "the tensor of shape {} is not a leaf (it was made by {})",
            fmt_dims(leaf.dims()),
            leaf.grad_fn()
                .map(|n| n.name().to_string())
                .unwrap_or_default()
        );
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    registry().push(Registered {
        id,
        meta: Arc::downgrade(meta),
        f: Arc::new(f),
    });
    COUNT.fetch_add(1, Ordering::SeqCst);
    Ok(HookHandle { id })
}

/// Queues `f` to run when the backward running on this thread has finished
/// (all gradients delivered, before `backward()` returns). An error outside
/// a backward.
pub fn queue_callback(f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    QUEUE.with(|q| match q.borrow_mut().as_mut() {
        Some(v) => {
            v.push(Box::new(f));
            Ok(())
        }
        None => Err(kiln_ir::Error::op(
            "queue_callback",
            "no backward is running on this thread",
        )),
    })
}

type Key = *const AutogradMeta;

/// How many gradient deliveries each hooked leaf expects from this backward.
pub(super) fn pending_counts(roots: &[&Tensor], hooked: &HashSet<Key>) -> HashMap<Key, usize> {
    let mut counts: HashMap<Key, usize> = HashMap::new();
    let mut seen: HashSet<*const Node> = HashSet::new();
    let mut stack: Vec<Arc<Node>> = vec![];
    for r in roots {
        match r.grad_fn() {
            Some(n) => {
                if seen.insert(Arc::as_ptr(&n)) {
                    stack.push(n);
                }
            }
            None => {
                if let Some(m) = &r.autograd {
                    *counts.entry(Arc::as_ptr(m)).or_default() += 1;
                }
            }
        }
    }
    while let Some(n) = stack.pop() {
        for inp in &n.inputs {
            match &inp.edge {
                Some(Edge::Leaf(m)) => *counts.entry(Arc::as_ptr(m)).or_default() += 1,
                Some(Edge::Node(m)) => {
                    if seen.insert(Arc::as_ptr(m)) {
                        stack.push(m.clone());
                    }
                }
                None => {}
            }
        }
    }
    counts.retain(|k, _| hooked.contains(k));
    counts
}

/// Runs one backward (`run`, handed the leaf sink to use) with the hooks:
/// `accumulate` stores each leaf gradient, then a leaf whose last gradient
/// arrived fires its hooks; the queued callbacks run at the end.
pub(crate) fn around_backward(
    roots: &[&Tensor],
    accumulate: &mut dyn FnMut(&Arc<AutogradMeta>, Tensor) -> Result<()>,
    run: impl FnOnce(&mut dyn FnMut(&Arc<AutogradMeta>, Tensor) -> Result<()>) -> Result<()>,
) -> Result<()> {
    let outermost = QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let first = q.is_none();
        if first {
            *q = Some(vec![]);
        }
        first
    });
    let result = if COUNT.load(Ordering::SeqCst) == 0 {
        run(accumulate)
    } else {
        let hooks: Vec<(Key, Arc<HookFn>)> = registry()
            .iter()
            .filter_map(|h| h.meta.upgrade().map(|m| (Arc::as_ptr(&m), h.f.clone())))
            .collect();
        let hooked: HashSet<Key> = hooks.iter().map(|(k, _)| *k).collect();
        let mut pending = pending_counts(roots, &hooked);
        run(&mut |m, g| {
            accumulate(m, g)?;
            let k = Arc::as_ptr(m);
            if let Some(c) = pending.get_mut(&k) {
                *c -= 1;
                if *c == 0 {
                    for (hk, f) in &hooks {
                        if *hk == k {
                            f()?;
                        }
                    }
                }
            }
            Ok(())
        })
    };
    if !outermost {
        return result;
    }
    let queued = QUEUE.with(|q| q.borrow_mut().take()).unwrap_or_default();
    result?;
    // A callback may queue another (it runs inside this backward's end).
    let mut queued = queued;
    while !queued.is_empty() {
        QUEUE.with(|q| *q.borrow_mut() = Some(vec![]));
        let mut first_err = None;
        for cb in queued {
            if let Err(e) = cb() {
                first_err.get_or_insert(e);
            }
        }
        queued = QUEUE.with(|q| q.borrow_mut().take()).unwrap_or_default();
        if let Some(e) = first_err {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DType;

    #[test]
    fn hooks_fire_once_per_leaf_after_its_last_gradient() {
        let a = Tensor::ones(&[2], DType::F32).requires_grad_(true);
        let b = Tensor::full(&[2], 2.0, DType::F32).requires_grad_(true);
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let (la, lb) = (log.clone(), log.clone());
        let (ac, bc) = (a.clone(), b.clone());
        let _ha = register_post_accumulate_grad_hook(&a, move || {
            la.lock()
                .unwrap()
                .push(format!("a {:?}", ac.grad().unwrap().to_f64_vec()));
            Ok(())
        })
        .unwrap();
        let hb = register_post_accumulate_grad_hook(&b, move || {
            lb.lock()
                .unwrap()
                .push(format!("b {:?}", bc.grad().unwrap().to_f64_vec()));
            Ok(())
        })
        .unwrap();
        // a is used twice: its hook sees the full gradient 2a + b = [4, 4]
        let y = (&(&a * &a) + &(&a * &b)).sum(None, false).unwrap();
        let done = log.clone();
        y.grad_fn().unwrap(); // recorded
        y.backward().unwrap();
        let got = done.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.contains(&"a [4.0, 4.0]".to_string()), "{got:?}");
        assert!(got.contains(&"b [1.0, 1.0]".to_string()), "{got:?}");
        hb.remove();
        log.lock().unwrap().clear();
        a.set_grad(None);
        let y = (&a * &b).sum(None, false).unwrap();
        y.backward().unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["a [2.0, 2.0]".to_string()]);
    }

    #[test]
    fn queued_callbacks_run_at_the_end_of_backward() {
        let a = Tensor::ones(&[2], DType::F32).requires_grad_(true);
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let ac = a.clone();
        let _h = register_post_accumulate_grad_hook(&a, move || {
            let (s, ac) = (s.clone(), ac.clone());
            queue_callback(move || {
                *s.lock().unwrap() = Some(ac.grad().unwrap().to_f64_vec());
                Ok(())
            })
        })
        .unwrap();
        (&a * 3.0).sum(None, false).unwrap().backward().unwrap();
        assert_eq!(*seen.lock().unwrap(), Some(vec![3.0, 3.0]));
        let e = queue_callback(|| Ok(())).unwrap_err().to_string();
        assert!(e.contains("no backward is running"), "{e}");
        let e = register_post_accumulate_grad_hook(&(&a * 2.0), || Ok(()))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a leaf"), "{e}");
    }
}
