//! The building blocks torchvision's MobileNetV3 and EfficientNet share
//! (`torchvision.ops.misc` and `torchvision.models._utils`):
//! `Conv2dNormActivation`, `SqueezeExcitation`, `StochasticDepth` and
//! `_make_divisible`, with torchvision's child names (`0`/`1`/`2`, `fc1`,
//! `fc2`) so their `state_dict` keys are torchvision's.

use crate::compile::trace::{random_input, RandomSpec};
use crate::nn::init::{kaiming_normal_, zeros_, FanMode};
use crate::nn::{
    Activation, BatchNorm, BatchNormOptions, Conv, ConvOptions, Module, Padding, Pool2d,
    Sequential, Training,
};
use crate::{Result, Tensor};
use kiln_ir::bail;

/// torchvision's `_make_divisible(v, divisor, min_value)`: `v` rounded to
/// the nearest multiple of `divisor` (at least `min_value`, default
/// `divisor`), never more than 10% below `v`.
///
/// ```
/// use kiln::models::ops::make_divisible;
/// assert_eq!(make_divisible(72.0 / 4.0, 8, None), 24); // 18 -> 16 is < 90%: 24
/// assert_eq!(make_divisible(16.0 * 0.5, 8, None), 8);
/// ```
pub fn make_divisible(v: f64, divisor: usize, min_value: Option<usize>) -> usize {
    let d = divisor as f64;
    let rounded = ((v + d / 2.0) as usize) / divisor * divisor;
    let n = rounded.max(min_value.unwrap_or(divisor));
    if (n as f64) < 0.9 * v {
        n + divisor
    } else {
        n
    }
}

/// The convolution of a [`conv_norm_activation`]: kernel, stride, groups,
/// dilation (padding is torchvision's `(kernel - 1) / 2 * dilation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSpec {
    pub kernel: usize,
    pub stride: usize,
    pub groups: usize,
    pub dilation: usize,
}

impl ConvSpec {
    /// A `kernel` x `kernel` conv, stride 1, one group, no dilation.
    pub fn new(kernel: usize) -> ConvSpec {
        ConvSpec {
            kernel,
            stride: 1,
            groups: 1,
            dilation: 1,
        }
    }
    pub fn stride(self, stride: usize) -> ConvSpec {
        ConvSpec { stride, ..self }
    }
    /// A depthwise conv over `channels`.
    pub fn depthwise(self, channels: usize) -> ConvSpec {
        ConvSpec {
            groups: channels,
            ..self
        }
    }
    pub fn dilation(self, dilation: usize) -> ConvSpec {
        ConvSpec { dilation, ..self }
    }
}

/// `nn.Conv2d` initialised as torchvision's classifiers do:
/// `kaiming_normal_(weight, mode="fan_out")`, a zero bias.
pub fn conv2d(c_in: usize, c_out: usize, s: ConvSpec, bias: bool) -> Result<Conv> {
    let o = ConvOptions {
        stride: s.stride,
        padding: Padding::Explicit(vec![(s.kernel - 1) / 2 * s.dilation]),
        dilation: s.dilation,
        groups: s.groups,
        bias,
        ..ConvOptions::default()
    };
    let c = Conv::conv2d(c_in, c_out, s.kernel, o)?;
    kaiming_normal_(&c.weight, 0.0, FanMode::FanOut, "relu")?;
    if let Some(b) = &c.bias {
        zeros_(b)?;
    }
    Ok(c)
}

/// `torchvision.ops.Conv2dNormActivation(c_in, c_out, ..., norm_layer=
/// BatchNorm2d(**norm), activation_layer=act)`: a Sequential of the conv
/// (no bias: the norm follows) as `0`, the BatchNorm as `1`, the
/// activation, if any, as `2`.
pub fn conv_norm_activation(
    c_in: usize,
    c_out: usize,
    s: ConvSpec,
    norm: BatchNormOptions,
    act: Option<Activation>,
) -> Result<Sequential> {
    let seq = Sequential::new()
        .add(conv2d(c_in, c_out, s, false)?)
        .add(BatchNorm::with(c_out, 4, norm));
    Ok(match act {
        Some(a) => seq.add(a),
        None => seq,
    })
}

/// `torchvision.ops.SqueezeExcitation(input_channels, squeeze_channels,
/// activation, scale_activation)`: the input scaled per channel by
/// `scale_activation(fc2(activation(fc1(avgpool(x)))))`.
///
/// ```
/// use kiln::models::ops::SqueezeExcitation;
/// use kiln::nn::{Activation, Module, ModuleExt};
/// let se = SqueezeExcitation::new(16, 8, Activation::relu(), Activation::hardsigmoid()).unwrap();
/// assert_eq!(se.state_dict()[0].0, "fc1.weight");
/// let y = se.forward(&kiln::Tensor::ones(&[2, 16, 5, 5], kiln::DType::F32)).unwrap();
/// assert_eq!(y.dims(), &[2, 16, 5, 5]);
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate", describe = "describe_se")]
pub struct SqueezeExcitation {
    pub avgpool: Pool2d,
    pub fc1: Conv,
    pub fc2: Conv,
    pub activation: Activation,
    pub scale_activation: Activation,
    training: Training,
}

fn describe_se(m: &SqueezeExcitation) -> String {
    let d = m.fc1.weight.dims();
    format!("SqueezeExcitation({} -> {})", d[1], d[0])
}

impl SqueezeExcitation {
    pub fn new(
        input_channels: usize,
        squeeze_channels: usize,
        activation: Activation,
        scale_activation: Activation,
    ) -> Result<SqueezeExcitation> {
        let one = ConvSpec::new(1);
        Ok(SqueezeExcitation {
            avgpool: Pool2d::AdaptiveAvg([1, 1]),
            fc1: conv2d(input_channels, squeeze_channels, one, true)?,
            fc2: conv2d(squeeze_channels, input_channels, one, true)?,
            activation,
            scale_activation,
            training: Training::default(),
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let s = self.fc1.forward(&self.avgpool.forward(x)?)?;
        let s = self.fc2.forward(&self.activation.forward(&s)?)?;
        self.scale_activation.forward(&s)?.mul(x)
    }
}

/// `torchvision.ops.StochasticDepth(p, mode="row")`: in training, each
/// sample's residual branch is dropped with probability `p` (the kept ones
/// scaled by `1 / (1 - p)`); identity in eval or with `p = 0`. The draws come
/// from kiln's generator (a fresh graph input on every compiled call, as
/// Dropout's mask), not PyTorch's.
#[derive(crate::nn::Module)]
#[module(crate = "crate", describe = "describe_sd")]
pub struct StochasticDepth {
    #[module(skip)]
    pub p: f64,
    training: Training,
}

fn describe_sd(m: &StochasticDepth) -> String {
    format!("StochasticDepth(p={}, mode=row)", m.p)
}

impl StochasticDepth {
    pub fn new(p: f64) -> Result<StochasticDepth> {
        if !(0.0..=1.0).contains(&p) {
            bail!(
                "StochasticDepth",
                "drop probability has to be between 0 and 1, but got {p}"
            );
        }
        Ok(StochasticDepth {
            p,
            training: Training::default(),
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training.get() || self.p == 0.0 {
            return Ok(x.clone());
        }
        let survival = 1.0 - self.p;
        let mut dims = vec![1; x.rank()];
        dims[0] = x.dims()[0];
        let noise = random_input(RandomSpec::Bernoulli {
            dims,
            p: survival,
            dtype: x.dtype(),
        })?;
        let y = x.mul(&noise)?;
        if survival > 0.0 {
            y.binary_scalar(kiln_ir::BinaryOp::Mul, 1.0 / survival, false)
        } else {
            Ok(y)
        }
    }
}
