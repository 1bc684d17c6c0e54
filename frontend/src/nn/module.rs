//! The `Module` trait: parameters, buffers and children by name, train/eval
//! mode, and `state_dict` / `load_state_dict` with PyTorch's key names.

use crate::autograd::no_grad;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Error, Result};
use kiln_runtime::Device;
use std::collections::BTreeMap;

/// One registered member of a module, as [`Module::visit`] reports it.
pub enum Entry<'a> {
    Param(&'a str, &'a Tensor),
    Buffer(&'a str, &'a Tensor),
    /// A non-persistent buffer (`register_buffer(.., persistent=False)`):
    /// moved with the module, left out of the `state_dict`.
    TransientBuffer(&'a str, &'a Tensor),
    Child(&'a str, &'a dyn Module),
}

/// One registered member of a module with write access, as
/// [`Module::visit_mut`] reports it (for [`ModuleExt::to_device`], which
/// replaces tensors rather than writing into them).
pub enum EntryMut<'a> {
    Param(&'a str, &'a mut Tensor),
    Buffer(&'a str, &'a mut Tensor),
    TransientBuffer(&'a str, &'a mut Tensor),
    Child(&'a str, &'a mut dyn Module),
}

/// A layer or a model, like `torch.nn.Module`.
///
/// A module reports what it owns through [`Module::visit`] — so containers
/// register their children and no parameter can hide in a plain `Vec` — and
/// everything else (names, `state_dict`, `train`/`eval`, `zero_grad`) is
/// derived from that one method.
pub trait Module: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Several inputs, some of them optional (masks, initial states), to
    /// several outputs: `model(ids, attention_mask)`, `lstm(x, (h0, c0))`
    /// returning `(output, h, c)`. `None` stands for an argument left out.
    ///
    /// The default takes exactly one input and calls [`Module::forward`];
    /// modules with more inputs or outputs override it.
    ///
    /// ```
    /// use kiln_frontend::nn::{Linear, Module};
    /// use kiln_frontend::{DType, Tensor};
    /// let l = Linear::new(3, 2, true).unwrap();
    /// let x = Tensor::zeros(&[4, 3], DType::F32);
    /// assert_eq!(l.forward_many(&[Some(&x)]).unwrap()[0].dims(), &[4, 2]);
    /// assert!(l.forward_many(&[Some(&x), None]).is_err());
    /// ```
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(x)] => Ok(vec![self.forward(x)?]),
            _ => bail!(
                "forward_many",
                "{} takes one input, got {} ({} given): call forward, or override \
                 Module::forward_many",
                self.describe(),
                inputs.len(),
                inputs.iter().filter(|x| x.is_some()).count()
            ),
        }
    }

    /// Calls `f` for each own parameter, buffer and child, in registration order.
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>));

    /// [`Module::visit`] with write access: the same entries, in the same order.
    ///
    /// A module that owns no parameter, buffer or child can keep this empty
    /// default; one that owns any must report them, or
    /// [`ModuleExt::to_device`] fails naming the tensors it could not reach.
    fn visit_mut(&mut self, _f: &mut dyn FnMut(EntryMut<'_>)) {}

    /// Sets this module's own mode (BatchNorm, Dropout override it); children
    /// are handled by [`ModuleExt::train`].
    fn set_own_training(&self, _on: bool) {}

    /// Whether the module is in training mode: its own flag if it tracks
    /// one ([`super::Training`], which `#[derive(Module)]` wires up), else
    /// whether all its children are (so a container follows `train()` /
    /// `eval()` without a flag of its own), else true.
    fn is_training(&self) -> bool {
        let mut all = true;
        self.visit(&mut |e| {
            if let Entry::Child(_, c) = e {
                all &= c.is_training()
            }
        });
        all
    }

    /// `Linear(in_features=64, out_features=32, bias=True)`, as PyTorch prints it.
    fn describe(&self) -> String;

    /// This module as a BatchNorm layer, if it is one (what
    /// `distributed::convert_sync_batchnorm` looks for).
    fn as_batch_norm(&self) -> Option<&super::BatchNorm> {
        None
    }

    /// This module as an LSTM layer, if it is one (what
    /// `quantization::quantize_dynamic` swaps for `QuantType::Lstm`).
    fn as_lstm(&self) -> Option<&super::LSTM> {
        None
    }
}

/// What `load_state_dict` found besides matching keys.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoadReport {
    pub missing: Vec<String>,
    pub unexpected: Vec<String>,
    /// key, expected shape, shape in the state dict
    pub mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
}

/// The derived API of every module.
pub trait ModuleExt: Module {
    /// `named_parameters()`: `0.weight`, `0.bias`, `2.weight`, ...
    ///
    /// A tensor registered twice (weight tying: GPT-2's `lm_head.weight` is
    /// `transformer.wte.weight`) is listed once, under its first name, as
    /// PyTorch's `remove_duplicate=True` does, so an optimizer steps it
    /// once. `state_dict()` keeps both keys.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = vec![];
        walk(self.as_dyn(), "", &mut |name, e| {
            if let Entry::Param(_, t) = e {
                if !out.iter().any(|(_, o)| o.is_same(t)) {
                    out.push((name, t.clone()))
                }
            }
        });
        out
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Buffers, persistent or not (`named_buffers()`).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        walk(self.as_dyn(), "", &mut |name, e| {
            if let Entry::Buffer(_, t) | Entry::TransientBuffer(_, t) = e {
                out.push((name, t.clone()))
            }
        });
        out
    }

    /// Parameters and buffers under PyTorch's names, in PyTorch's order.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        walk(self.as_dyn(), "", &mut |name, e| match e {
            Entry::Param(_, t) | Entry::Buffer(_, t) => out.push((name, t.clone())),
            Entry::TransientBuffer(..) | Entry::Child(..) => {}
        });
        out
    }

    /// Copies matching entries of `sd` into the module's tensors (in place, so
    /// optimizers holding them see the new values). Strict loading fails on
    /// any missing or unexpected key or shape mismatch and lists them all;
    /// non-strict loading returns them.
    fn load_state_dict(&self, sd: &[(String, Tensor)], strict: bool) -> Result<LoadReport> {
        let given: BTreeMap<&str, &Tensor> = sd.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let own = self.state_dict();
        let mut report = LoadReport::default();
        for (k, t) in &own {
            match given.get(k.as_str()) {
                None => report.missing.push(k.clone()),
                Some(src) if src.dims() != t.dims() => {
                    report
                        .mismatched
                        .push((k.clone(), t.dims().to_vec(), src.dims().to_vec()))
                }
                Some(_) => {}
            }
        }
        let own_keys: std::collections::BTreeSet<&str> =
            own.iter().map(|(k, _)| k.as_str()).collect();
        report.unexpected = sd
            .iter()
            .filter(|(k, _)| !own_keys.contains(k.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        if !report.mismatched.is_empty()
            || (strict && (!report.missing.is_empty() || !report.unexpected.is_empty()))
        {
            let mut msg = vec![];
            if !report.missing.is_empty() {
                msg.push(format!("missing keys: {}", report.missing.join(", ")));
            }
            if !report.unexpected.is_empty() {
                msg.push(format!("unexpected keys: {}", report.unexpected.join(", ")));
            }
            for (k, want, got) in &report.mismatched {
                msg.push(format!(
                    "size mismatch for {k}: the state dict has {}, the module has {}",
                    fmt_dims(got),
                    fmt_dims(want)
                ));
            }
            bail!("load_state_dict", "{}", msg.join("; "));
        }
        let _g = no_grad();
        for (k, t) in &own {
            if let Some(src) = given.get(k.as_str()) {
                t.copy_(src)?;
            }
        }
        Ok(report)
    }

    /// `model.to(device)`: moves every parameter and buffer to `device`.
    ///
    /// Each tensor not already there is replaced by a copy on `device` that
    /// is again a leaf with the same `requires_grad` (and its `.grad`, if it
    /// has one, moves along), so the moved parameters train as the old ones
    /// did. As PyTorch's documentation asks, move the model *before* building
    /// its optimizer or compiling it: those hold handles to the tensors, and
    /// the old handles keep pointing at the old (host) copies. The borrow
    /// checker enforces this for `compile(&model)`.
    ///
    /// ```
    /// use kiln_frontend::nn::{Linear, ModuleExt};
    /// use kiln_runtime::Device;
    /// let mut l = Linear::new(4, 2, true).unwrap();
    /// l.to_device(Device::Cpu).unwrap(); // already there: nothing moves
    /// assert!(l.parameters().iter().all(|p| p.device() == Device::Cpu && p.requires_grad()));
    /// ```
    fn to_device(&mut self, device: Device) -> Result<()> {
        replace_tensors(
            self.as_dyn_mut(),
            |t| t.device() != device,
            |name, t| {
                replaced_leaf(t, |x| x.to_device(device)).map_err(|e| {
                    Error::op(
                        "to_device",
                        format!("moving {name} from {} to {device}: {e}", t.device()),
                    )
                })
            },
        )?;
        // A module whose `visit_mut` does not report its tensors leaves them behind.
        let left: Vec<String> = self
            .named_parameters()
            .into_iter()
            .chain(self.named_buffers())
            .filter(|(_, t)| t.device() != device)
            .map(|(k, t)| format!("{k} (on {})", t.device()))
            .collect();
        if !left.is_empty() {
            bail!(
                "to_device",
                "{} stayed behind when moving to {device}: the module owning them does not \
                 report them through Module::visit_mut",
                left.join(", ")
            );
        }
        Ok(())
    }

    /// `model.to(dtype)`: every floating-point parameter and buffer becomes
    /// `dtype` (integer and bool tensors, like BatchNorm's
    /// `num_batches_tracked`, stay as they are), again a leaf with the same
    /// `requires_grad`. Build the optimizer afterwards, as with
    /// [`ModuleExt::to_device`].
    ///
    /// ```
    /// use kiln_frontend::nn::{Linear, ModuleExt};
    /// use kiln_frontend::DType;
    /// let mut l = Linear::new(4, 2, true).unwrap();
    /// l.to_dtype(DType::BF16).unwrap();
    /// assert!(l.parameters().iter().all(|p| p.dtype() == DType::BF16 && p.requires_grad()));
    /// ```
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            bail!("to_dtype", "{dtype:?} is not a floating-point dtype (model.to(dtype) converts parameters and buffers to a float type)");
        }
        replace_tensors(
            self.as_dyn_mut(),
            |t| t.dtype().is_float() && t.dtype() != dtype,
            |name, t| {
                replaced_leaf(t, |x| x.to_dtype(dtype)).map_err(|e| {
                    Error::op(
                        "to_dtype",
                        format!("converting {name} from {:?} to {dtype:?}: {e}", t.dtype()),
                    )
                })
            },
        )
    }

    /// `module(x)`: `forward` between the module's forward hooks (see
    /// [`super::hooks`]); the standard layers fire their hooks from
    /// `forward` itself, so for them both are the same.
    fn call(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self.as_dyn(), x, |x| self.forward(x))
    }

    /// `train()`: this module and every descendant.
    fn train(&self) {
        set_training(self.as_dyn(), true)
    }

    /// `eval()`: this module and every descendant.
    fn eval(&self) {
        set_training(self.as_dyn(), false)
    }

    /// Clears every parameter's `.grad` (PyTorch's default `set_to_none=True`).
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.set_grad(None);
        }
    }

    /// The `str(model)` form: `Sequential(\n  (0): Linear(...)\n)`.
    fn to_string_tree(&self) -> String {
        tree(self.as_dyn(), 0)
    }

    fn as_dyn(&self) -> &dyn Module;

    fn as_dyn_mut(&mut self) -> &mut dyn Module;
}

impl<M: Module> ModuleExt for M {
    fn as_dyn(&self) -> &dyn Module {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Module {
        self
    }
}

impl<'m> ModuleExt for dyn Module + 'm {
    fn as_dyn(&self) -> &dyn Module {
        self
    }
    fn as_dyn_mut(&mut self) -> &mut dyn Module {
        self
    }
}

/// Replaces every parameter and buffer `t` for which `wanted(t)` holds by
/// `make(name, t)`, under `no_grad`; stops at the first error. A tensor
/// registered twice (tied weights) is made once and stays tied.
fn replace_tensors(
    m: &mut dyn Module,
    wanted: impl Fn(&Tensor) -> bool,
    make: impl Fn(&str, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let _g = no_grad();
    let mut first_err: Option<Error> = None;
    let mut done: Vec<(Tensor, Tensor)> = vec![];
    walk_mut(m, "", &mut |name, t| {
        if first_err.is_some() || !wanted(t) {
            return;
        }
        if let Some((_, new)) = done.iter().find(|(old, _)| old.is_same(t)) {
            *t = new.clone();
            return;
        }
        match make(name, t) {
            Ok(new) => {
                done.push((t.clone(), new.clone()));
                *t = new
            }
            Err(e) => first_err = Some(e),
        }
    });
    first_err.map_or(Ok(()), Err)
}

/// `f(t)` as a fresh leaf: same `requires_grad`, `.grad` carried over through
/// `f` too (PyTorch's `param.data = param.data.to(..)` keeps both).
fn replaced_leaf(t: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let out = f(&t.detach())?;
    if !t.requires_grad() {
        return Ok(out);
    }
    let out = out.requires_grad_(true);
    if let Some(g) = t.grad() {
        out.set_grad(Some(f(&g)?));
    }
    Ok(out)
}

/// Depth-first walk with dotted names: own entries first, then each child's.
fn walk<'a>(m: &'a dyn Module, prefix: &str, f: &mut dyn FnMut(String, Entry<'a>)) {
    let mut children: Vec<(String, &'a dyn Module)> = vec![];
    m.visit(&mut |e| match e {
        Entry::Child(n, c) => children.push((n.to_string(), c)),
        Entry::Param(n, t) => f(format!("{prefix}{n}"), Entry::Param(n, t)),
        Entry::Buffer(n, t) => f(format!("{prefix}{n}"), Entry::Buffer(n, t)),
        Entry::TransientBuffer(n, t) => f(format!("{prefix}{n}"), Entry::TransientBuffer(n, t)),
    });
    for (n, c) in children {
        walk(c, &format!("{prefix}{n}."), f);
    }
}

/// Calls `f` with the dotted name of every parameter and buffer, with write
/// access (depth first, in `visit_mut` order).
fn walk_mut(m: &mut dyn Module, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
    m.visit_mut(&mut |e| match e {
        EntryMut::Param(n, t) | EntryMut::Buffer(n, t) | EntryMut::TransientBuffer(n, t) => {
            f(&format!("{prefix}{n}"), t)
        }
        EntryMut::Child(n, c) => walk_mut(c, &format!("{prefix}{n}."), f),
    });
}

fn set_training(m: &dyn Module, on: bool) {
    m.set_own_training(on);
    let mut children: Vec<&dyn Module> = vec![];
    m.visit(&mut |e| {
        if let Entry::Child(_, c) = e {
            children.push(c)
        }
    });
    for c in children {
        set_training(c, on);
    }
}

fn tree(m: &dyn Module, depth: usize) -> String {
    let mut children: Vec<(String, &dyn Module)> = vec![];
    m.visit(&mut |e| {
        if let Entry::Child(n, c) = e {
            children.push((n.to_string(), c))
        }
    });
    if children.is_empty() {
        return m.describe();
    }
    let pad = "  ".repeat(depth + 1);
    let mut s = format!("{}(\n", m.describe());
    for (n, c) in children {
        s += &format!("{pad}({n}): {}\n", tree(c, depth + 1));
    }
    s + &"  ".repeat(depth) + ")"
}
