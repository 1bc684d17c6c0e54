//! `quantize_dynamic` for any module tree: a module whose forward is the
//! user's own code (a struct holding a Linear, say) cannot be rebuilt around
//! a new layer, so its Linear and LSTM children are swapped in place, as
//! PyTorch swaps the attribute: each gets a forward replacement
//! ([`hooks::register_forward_replacement`]) that runs its quantized
//! counterpart. The replacements last as long as the returned tree; the
//! tree's `visit` shows the quantized layers' tensors (int8 weight, scales,
//! zero points) in place of the float ones, so `state_dict` has PyTorch's
//! keys.
//!
//! While the quantized tree lives, the float model computes through the
//! quantized layers too (it is the same module value, as with PyTorch's
//! `inplace=True`); dropping the tree makes it float again.

use super::{linear_parts, QScheme, QuantType, QuantizedLinear, QuantizedLstm};
use crate::nn::hooks::{self, HookHandle};
use crate::nn::{Entry, Module};
use crate::Tensor;
use kiln_ir::Result;
use std::sync::Arc;

/// A child of a [`SwappedTree`] node: walked further, swapped, or left as is.
enum Child<'m> {
    Tree(SwappedTree<'m>),
    Quantized(Box<dyn Module + 'm>),
    Float(&'m dyn Module),
}

/// A quantized layer's forward, owning what it needs.
type Replacement = Box<dyn Fn(&dyn Module, &Tensor) -> Result<Tensor> + Send + Sync>;

/// A module of the float model with its swappable descendants swapped.
pub(super) struct SwappedTree<'m> {
    inner: &'m dyn Module,
    children: Vec<(&'m str, Child<'m>)>,
    /// The forward replacements installed for this node's direct children
    /// (removed when dropped).
    _swaps: Vec<HookHandle>,
}

/// Swaps every Linear (and, when asked, LSTM) below `m`; `Ok(None)` when
/// there is none to swap.
pub(super) fn swap_tree<'m>(
    m: &'m dyn Module,
    scheme: QScheme,
    types: &[QuantType],
) -> Result<Option<SwappedTree<'m>>> {
    let mut found: Vec<(&'m str, &'m dyn Module)> = vec![];
    m.visit(&mut |e| {
        if let Entry::Child(name, c) = e {
            found.push((name, c));
        }
    });
    let (mut children, mut swaps, mut any) = (vec![], vec![], false);
    for (name, c) in found {
        match quantized(c, scheme, types)? {
            Some((q, run)) => {
                swaps.push(hooks::register_forward_replacement(c, run));
                children.push((name, Child::Quantized(q)));
                any = true;
            }
            None => match swap_tree(c, scheme, types)? {
                Some(t) => {
                    children.push((name, Child::Tree(t)));
                    any = true;
                }
                None => children.push((name, Child::Float(c))),
            },
        }
    }
    Ok(any.then_some(SwappedTree {
        inner: m,
        children,
        _swaps: swaps,
    }))
}

/// `m`'s quantized counterpart if it is a layer of `types`, and the
/// forward that replaces `m`'s own.
fn quantized<'m>(
    m: &'m dyn Module,
    scheme: QScheme,
    types: &[QuantType],
) -> Result<Option<(Box<dyn Module + 'm>, Replacement)>> {
    if types.contains(&QuantType::Linear) {
        if let Some((w, b)) = linear_parts(m) {
            let q = Arc::new(QuantizedLinear::from_float(&w, b.as_ref(), scheme)?);
            let run = q.clone();
            let replacement: Replacement = Box::new(move |_, x| run.forward(x));
            return Ok(Some((Box::new(Shared(q)), replacement)));
        }
    }
    if let (Some(lstm), true) = (m.as_lstm(), types.contains(&QuantType::Lstm)) {
        let q = QuantizedLstm::from_float(lstm, scheme)?;
        let replacement: Replacement = Box::new(q.replacement());
        return Ok(Some((Box::new(q), replacement)));
    }
    Ok(None)
}

/// A quantized Linear shared with its forward replacement.
struct Shared(Arc<QuantizedLinear>);

impl Module for Shared {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        self.0.visit(f)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

impl Module for SwappedTree<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.forward(x)
    }
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        self.inner.forward_many(inputs)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        // the float module's own entries, in its order, with our children
        self.inner.visit(&mut |e| match e {
            Entry::Child(name, c) => match self.children.iter().find(|(n, _)| *n == name) {
                Some((_, Child::Tree(t))) => f(Entry::Child(name, t)),
                Some((_, Child::Float(m))) => f(Entry::Child(name, *m)),
                Some((_, Child::Quantized(q))) => f(Entry::Child(name, q.as_ref())),
                None => f(Entry::Child(name, c)),
            },
            other => f(other),
        })
    }
    fn set_own_training(&self, on: bool) {
        self.inner.set_own_training(on)
    }
    fn is_training(&self) -> bool {
        self.inner.is_training()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
