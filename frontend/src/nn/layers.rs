//! Layers with weights: Linear, Conv1d/Conv2d/Conv3d, ConvTranspose2d, Embedding.

use super::init::default_layer_init;
use super::padding_mode::PaddingMode;
use super::{Entry, EntryMut, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::op::conv::{ConvParams, ConvTransposeParams, Padding};
use kiln_ir::{bail, DType, Result};

/// A fresh parameter: f32 zeros that require grad, initialised by the caller.
pub(crate) fn param(dims: &[usize]) -> Tensor {
    Tensor::zeros(dims, DType::F32).requires_grad_(true)
}

fn visit_wb<'a>(w: &'a Tensor, b: &'a Option<Tensor>, f: &mut dyn FnMut(Entry<'a>)) {
    f(Entry::Param("weight", w));
    if let Some(b) = b {
        f(Entry::Param("bias", b));
    }
}

fn visit_wb_mut(w: &mut Tensor, b: &mut Option<Tensor>, f: &mut dyn FnMut(EntryMut<'_>)) {
    f(EntryMut::Param("weight", w));
    if let Some(b) = b {
        f(EntryMut::Param("bias", b));
    }
}

/// `nn.Linear(in, out, bias)`: y = x W^T + b.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let l = Linear {
            weight: param(&[out_features, in_features]),
            bias: bias.then(|| param(&[out_features])),
        };
        default_layer_init(&l.weight, l.bias.as_ref())?;
        Ok(l)
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| F::linear(x, &self.weight, self.bias.as_ref()))
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        visit_wb(&self.weight, &self.bias, f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        visit_wb_mut(&mut self.weight, &mut self.bias, f)
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!(
            "Linear(in_features={}, out_features={}, bias={})",
            d[1],
            d[0],
            py_bool(self.bias.is_some())
        )
    }
}

pub(crate) fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// `nn.Conv1d` / `nn.Conv2d` / `nn.Conv3d` (by the weight's rank).
pub struct Conv {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: ConvParams,
    /// How the border is padded (`padding_mode`; zeros unless set).
    pub padding_mode: PaddingMode,
}

/// Construction arguments of a convolution (PyTorch's defaults via `Default`).
#[derive(Debug, Clone)]
pub struct ConvOptions {
    pub stride: usize,
    pub padding: Padding,
    pub dilation: usize,
    pub groups: usize,
    pub bias: bool,
    pub padding_mode: PaddingMode,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: 1,
            padding: Padding::Explicit(vec![0]),
            dilation: 1,
            groups: 1,
            bias: true,
            padding_mode: PaddingMode::Zeros,
        }
    }
}

impl Conv {
    /// `nn.Conv2d(in, out, kernel_size, ...)`.
    pub fn conv2d(c_in: usize, c_out: usize, kernel: usize, o: ConvOptions) -> Result<Conv> {
        Conv::new(c_in, c_out, &[kernel, kernel], o)
    }
    /// `nn.Conv1d(in, out, kernel_size, ...)`.
    pub fn conv1d(c_in: usize, c_out: usize, kernel: usize, o: ConvOptions) -> Result<Conv> {
        Conv::new(c_in, c_out, &[kernel], o)
    }
    /// `nn.Conv3d(in, out, kernel_size, ...)` (one stride, padding and
    /// dilation for all three dims; explicit padding only).
    pub fn conv3d(c_in: usize, c_out: usize, kernel: usize, o: ConvOptions) -> Result<Conv> {
        if !matches!(o.padding, Padding::Explicit(ref p) if p.len() == 1) {
            bail!(
                "Conv3d",
                "padding must be one explicit value for all three dims, got {:?}",
                o.padding
            );
        }
        Conv::new(c_in, c_out, &[kernel, kernel, kernel], o)
    }
    fn new(c_in: usize, c_out: usize, kernel: &[usize], o: ConvOptions) -> Result<Conv> {
        if o.padding_mode != PaddingMode::Zeros && !matches!(o.padding, Padding::Explicit(_)) {
            bail!(
                "Conv",
                "padding_mode '{}' needs explicit padding, got {:?}",
                o.padding_mode.name(),
                o.padding
            );
        }
        let mut wd = vec![c_out, c_in / o.groups.max(1)];
        wd.extend_from_slice(kernel);
        let c = Conv {
            weight: param(&wd),
            bias: o.bias.then(|| param(&[c_out])),
            params: ConvParams {
                stride: vec![o.stride],
                padding: o.padding,
                dilation: vec![o.dilation],
                groups: o.groups,
            },
            padding_mode: o.padding_mode,
        };
        default_layer_init(&c.weight, c.bias.as_ref())?;
        Ok(c)
    }
}

impl Conv {
    /// The input padded by `padding_mode` (and the params left to pad
    /// nothing), or both as they are for zeros padding.
    fn padded(&self, x: &Tensor) -> Result<(Tensor, ConvParams)> {
        let p = match (&self.params.padding, self.padding_mode) {
            (_, PaddingMode::Zeros) | (Padding::Valid, _) => {
                return Ok((x.clone(), self.params.clone()))
            }
            (Padding::Explicit(p), mode) => {
                let spatial = self.weight.rank() - 2;
                let pads: Vec<usize> = (0..spatial).map(|i| p[i.min(p.len() - 1)]).collect();
                super::padding_mode::pad_symmetric(x, &pads, mode)?
            }
            (Padding::Same, mode) => bail!(
                "Conv",
                "padding='same' with padding_mode '{}' is not supported",
                mode.name()
            ),
        };
        let params = ConvParams {
            padding: Padding::Explicit(vec![0]),
            ..self.params.clone()
        };
        Ok((p, params))
    }
}

impl Module for Conv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let (x, params) = self.padded(x)?;
            let b = self.bias.as_ref();
            match self.weight.rank() {
                3 => F::conv1d(&x, &self.weight, b, &params),
                5 => {
                    let p = match &params.padding {
                        Padding::Explicit(p) => p[0],
                        other => bail!("Conv3d", "padding must be explicit, got {other:?}"),
                    };
                    let (s, d) = (params.stride[0], params.dilation[0]);
                    super::conv3d::conv3d(&x, &self.weight, b, s, p, d, params.groups)
                }
                _ => F::conv2d(&x, &self.weight, b, &params),
            }
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        visit_wb(&self.weight, &self.bias, f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        visit_wb_mut(&mut self.weight, &mut self.bias, f)
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        let k = &d[2..];
        let rank = k.len();
        let tuple = |v: &[usize]| {
            format!(
                "({})",
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if v.len() == 1 { "," } else { "" }
            )
        };
        let rep = |v: usize| vec![v; rank];
        let mut s = format!(
            "Conv{rank}d({}, {}, kernel_size={}, stride={}",
            d[1] * self.params.groups,
            d[0],
            tuple(k),
            tuple(&rep(self.params.stride[0]))
        );
        match &self.params.padding {
            Padding::Explicit(p) if p.iter().all(|&x| x == 0) => {}
            Padding::Explicit(p) => s += &format!(", padding={}", tuple(&rep(p[0]))),
            Padding::Same => s += ", padding=same",
            Padding::Valid => s += ", padding=valid",
        }
        if self.params.dilation[0] != 1 {
            s += &format!(", dilation={}", tuple(&rep(self.params.dilation[0])));
        }
        if self.params.groups != 1 {
            s += &format!(", groups={}", self.params.groups);
        }
        if self.bias.is_none() {
            s += ", bias=False";
        }
        if self.padding_mode != PaddingMode::Zeros {
            s += &format!(", padding_mode={}", self.padding_mode.name());
        }
        s + ")"
    }
}

/// `nn.ConvTranspose2d(in, out, kernel_size, stride, padding, output_padding, groups, bias)`.
pub struct ConvTranspose2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: ConvTransposeParams,
}

impl ConvTranspose2d {
    pub fn new(
        c_in: usize,
        c_out: usize,
        kernel: usize,
        params: ConvTransposeParams,
        bias: bool,
    ) -> Result<Self> {
        let c = ConvTranspose2d {
            weight: param(&[c_in, c_out / params.groups.max(1), kernel, kernel]),
            bias: bias.then(|| param(&[c_out])),
            params,
        };
        default_layer_init(&c.weight, c.bias.as_ref())?;
        Ok(c)
    }
}

impl Module for ConvTranspose2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            F::conv_transpose2d(x, &self.weight, self.bias.as_ref(), &self.params)
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        visit_wb(&self.weight, &self.bias, f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        visit_wb_mut(&mut self.weight, &mut self.bias, f)
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!(
            "ConvTranspose2d({}, {}, kernel_size=({}, {}))",
            d[0],
            d[1] * self.params.groups,
            d[2],
            d[3]
        )
    }
}

/// `nn.Embedding(num, dim, padding_idx)`: weight ~ N(0, 1), the padding row zero.
pub struct Embedding {
    pub weight: Tensor,
    pub padding_idx: Option<i64>,
}

impl Embedding {
    pub fn new(num: usize, dim: usize, padding_idx: Option<i64>) -> Result<Embedding> {
        kiln_ir::op::embedding::resolve_padding_idx(&[num, dim], padding_idx).map_err(
            |e| match e {
                kiln_ir::Error::Op { msg, .. } => kiln_ir::Error::op("Embedding", msg),
                e => e,
            },
        )?;
        let e = Embedding {
            weight: param(&[num, dim]),
            padding_idx,
        };
        super::init::normal_(&e.weight, 0.0, 1.0)?;
        if let Some(p) = padding_idx {
            let row = if p < 0 { p + num as i64 } else { p };
            let _g = crate::autograd::no_grad();
            e.weight
                .select(0, row)?
                .copy_(&Tensor::zeros(&[dim], DType::F32))?;
        }
        Ok(e)
    }
}

impl Module for Embedding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| F::embedding(x, &self.weight, self.padding_idx))
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Param("weight", &self.weight))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Param("weight", &mut self.weight))
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        match self.padding_idx {
            Some(p) => format!("Embedding({}, {}, padding_idx={p})", d[0], d[1]),
            None => format!("Embedding({}, {})", d[0], d[1]),
        }
    }
}
