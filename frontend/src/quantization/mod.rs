//! Dynamic int8 quantization, as `torch.ao.quantization.quantize_dynamic`
//! with the fbgemm (x86) engine computes it.
//!
//! [`quantize_dynamic`] swaps each Linear of a model for a
//! [`QuantizedLinear`]: symmetric int8 weights (per tensor or per output
//! channel) packed once; at each call the input is quantized to uint8 over
//! its whole range with `reduce_range` (7 bits), multiplied in int32, and
//! scaled back to f32 with the bias added — all in one kernel pass
//! (`kiln_runtime::externs::qgemm`: AVX-512-VNNI, AVX2 or scalar, chosen at
//! run time). A Linear directly followed by a ReLU gets the ReLU in its
//! epilogue (PyTorch's `LinearReLU`).
//!
//! The float model is borrowed: layers that are not quantized run as they
//! are, sharing its tensors.
//!
//! ```
//! use kiln_frontend::nn::{Activation, Linear, Module, ModuleExt, Sequential};
//! use kiln_frontend::quantization::{quantize_dynamic, QScheme, QuantType};
//! let mlp = Sequential::new()
//!     .add(Linear::new(16, 32, true).unwrap())
//!     .add(Activation::relu())
//!     .add(Linear::new(32, 4, true).unwrap());
//! let q = quantize_dynamic(&mlp, &[QuantType::Linear], QScheme::PerTensor).unwrap();
//! let keys: Vec<String> = q.state_dict().into_iter().map(|(k, _)| k).collect();
//! assert_eq!(keys[..3], ["0.weight", "0.weight_scale", "0.weight_zero_point"]);
//! let x = kiln_frontend::Tensor::ones(&[3, 16], kiln_frontend::DType::F32);
//! assert_eq!(q.forward(&x).unwrap().dims(), &[3, 4]);
//! ```

mod linear;
mod lstm;
mod swap;
#[cfg(test)]
mod tests;

pub use kiln_runtime::externs::qgemm::Isa;
pub use linear::QuantizedLinear;
pub use lstm::QuantizedLstm;

use crate::nn::{Entry, Module};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// How weights are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QScheme {
    /// One scale for the whole weight (`default_dynamic_qconfig`).
    PerTensor,
    /// One scale per output channel (`per_channel_dynamic_qconfig`).
    PerChannel,
}

/// The layer types [`quantize_dynamic`] may swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    Linear,
    /// `nn.LSTM`, swapped for a [`QuantizedLstm`].
    Lstm,
}

/// A model with its chosen layers quantized; it borrows the float model.
pub struct QuantizedModel<'m> {
    root: Box<dyn Module + 'm>,
}

/// `quantize_dynamic(model, {Linear}, scheme)`: a copy of `model`'s structure
/// whose Linear layers are [`QuantizedLinear`]s.
///
/// Containers are rebuilt when they are `Sequential`s (their forward is a
/// chain, so swapping a child keeps it, and a Linear followed by a ReLU
/// fuses). Any other module (a struct with its own forward) keeps its code,
/// and the Linear/LSTM layers below it are swapped in place through forward
/// replacements for as long as the quantized model lives (PyTorch's
/// `inplace=True`; see `swap.rs`): its `state_dict` has the quantized keys.
pub fn quantize_dynamic<'m>(
    model: &'m dyn Module,
    types: &[QuantType],
    scheme: QScheme,
) -> Result<QuantizedModel<'m>> {
    if types.is_empty() {
        bail!(
            "quantize_dynamic",
            "no layer type to quantize was given (QuantType::Linear, QuantType::Lstm)"
        );
    }
    Ok(QuantizedModel {
        root: rebuild(model, "", scheme, types)?,
    })
}

impl<'m> QuantizedModel<'m> {
    /// How many Linear layers were quantized.
    pub fn quantized_layers(&self) -> usize {
        let mut n = 0;
        count(self.root.as_ref(), &mut n);
        n
    }
}

fn count(m: &dyn Module, n: &mut usize) {
    if m.describe().starts_with("DynamicQuantized") {
        // a quantized LSTM's children are its own int8 products
        *n += 1;
        return;
    }
    m.visit(&mut |e| {
        if let Entry::Child(_, c) = e {
            count(c, n)
        }
    });
}

/// The parts of a float Linear (recognised by its `describe()` and tensors).
fn linear_parts(m: &dyn Module) -> Option<(Tensor, Option<Tensor>)> {
    if !m.describe().starts_with("Linear(") {
        return None;
    }
    let (mut w, mut b) = (None, None);
    m.visit(&mut |e| match e {
        Entry::Param("weight", t) => w = Some(t.clone()),
        Entry::Param("bias", t) => b = Some(t.clone()),
        _ => {}
    });
    Some((w?, b))
}

fn has_lstm(m: &dyn Module) -> bool {
    let mut found = m.as_lstm().is_some();
    m.visit(&mut |e| {
        if let Entry::Child(_, c) = e {
            found |= has_lstm(c);
        }
    });
    found
}

fn rebuild<'m>(
    m: &'m dyn Module,
    path: &str,
    scheme: QScheme,
    types: &[QuantType],
) -> Result<Box<dyn Module + 'm>> {
    let linear = types.contains(&QuantType::Linear);
    if let (Some(lstm), true) = (m.as_lstm(), types.contains(&QuantType::Lstm)) {
        return Ok(Box::new(QuantizedLstm::from_float(lstm, scheme)?));
    }
    if !linear && !has_lstm(m) {
        return Ok(Box::new(Borrowed(m)));
    }
    if let (Some((w, b)), true) = (linear_parts(m), linear) {
        return Ok(Box::new(QuantizedLinear::from_float(
            &w,
            b.as_ref(),
            scheme,
        )?));
    }
    if m.describe() == "Sequential" {
        let mut children: Vec<(&'m str, &'m dyn Module)> = vec![];
        m.visit(&mut |e| {
            if let Entry::Child(name, c) = e {
                children.push((name, c));
            }
        });
        let mut out: Vec<(String, Box<dyn Module + 'm>)> = vec![];
        let mut i = 0;
        while i < children.len() {
            let (name, c) = children[i];
            let child_path = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            let next_is_relu = children
                .get(i + 1)
                .is_some_and(|(_, n)| n.describe() == "ReLU()");
            match linear_parts(c).filter(|_| linear) {
                Some((w, b)) if next_is_relu => {
                    // Linear + ReLU: the ReLU runs in the GEMM epilogue.
                    let mut q = QuantizedLinear::from_float(&w, b.as_ref(), scheme)?;
                    q.relu = true;
                    out.push((name.to_string(), Box::new(q)));
                    let relu_name = children[i + 1].0;
                    out.push((
                        relu_name.to_string(),
                        Box::new(FusedAway { into: child_path }),
                    ));
                    i += 2;
                }
                _ => {
                    out.push((name.to_string(), rebuild(c, &child_path, scheme, types)?));
                    i += 1;
                }
            }
        }
        return Ok(Box::new(QuantizedSequential { children: out }));
    }
    // any other module: its forward is its own code, so the layers below it
    // are swapped in place (see swap.rs)
    match swap::swap_tree(m, scheme, types)? {
        Some(tree) => Ok(Box::new(tree)),
        None => Ok(Box::new(Borrowed(m))),
    }
}

/// A `Sequential` rebuilt around quantized children.
struct QuantizedSequential<'m> {
    children: Vec<(String, Box<dyn Module + 'm>)>,
}

impl Module for QuantizedSequential<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for (_, c) in &self.children {
            y = c.forward(&y)?;
        }
        Ok(y)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, c) in &self.children {
            f(Entry::Child(n, c.as_ref()))
        }
    }
    fn describe(&self) -> String {
        "Sequential".into()
    }
}

/// A layer of the float model that stays float (shared, not copied).
struct Borrowed<'m>(&'m dyn Module);

impl Module for Borrowed<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        self.0.visit(f)
    }
    fn set_own_training(&self, on: bool) {
        self.0.set_own_training(on)
    }
    fn is_training(&self) -> bool {
        self.0.is_training()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// A ReLU that now runs inside the preceding quantized Linear.
struct FusedAway {
    into: String,
}

impl Module for FusedAway {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        format!("ReLU() [fused into `{}`]", self.into)
    }
}

impl Module for QuantizedModel<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.root.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        // The root's own entries, so names match the float model's.
        self.root.visit(f)
    }
    fn set_own_training(&self, on: bool) {
        self.root.set_own_training(on)
    }
    fn is_training(&self) -> bool {
        self.root.is_training()
    }
    fn describe(&self) -> String {
        self.root.describe()
    }
}
