//! `nn.Upsample`: nearest, nearest-exact and (bi/tri)linear resizing of the
//! spatial dims, with PyTorch's source-coordinate rules.
//!
//! Each spatial dim is resized on its own: nearest modes gather source
//! indices (`index_select`), linear modes multiply by a constant (out, in)
//! interpolation matrix. Both are differentiable tensor ops, so eager
//! autograd and `compile` need nothing more.

use super::{Entry, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// How `Upsample` computes an output element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsampleMode {
    /// `floor(dst * in/out)` (PyTorch's legacy 'nearest').
    Nearest,
    /// `floor((dst + 0.5) * in/out)`.
    NearestExact,
    /// 'linear', 'bilinear', 'trilinear' (by the input rank).
    Linear,
}

impl UpsampleMode {
    /// PyTorch's mode names; 'bicubic' and 'area' are not supported yet.
    pub fn from_name(name: &str) -> Result<UpsampleMode> {
        Ok(match name {
            "nearest" => UpsampleMode::Nearest,
            "nearest-exact" => UpsampleMode::NearestExact,
            "linear" | "bilinear" | "trilinear" => UpsampleMode::Linear,
            other => bail!(
                "Upsample",
                "mode '{other}' is not supported (nearest, nearest-exact, linear, bilinear, trilinear)"
            ),
        })
    }
}

/// `nn.Upsample(size, scale_factor, mode, align_corners, recompute_scale_factor)`
/// on (N, C, *spatial) with 1 to 3 spatial dims.
///
/// ```
/// use kiln_frontend::nn::{Module, Upsample, UpsampleMode};
/// use kiln_frontend::Tensor;
/// let up = Upsample::scale(&[2.0], UpsampleMode::Nearest);
/// let y = up.forward(&Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 2]).unwrap()).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 2.0, 2.0]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Upsample {
    /// Output size of each spatial dim (one value is used for all).
    pub size: Option<Vec<usize>>,
    /// Scale of each spatial dim (one value is used for all).
    pub scale_factor: Option<Vec<f64>>,
    pub mode: UpsampleMode,
    /// Linear modes only: corner pixels of input and output aligned.
    pub align_corners: bool,
    pub recompute_scale_factor: bool,
}

impl Upsample {
    /// `nn.Upsample(size=size, mode=mode)`.
    pub fn size(size: &[usize], mode: UpsampleMode) -> Upsample {
        Upsample {
            size: Some(size.to_vec()),
            scale_factor: None,
            mode,
            align_corners: false,
            recompute_scale_factor: false,
        }
    }
    /// `nn.Upsample(scale_factor=scale, mode=mode)`.
    pub fn scale(scale: &[f64], mode: UpsampleMode) -> Upsample {
        Upsample {
            size: None,
            scale_factor: Some(scale.to_vec()),
            mode,
            align_corners: false,
            recompute_scale_factor: false,
        }
    }
    pub fn align_corners(mut self, on: bool) -> Upsample {
        self.align_corners = on;
        self
    }

    /// For spatial dim `i` of size `n_in`: the output size and the scale
    /// PyTorch uses for source coordinates (None: in/out).
    fn dim_plan(&self, i: usize, n_in: usize, spatial: usize) -> Result<(usize, Option<f32>)> {
        let pick = |v: &[f64]| if v.len() == 1 { v[0] } else { v[i] };
        match (&self.size, &self.scale_factor) {
            (Some(s), None) if s.len() == 1 || s.len() == spatial => {
                Ok((if s.len() == 1 { s[0] } else { s[i] }, None))
            }
            (None, Some(f)) if f.len() == 1 || f.len() == spatial => {
                let f = pick(f);
                if f.is_nan() || f <= 0.0 {
                    bail!("Upsample", "scale_factor must be positive, got {f}");
                }
                let out = (n_in as f64 * f).floor() as usize;
                Ok((out, (!self.recompute_scale_factor).then_some((1.0 / f) as f32)))
            }
            _ => bail!(
                "Upsample",
                "give exactly one of size and scale_factor, with 1 or {spatial} values (got size {:?}, scale_factor {:?})",
                self.size,
                self.scale_factor
            ),
        }
    }

    /// Resizes dim `dim` from `n_in` to `n_out`.
    fn resize_dim(
        &self,
        x: &Tensor,
        dim: usize,
        n_out: usize,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        let n_in = x.dims()[dim];
        if n_out == n_in && scale.is_none() {
            return Ok(x.clone());
        }
        let ratio = scale.unwrap_or(n_in as f32 / n_out as f32);
        match self.mode {
            UpsampleMode::Nearest | UpsampleMode::NearestExact => {
                let half = if self.mode == UpsampleMode::NearestExact {
                    0.5
                } else {
                    0.0
                };
                let idx: Vec<i64> = (0..n_out)
                    .map(|d| (((d as f32 + half) * ratio).floor() as i64).min(n_in as i64 - 1))
                    .collect();
                x.index_select(dim as i64, &Tensor::from_vec(idx, &[n_out])?)
            }
            UpsampleMode::Linear => {
                let a = linear_weights(n_in, n_out, ratio, self.align_corners);
                let at = Tensor::from_vec(a, &[n_out, n_in])?
                    .to_dtype(x.dtype())?
                    .t()?;
                let last = x.rank() as i64 - 1;
                let moved = x.transpose(dim as i64, last)?;
                F::matmul(&moved, &at)?.transpose(dim as i64, last)
            }
        }
    }
}

/// The (out, in) matrix of linear interpolation weights along one dim
/// (PyTorch's `area_pixel_compute_source_index`, in f32 as it computes).
fn linear_weights(n_in: usize, n_out: usize, ratio: f32, align_corners: bool) -> Vec<f32> {
    let scale = match align_corners {
        true if n_out > 1 => (n_in as f32 - 1.0) / (n_out as f32 - 1.0),
        true => 0.0,
        false => ratio,
    };
    let mut a = vec![0.0f32; n_out * n_in];
    for d in 0..n_out {
        let src = match align_corners {
            true => scale * d as f32,
            false => (scale * (d as f32 + 0.5) - 0.5).max(0.0),
        };
        let i0 = (src.floor() as usize).min(n_in - 1);
        let i1 = if i0 + 1 < n_in { i0 + 1 } else { i0 };
        let l1 = (src - i0 as f32).clamp(0.0, 1.0);
        a[d * n_in + i0] += 1.0 - l1;
        a[d * n_in + i1] += l1;
    }
    a
}

impl Module for Upsample {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let spatial = x.rank().saturating_sub(2);
            if !(1..=3).contains(&spatial) || !x.dtype().is_float() || x.dims().contains(&0) {
                bail!(
                    "Upsample",
                    "expected a non-empty floating-point (N, C, *spatial) input with 1 to 3 spatial dims, got {} {}",
                    x.dtype(),
                    fmt_dims(x.dims())
                );
            }
            let mut y = x.clone();
            for i in 0..spatial {
                let dim = 2 + i;
                let (n_out, scale) = self.dim_plan(i, x.dims()[dim], spatial)?;
                if n_out == 0 {
                    bail!(
                        "Upsample",
                        "output size of spatial dim {i} is 0 (input {})",
                        fmt_dims(x.dims())
                    );
                }
                y = self.resize_dim(&y, dim, n_out, scale)?;
            }
            Ok(y)
        })
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        let mode = match self.mode {
            UpsampleMode::Nearest => "nearest",
            UpsampleMode::NearestExact => "nearest-exact",
            UpsampleMode::Linear => "bilinear",
        };
        let what = match (&self.size, &self.scale_factor) {
            (Some(s), _) if s.len() == 1 => format!("size={}", s[0]),
            (Some(s), _) => format!("size={s:?}"),
            (_, Some(f)) if f.len() == 1 => format!("scale_factor={:?}", f[0]),
            (_, Some(f)) => format!("scale_factor={f:?}"),
            _ => String::new(),
        };
        format!("Upsample({what}, mode='{mode}')")
    }
}
