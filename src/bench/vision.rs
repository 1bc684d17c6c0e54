//! torchvision's ResNet-18 and MobileNetV3-small (random weights), for
//! `kiln bench --only ResNet18,MobileNetV3`: ResNet-18 as a plain
//! Sequential of `kiln::models::resnet::BasicBlock`s, MobileNetV3 as
//! `kiln::models::mobilenetv3::mobilenet_v3_small`.
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

use crate::models::mobilenetv3::{mobilenet_v3_small, MobileNetV3Options};
use crate::models::resnet::BasicBlock;
use crate::nn::{self, Activation, BatchNorm, Conv, ConvOptions, Module, Sequential};
use crate::{Result, Tensor};
use kiln_ir::op::conv::Padding;
use kiln_ir::op::pool::Pool2dParams;

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
        .add(BatchNorm::new_2d(widths[0]))
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

/// A vision model in eval mode on a random batch of 8 at 224x224.
fn model_workload<M: Module + 'static>(
    name: &'static str,
    what: &str,
    build: impl FnOnce() -> Result<M>,
) -> Result<super::Workload> {
    use crate::nn::ModuleExt;
    crate::manual_seed(0);
    let m = build()?;
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
    model_workload("ResNet18", "torchvision resnet18", || resnet18(1000))
}

/// `MobileNetV3`: torchvision's mobilenet_v3_small as a bench workload.
pub fn mobilenet_v3_workload() -> Result<super::Workload> {
    model_workload("MobileNetV3", "torchvision mobilenet_v3_small", || {
        mobilenet_v3_small(&MobileNetV3Options::default())
    })
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

    fn count(m: &dyn Module) -> usize {
        m.parameters().iter().map(|p| p.numel()).sum()
    }

    /// Parameter counts equal torchvision's (resnet18: 11,689,512;
    /// mobilenet_v3_small: 2,542,856), so the layer lists match.
    #[test]
    fn parameter_counts_match_torchvision() {
        assert_eq!(count(&resnet18(1000).unwrap()), 11_689_512);
        let m = mobilenet_v3_small(&MobileNetV3Options::default()).unwrap();
        assert_eq!(count(&m), 2_542_856);
    }

    #[test]
    fn hard_activations_match_their_definitions() {
        let x = Tensor::from_vec(vec![-4.0f32, -3.0, -1.5, 0.0, 1.0, 3.0, 5.0], &[7]).unwrap();
        let hs = x.hardswish().unwrap().to_vec::<f32>().unwrap();
        let hg = x.hardsigmoid().unwrap().to_vec::<f32>().unwrap();
        for (i, &v) in [-4.0f32, -3.0, -1.5, 0.0, 1.0, 3.0, 5.0].iter().enumerate() {
            let r6 = (v + 3.0).clamp(0.0, 6.0);
            assert!((hs[i] - v * r6 / 6.0).abs() < 1e-6, "{v}");
            assert!((hg[i] - r6 / 6.0).abs() < 1e-6, "{v}");
        }
    }
}
