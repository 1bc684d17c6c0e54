//! `QuantizedLinear`: PyTorch's `torch.ao.nn.quantized.dynamic.Linear`
//! (optionally with a fused ReLU, as `LinearReLU`): int8 weights packed once,
//! activations quantized per call.

use crate::functional as F;
use crate::nn::{Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::externs::qgemm::{self, Isa};

/// A dynamically quantized Linear layer.
///
/// Its state is four tensors (all buffers: nothing here trains):
/// `weight` (i8 `[out, in]`), `weight_scale` (f32, 1 or `out` values: per
/// tensor or per channel), `weight_zero_point` (i64, all 0: symmetric) and
/// `bias` (f32 `[out]`, if any). The forward is one op,
/// [`F::quantized_linear`], so a quantized model compiles into one graph;
/// the packed form the kernel reads is cached by the weight's storage and
/// version, and rebuilt when it changes (e.g. `load_state_dict`).
///
/// ```
/// use kiln_frontend::nn::{Linear, Module};
/// use kiln_frontend::quantization::{QScheme, QuantizedLinear};
/// let l = Linear::new(8, 4, true).unwrap();
/// let q = QuantizedLinear::from_float(&l.weight, l.bias.as_ref(), QScheme::PerChannel).unwrap();
/// let x = kiln_frontend::Tensor::ones(&[2, 8], kiln_frontend::DType::F32);
/// assert_eq!(q.forward(&x).unwrap().dims(), &[2, 4]);
/// ```
pub struct QuantizedLinear {
    pub weight: Tensor,
    pub weight_scale: Tensor,
    pub weight_zero_point: Tensor,
    pub bias: Option<Tensor>,
    /// Apply ReLU in the GEMM's epilogue (a fused `Linear` + `ReLU`).
    pub relu: bool,
}

use super::QScheme;

impl QuantizedLinear {
    /// Quantizes a float Linear's `weight` (`[out, in]`) and keeps its bias.
    pub fn from_float(
        weight: &Tensor,
        bias: Option<&Tensor>,
        scheme: QScheme,
    ) -> Result<QuantizedLinear> {
        let op = "quantize_dynamic";
        if weight.rank() != 2 || weight.dtype() != DType::F32 {
            bail!(
                op,
                "a Linear weight must be f32 [out, in], got {} {}",
                weight.dtype(),
                fmt_dims(weight.dims())
            );
        }
        let (n, k) = (weight.dims()[0], weight.dims()[1]);
        let w = weight.detach().to_vec::<f32>()?;
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            bail!(
                op,
                "weight element {i} is {} (only finite weights quantize)",
                w[i]
            );
        }
        let (wq, scales) =
            qgemm::quantize_weight_symmetric(&w, n, k, scheme == QScheme::PerChannel);
        let zps = vec![0i64; scales.len()];
        let bias = match bias {
            Some(b) => {
                if b.dims() != [n] || b.dtype() != DType::F32 {
                    bail!(
                        op,
                        "bias must be f32 [{n}], got {} {}",
                        b.dtype(),
                        fmt_dims(b.dims())
                    );
                }
                Some(b.detach().copy()?)
            }
            None => None,
        };
        let nscale = scales.len();
        Ok(QuantizedLinear::from_parts(
            Tensor::from_vec(wq, &[n, k])?,
            Tensor::from_vec(scales, &[nscale])?,
            Tensor::from_vec(zps, &[nscale])?,
            bias,
            false,
        ))
    }

    /// A quantized Linear from its four tensors (as a state dict holds them);
    /// they are checked at each forward and packed at the first.
    pub fn from_parts(
        weight: Tensor,
        weight_scale: Tensor,
        weight_zero_point: Tensor,
        bias: Option<Tensor>,
        relu: bool,
    ) -> QuantizedLinear {
        QuantizedLinear {
            weight,
            weight_scale,
            weight_zero_point,
            bias,
            relu,
        }
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
    /// Per channel when there is one scale per output feature (and more than one feature).
    pub fn scheme(&self) -> QScheme {
        if self.weight_scale.numel() > 1 {
            QScheme::PerChannel
        } else {
            QScheme::PerTensor
        }
    }

    /// PyTorch's dynamic Linear has symmetric weights only: every weight
    /// zero point must be 0 (the kernel has no weight offset), one per scale.
    fn check_zero_points(&self) -> Result<()> {
        let op = "quantized_linear";
        if self.weight_zero_point.dims() != self.weight_scale.dims()
            || self.weight_zero_point.dtype() != DType::I64
        {
            bail!(
                op,
                "weight_zero_point must be i64 {}, got {} {}",
                fmt_dims(self.weight_scale.dims()),
                self.weight_zero_point.dtype(),
                fmt_dims(self.weight_zero_point.dims())
            );
        }
        let zps = self.weight_zero_point.detach().to_vec::<i64>()?;
        if let Some(z) = zps.iter().find(|z| **z != 0) {
            bail!(
                op,
                "weight zero point {z}: only symmetric int8 weights (zero point 0) are supported"
            );
        }
        Ok(())
    }

    /// The forward with an explicit kernel choice (tests compare them); it
    /// runs eagerly, never recording a graph node.
    pub fn forward_with(&self, x: &Tensor, isa: Isa) -> Result<Tensor> {
        self.check_zero_points()?;
        let (w, s, b) = (&self.weight, &self.weight_scale, self.bias.as_ref());
        F::quantized_linear_with(x, w, s, b, self.relu, isa, None)
    }
}

impl Module for QuantizedLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check_zero_points()?;
        let (w, s, b) = (&self.weight, &self.weight_scale, self.bias.as_ref());
        F::quantized_linear(x, w, s, b, self.relu)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Buffer("weight", &self.weight));
        f(Entry::Buffer("weight_scale", &self.weight_scale));
        f(Entry::Buffer("weight_zero_point", &self.weight_zero_point));
        if let Some(b) = &self.bias {
            f(Entry::Buffer("bias", b));
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Buffer("weight", &mut self.weight));
        f(EntryMut::Buffer("weight_scale", &mut self.weight_scale));
        f(EntryMut::Buffer(
            "weight_zero_point",
            &mut self.weight_zero_point,
        ));
        if let Some(b) = &mut self.bias {
            f(EntryMut::Buffer("bias", b));
        }
    }
    fn describe(&self) -> String {
        let scheme = match self.scheme() {
            QScheme::PerTensor => "torch.per_tensor_symmetric",
            QScheme::PerChannel => "torch.per_channel_symmetric",
        };
        format!(
            "DynamicQuantized{}(in_features={}, out_features={}, dtype=torch.qint8, qscheme={scheme})",
            if self.relu { "LinearReLU" } else { "Linear" },
            self.in_features(),
            self.out_features()
        )
    }
}
