//! `torch.nn.init`: in-place initialisers drawing from the default generator
//! (seeded by `kiln::manual_seed`), with PyTorch's fan and gain rules.

use crate::autograd::no_grad;
use crate::random::{normal, uniform};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// (fan_in, fan_out) of a weight: dim 1 and dim 0 times the receptive field.
pub fn fans(t: &Tensor) -> Result<(usize, usize)> {
    let d = t.dims();
    if d.len() < 2 {
        bail!(
            "init",
            "fan in and fan out need a tensor with at least 2 dims, got {}",
            fmt_dims(d)
        );
    }
    let rf: usize = d[2..].iter().product();
    Ok((d[1] * rf, d[0] * rf))
}

/// `calculate_gain(nonlinearity, param)`.
pub fn gain(nonlinearity: &str, param: Option<f64>) -> Result<f64> {
    Ok(match nonlinearity {
        "linear" | "conv1d" | "conv2d" | "sigmoid" | "identity" => 1.0,
        "tanh" => 5.0 / 3.0,
        "relu" => 2f64.sqrt(),
        "leaky_relu" => {
            let a = param.unwrap_or(0.01);
            (2.0 / (1.0 + a * a)).sqrt()
        }
        "selu" => 0.75,
        other => bail!("init", "unsupported nonlinearity '{other}'"),
    })
}

fn fill_with(t: &Tensor, src: Tensor) -> Result<()> {
    let _g = no_grad();
    t.copy_(&src)
}

pub fn uniform_(t: &Tensor, a: f64, b: f64) -> Result<()> {
    fill_with(t, uniform(t.dims(), a, b, t.dtype(), None)?)
}

pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    fill_with(t, normal(t.dims(), mean, std, t.dtype(), None)?)
}

pub fn constant_(t: &Tensor, v: f64) -> Result<()> {
    fill_with(t, Tensor::full(t.dims(), v, t.dtype()))
}

pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<()> {
    let (i, o) = fans(t)?;
    let a = gain * (6.0 / (i + o) as f64).sqrt();
    uniform_(t, -a, a)
}

pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<()> {
    let (i, o) = fans(t)?;
    normal_(t, 0.0, gain * (2.0 / (i + o) as f64).sqrt())
}

/// Which fan scales kaiming initialisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMode {
    FanIn,
    FanOut,
}

fn kaiming_std(t: &Tensor, a: f64, mode: FanMode, nonlinearity: &str) -> Result<f64> {
    let (i, o) = fans(t)?;
    let fan = if mode == FanMode::FanIn { i } else { o };
    Ok(gain(nonlinearity, Some(a))? / (fan as f64).sqrt())
}

pub fn kaiming_uniform_(t: &Tensor, a: f64, mode: FanMode, nonlinearity: &str) -> Result<()> {
    let bound = 3f64.sqrt() * kaiming_std(t, a, mode, nonlinearity)?;
    uniform_(t, -bound, bound)
}

pub fn kaiming_normal_(t: &Tensor, a: f64, mode: FanMode, nonlinearity: &str) -> Result<()> {
    normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity)?)
}

/// The default of Linear and Conv layers: weight kaiming_uniform(a=sqrt(5)),
/// i.e. uniform(+-1/sqrt(fan_in)), and the bias uniform(+-1/sqrt(fan_in)).
pub fn default_layer_init(weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    kaiming_uniform_(weight, 5f64.sqrt(), FanMode::FanIn, "leaky_relu")?;
    if let Some(b) = bias {
        let (fan_in, _) = fans(weight)?;
        let bound = if fan_in > 0 {
            1.0 / (fan_in as f64).sqrt()
        } else {
            0.0
        };
        uniform_(b, -bound, bound)?;
    }
    Ok(())
}
