//! `QuantizedLinear`: PyTorch's `torch.ao.nn.quantized.dynamic.Linear`
//! (optionally with a fused ReLU, as `LinearReLU`): int8 weights packed once,
//! activations quantized per call.

use crate::nn::{Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::externs::qgemm::{self, Isa, PackedWeights};
use std::sync::{Arc, Mutex};

/// A dynamically quantized Linear layer.
///
/// Its state is four tensors (all buffers: nothing here trains):
/// `weight` (i8 `[out, in]`), `weight_scale` (f32, 1 or `out` values: per
/// tensor or per channel), `weight_zero_point` (i64, all 0: symmetric) and
/// `bias` (f32 `[out]`, if any). The packed form the kernels read is
/// derived from them and rebuilt when one changes (e.g. `load_state_dict`).
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
    packed: Mutex<Option<Packed>>,
}

/// The kernel-ready form and the tensors it was made from.
struct Packed {
    from: Vec<(Tensor, u64)>,
    weights: Arc<PackedWeights>,
    scales: Arc<Vec<f32>>,
    bias: Option<Arc<Vec<f32>>>,
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
    /// they are checked and packed at the first forward.
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
            packed: Mutex::new(None),
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

    fn sources(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.weight, &self.weight_scale, &self.weight_zero_point];
        v.extend(self.bias.as_ref());
        v
    }

    /// The packed weights, packing (once per change of the state) if needed.
    fn packed(&self) -> Result<(Arc<PackedWeights>, Arc<Vec<f32>>, Option<Arc<Vec<f32>>>)> {
        let mut slot = self.packed.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = slot.as_ref().is_some_and(|p| {
            let now = self.sources();
            p.from.len() == now.len()
                && p.from
                    .iter()
                    .zip(&now)
                    .all(|((t, v), n)| t.shares_storage(n) && *v == n.version())
        });
        if !fresh {
            *slot = Some(self.pack()?);
        }
        let p = slot.as_ref().expect("packed just now");
        Ok((p.weights.clone(), p.scales.clone(), p.bias.clone()))
    }

    fn pack(&self) -> Result<Packed> {
        let op = "quantized_linear";
        let (n, k) = match self.weight.dims() {
            [n, k] if self.weight.dtype() == DType::I8 => (*n, *k),
            d => bail!(
                op,
                "weight must be i8 [out, in], got {} {}",
                self.weight.dtype(),
                fmt_dims(d)
            ),
        };
        let ns = self.weight_scale.numel();
        if self.weight_scale.dtype() != DType::F32
            || self.weight_scale.rank() != 1
            || !(ns == 1 || ns == n)
        {
            bail!(
                op,
                "weight_scale must be f32 [1] or [{n}], got {} {}",
                self.weight_scale.dtype(),
                fmt_dims(self.weight_scale.dims())
            );
        }
        let scales = self.weight_scale.to_vec::<f32>()?;
        if let Some(i) = scales.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            bail!(
                op,
                "weight_scale[{i}] is {} (scales must be finite and positive)",
                scales[i]
            );
        }
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
        if let Some(z) = self
            .weight_zero_point
            .to_vec::<i64>()?
            .iter()
            .find(|z| **z != 0)
        {
            bail!(
                op,
                "weight zero point {z}: only symmetric int8 weights (zero point 0) are supported"
            );
        }
        let bias = match &self.bias {
            Some(b) if b.dims() == [n] && b.dtype() == DType::F32 => {
                Some(Arc::new(b.to_vec::<f32>()?))
            }
            Some(b) => bail!(
                op,
                "bias must be f32 [{n}], got {} {}",
                b.dtype(),
                fmt_dims(b.dims())
            ),
            None => None,
        };
        let wq = self.weight.to_vec::<i8>()?;
        Ok(Packed {
            from: self
                .sources()
                .into_iter()
                .map(|t| (t.clone(), t.version()))
                .collect(),
            weights: Arc::new(PackedWeights::pack(&wq, n, k)),
            scales: Arc::new(scales),
            bias,
        })
    }

    /// The forward with an explicit kernel choice (tests compare them).
    pub fn forward_with(&self, x: &Tensor, isa: Isa) -> Result<Tensor> {
        let op = "quantized_linear";
        let k = self.in_features();
        if x.dtype() != DType::F32 {
            bail!(op, "input must be f32, got {}", x.dtype());
        }
        if x.rank() == 0 || x.dims()[x.rank() - 1] != k {
            bail!(
                op,
                "input {} does not end in in_features {k} (weight {})",
                fmt_dims(x.dims()),
                fmt_dims(self.weight.dims())
            );
        }
        let (packed, scales, bias) = self.packed()?;
        let xs = x.to_vec::<f32>()?;
        if let Some(i) = xs.iter().position(|v| !v.is_finite()) {
            bail!(
                op,
                "input element {i} is {}: a non-finite value has no quantized form",
                xs[i]
            );
        }
        let m: usize = x.dims()[..x.rank() - 1].iter().product();
        let y = qgemm::qlinear(
            &xs,
            m,
            &packed,
            &scales,
            bias.as_deref().map(|b| b.as_slice()),
            self.relu,
            isa,
        );
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = self.out_features();
        Tensor::from_vec(y, &dims)
    }
}

impl Module for QuantizedLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Isa::detect())
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
