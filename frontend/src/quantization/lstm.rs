//! `QuantizedLstm`: PyTorch's `torch.ao.nn.quantized.dynamic.LSTM` with the
//! fbgemm engine: each layer and direction's `weight_ih` and `weight_hh`
//! quantized to int8 (symmetric, per tensor or per output channel), their
//! float biases kept; at each call the whole input sequence is quantized
//! once for its input product (the CPU path of ATen's `FullLayer`
//! precomputes `W_ih x` for every step), and each step's `h` for its
//! hidden product, both over their whole range with `reduce_range`. The
//! gate math stays float, as in PyTorch.

use super::{QScheme, QuantizedLinear};
use crate::nn::recurrent::step::Projections;
use crate::nn::{Entry, Module, LSTM};
use crate::Tensor;
use kiln_ir::{bail, Result};
use std::sync::Arc;

/// A dynamically quantized LSTM; it borrows the float layer for its
/// structure (sizes, layers, directions, `batch_first`).
///
/// ```
/// use kiln_frontend::nn::{Module, RnnOptions, LSTM};
/// use kiln_frontend::quantization::{QScheme, QuantizedLstm};
/// let lstm = LSTM::new(8, 16, RnnOptions { batch_first: true, ..RnnOptions::default() }).unwrap();
/// let q = QuantizedLstm::from_float(&lstm, QScheme::PerTensor).unwrap();
/// assert_eq!(q.describe(), "DynamicQuantizedLSTM(8, 16, batch_first=True)");
/// let x = kiln_frontend::Tensor::ones(&[3, 6, 8], kiln_frontend::DType::F32);
/// assert_eq!(q.forward(&x).unwrap().dims(), &[3, 6, 16]);
/// ```
pub struct QuantizedLstm<'m> {
    float: &'m LSTM,
    /// Per layer and direction: (`ih`, `hh`) and their child names.
    cells: Arc<Vec<QuantizedCell>>,
}

struct QuantizedCell {
    ih: QuantizedLinear,
    hh: QuantizedLinear,
    names: [String; 2],
}

impl<'m> QuantizedLstm<'m> {
    pub fn from_float(lstm: &'m LSTM, scheme: QScheme) -> Result<QuantizedLstm<'m>> {
        if lstm.0.proj_size() > 0 {
            bail!(
                "quantize_dynamic",
                "{}: an LSTM with proj_size is not supported by dynamic quantization",
                lstm.describe()
            );
        }
        let cells = lstm
            .0
            .cells
            .iter()
            .map(|c| {
                Ok(QuantizedCell {
                    ih: QuantizedLinear::from_float(&c.weight_ih, c.bias_ih.as_ref(), scheme)?,
                    hh: QuantizedLinear::from_float(&c.weight_hh, c.bias_hh.as_ref(), scheme)?,
                    names: [format!("ih{}", c.suffix()), format!("hh{}", c.suffix())],
                })
            })
            .collect::<Result<_>>()?;
        Ok(QuantizedLstm {
            float: lstm,
            cells: Arc::new(cells),
        })
    }

    /// This LSTM's forward as a replacement for the float LSTM's own (what
    /// `quantize_dynamic` installs inside a custom module): it owns the
    /// packed weights and runs on the LSTM it is called for, so it borrows
    /// nothing.
    pub(super) fn replacement(
        &self,
    ) -> impl Fn(&dyn Module, &Tensor) -> Result<Tensor> + Send + Sync + 'static {
        let cells = self.cells.clone();
        move |m, x| match m.as_lstm() {
            Some(lstm) => Ok(lstm
                .0
                .run_with(&[Some(x)], cells.as_slice())?
                .swap_remove(0)),
            None => bail!(
                "quantize_dynamic",
                "the LSTM replacement ran for {}",
                m.describe()
            ),
        }
    }
}

impl Projections for [QuantizedCell] {
    fn input(&self, idx: usize, x: &Tensor) -> Result<Tensor> {
        self[idx].ih.forward(&x.contiguous()?)
    }
    fn hidden(&self, idx: usize, h: &Tensor) -> Result<Tensor> {
        self[idx].hh.forward(&h.contiguous()?)
    }
    fn project(&self, _idx: usize, h: Tensor) -> Result<Tensor> {
        Ok(h)
    }
}

impl Module for QuantizedLstm<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_many(&[Some(x)])?.swap_remove(0))
    }
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        self.float.0.run_with(inputs, self.cells.as_slice())
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for c in self.cells.iter() {
            f(Entry::Child(&c.names[0], &c.ih));
            f(Entry::Child(&c.names[1], &c.hh));
        }
    }
    fn describe(&self) -> String {
        format!("DynamicQuantized{}", self.float.0.describe_layer())
    }
}
