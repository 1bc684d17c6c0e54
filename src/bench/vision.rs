//! torchvision's ResNet-18 and MobileNetV3-small as plain kiln modules
//! (random weights), for `kiln bench --only ResNet18,MobileNetV3`.
//!
//! Both follow torchvision's layer lists exactly (same shapes, strides,
//! paddings, groups, BatchNorm eps); hardswish and hardsigmoid are kiln's
//! native pointwise ops, so each reads its input once and fuses into the
//! preceding conv's epilogue.
//!
//! ```no_run
//! use kiln::nn::{Module, ModuleExt};
//! let m = kiln::bench::vision::resnet18(1000).unwrap();
//! m.eval();
//! let y = m.forward(&kiln::Tensor::zeros(&[1, 3, 224, 224], kiln::DType::F32)).unwrap();
//! assert_eq!(y.dims(), &[1, 1000]);
//! ```

use crate::models::resnet::BasicBlock;
use crate::nn::{self, Activation, BatchNorm, Conv, ConvOptions, Entry, Module, Sequential};
use crate::{Result, Tensor};
use kiln_ir::op::conv::Padding;
use kiln_ir::op::pool::Pool2dParams;

fn conv(
    c_in: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    groups: usize,
    bias: bool,
) -> Result<Conv> {
    Conv::conv2d(
        c_in,
        c_out,
        k,
        ConvOptions {
            stride,
            padding: Padding::Explicit(vec![(k - 1) / 2]),
            groups,
            bias,
            ..ConvOptions::default()
        },
    )
}

fn bn(c: usize, eps: f64) -> BatchNorm {
    let mut b = BatchNorm::new_2d(c);
    b.eps = eps;
    b
}

/// `F.hardsigmoid`: relu6(x + 3) / 6, kiln's native pointwise op (it fuses
/// into the conv epilogue like relu).
pub fn hardsigmoid(x: &Tensor) -> Result<Tensor> {
    x.hardsigmoid()
}

/// `F.hardswish`: x * relu6(x + 3) / 6, native as [`hardsigmoid`].
pub fn hardswish(x: &Tensor) -> Result<Tensor> {
    x.hardswish()
}

/// `nn.Hardswish` / `nn.Hardsigmoid` as modules.
pub struct Hard {
    swish: bool,
}

impl Module for Hard {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.swish {
            hardswish(x)
        } else {
            hardsigmoid(x)
        }
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        if self.swish {
            "Hardswish()"
        } else {
            "Hardsigmoid()"
        }
        .into()
    }
}

/// torchvision's `resnet18` layout with stage widths `widths` (64, 128, 256,
/// 512 for ResNet-18), `blocks` BasicBlocks per stage and `classes` outputs.
pub fn resnet(widths: [usize; 4], blocks: [usize; 4], classes: usize) -> Result<Sequential> {
    let stem = Conv::conv2d(
        3,
        widths[0],
        7,
        ConvOptions {
            stride: 2,
            padding: Padding::Explicit(vec![3]),
            bias: false,
            ..ConvOptions::default()
        },
    )?;
    let mut pool = Pool2dParams::new([3, 3]);
    pool.stride = [2, 2];
    pool.padding = [1, 1];
    let mut m = Sequential::new()
        .add(stem)
        .add(bn(widths[0], 1e-5))
        .add(Activation::relu())
        .add(nn::Pool2d::Max(pool));
    let mut c_in = widths[0];
    for (stage, (&w, &n)) in widths.iter().zip(&blocks).enumerate() {
        let mut layer = Sequential::new();
        for b in 0..n {
            let stride = if stage > 0 && b == 0 { 2 } else { 1 };
            layer = layer.add(BasicBlock::new(c_in, w, stride)?);
            c_in = w;
        }
        m = m.add(layer);
    }
    Ok(m.add(nn::Pool2d::AdaptiveAvg([1, 1]))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(c_in, classes, true)?))
}

/// torchvision's `resnet18(num_classes=classes)`.
pub fn resnet18(classes: usize) -> Result<Sequential> {
    resnet([64, 128, 256, 512], [2, 2, 2, 2], classes)
}

/// torchvision's `_make_divisible(v, 8)`.
fn make_divisible(v: usize) -> usize {
    let n = ((v + 4) / 8 * 8).max(8);
    if (n as f64) < 0.9 * v as f64 {
        n + 8
    } else {
        n
    }
}

/// torchvision's `SqueezeExcitation` with a hardsigmoid gate.
pub struct SqueezeExcite {
    fc1: Conv,
    fc2: Conv,
}

impl Module for SqueezeExcite {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let s = crate::functional::adaptive_avg_pool2d(x, [1, 1])?;
        let s = self.fc1.forward(&s)?.relu()?;
        let s = hardsigmoid(&self.fc2.forward(&s)?)?;
        x.mul(&s)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("fc1", &self.fc1));
        f(Entry::Child("fc2", &self.fc2));
    }
    fn describe(&self) -> String {
        "SqueezeExcitation".into()
    }
}

/// torchvision's MobileNetV3 `InvertedResidual`: 1x1 expand, depthwise
/// k x k, optional squeeze-excite, 1x1 project; the input added back when
/// the shape is kept.
pub struct InvertedResidual {
    block: Sequential,
    residual: bool,
}

impl Module for InvertedResidual {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.block.forward(x)?;
        if self.residual {
            y.add(x)
        } else {
            Ok(y)
        }
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("block", &self.block));
    }
    fn describe(&self) -> String {
        "InvertedResidual".into()
    }
}

/// Conv-BN(eps 1e-3)-activation, as torchvision's `Conv2dNormActivation`.
fn conv_bn_act(
    s: Sequential,
    c_in: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    groups: usize,
    a: Option<bool>,
) -> Result<Sequential> {
    let s = s
        .add(conv(c_in, c_out, k, stride, groups, false)?)
        .add(bn(c_out, 1e-3));
    Ok(match a {
        Some(true) => s.add(Hard { swish: true }),
        Some(false) => s.add(Activation::relu()),
        None => s,
    })
}

/// torchvision's `mobilenet_v3_small(num_classes=classes)` (eval: Dropout is identity).
pub fn mobilenet_v3_small(classes: usize) -> Result<Sequential> {
    // input, kernel, expanded, output, squeeze-excite, hardswish, stride
    #[rustfmt::skip]
    let config: [(usize, usize, usize, usize, bool, bool, usize); 11] = [
        (16, 3, 16, 16, true, false, 2),
        (16, 3, 72, 24, false, false, 2),
        (24, 3, 88, 24, false, false, 1),
        (24, 5, 96, 40, true, true, 2),
        (40, 5, 240, 40, true, true, 1),
        (40, 5, 240, 40, true, true, 1),
        (40, 5, 120, 48, true, true, 1),
        (48, 5, 144, 48, true, true, 1),
        (48, 5, 288, 96, true, true, 2),
        (96, 5, 576, 96, true, true, 1),
        (96, 5, 576, 96, true, true, 1),
    ];
    let mut m = conv_bn_act(Sequential::new(), 3, 16, 3, 2, 1, Some(true))?;
    for (c_in, k, exp, c_out, se, hs, stride) in config {
        let mut b = Sequential::new();
        if exp != c_in {
            b = conv_bn_act(b, c_in, exp, 1, 1, 1, Some(hs))?;
        }
        b = conv_bn_act(b, exp, exp, k, stride, exp, Some(hs))?;
        if se {
            let sq = make_divisible(exp / 4);
            let one = |a, b| {
                Conv::conv2d(
                    a,
                    b,
                    1,
                    ConvOptions {
                        bias: true,
                        ..ConvOptions::default()
                    },
                )
            };
            b = b.add(SqueezeExcite {
                fc1: one(exp, sq)?,
                fc2: one(sq, exp)?,
            });
        }
        b = conv_bn_act(b, exp, c_out, 1, 1, 1, None)?;
        m = m.add(InvertedResidual {
            block: b,
            residual: stride == 1 && c_in == c_out,
        });
    }
    let m = conv_bn_act(m, 96, 576, 1, 1, 1, Some(true))?;
    Ok(m.add(nn::Pool2d::AdaptiveAvg([1, 1]))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(576, 1024, true)?)
        .add(Hard { swish: true })
        .add(nn::Dropout::new(0.2)?)
        .add(nn::Linear::new(1024, classes, true)?))
}

/// A vision model in eval mode on a random batch of 8 at 224x224.
fn model_workload(
    name: &'static str,
    what: &str,
    build: fn(usize) -> Result<Sequential>,
) -> Result<super::Workload> {
    use crate::nn::ModuleExt;
    crate::manual_seed(0);
    let m = build(1000)?;
    m.eval();
    Ok(super::Workload {
        name,
        what: format!("{what} eval, random weights, batch 8, 224x224"),
        unit: "",
        amount: 0.0,
        inputs: vec![super::randn(&[8, 3, 224, 224], 23)],
        f: Box::new(move |t: &[Tensor]| Ok(vec![m.forward(&t[0])?])),
    })
}

/// `ResNet18`: torchvision's resnet18 as a bench workload.
pub fn resnet18_workload() -> Result<super::Workload> {
    model_workload("ResNet18", "torchvision resnet18", resnet18)
}

/// `MobileNetV3`: torchvision's mobilenet_v3_small as a bench workload.
pub fn mobilenet_v3_workload() -> Result<super::Workload> {
    model_workload(
        "MobileNetV3",
        "torchvision mobilenet_v3_small",
        mobilenet_v3_small,
    )
}

/// The vision workloads `kiln bench --only` names (run only when named).
pub const WORKLOADS: [(&str, fn() -> Result<super::Workload>); 2] = [
    ("ResNet18", resnet18_workload),
    ("MobileNetV3", mobilenet_v3_workload),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::ModuleExt;

    fn count(m: &Sequential) -> usize {
        m.parameters().iter().map(|p| p.numel()).sum()
    }

    /// Parameter counts equal torchvision's (resnet18: 11,689,512;
    /// mobilenet_v3_small: 2,542,856), so the layer lists match.
    #[test]
    fn parameter_counts_match_torchvision() {
        assert_eq!(count(&resnet18(1000).unwrap()), 11_689_512);
        assert_eq!(count(&mobilenet_v3_small(1000).unwrap()), 2_542_856);
    }

    #[test]
    fn hard_activations_match_their_definitions() {
        let x = Tensor::from_vec(vec![-4.0f32, -3.0, -1.5, 0.0, 1.0, 3.0, 5.0], &[7]).unwrap();
        let hs = hardswish(&x).unwrap().to_vec::<f32>().unwrap();
        let hg = hardsigmoid(&x).unwrap().to_vec::<f32>().unwrap();
        for (i, &v) in [-4.0f32, -3.0, -1.5, 0.0, 1.0, 3.0, 5.0].iter().enumerate() {
            let r6 = (v + 3.0).clamp(0.0, 6.0);
            assert!((hs[i] - v * r6 / 6.0).abs() < 1e-6, "{v}");
            assert!((hg[i] - r6 / 6.0).abs() < 1e-6, "{v}");
        }
    }
}
