//! torchvision's vision models (random weights) for `kiln bench --only
//! ResNet18,ResNet34,ResNet50,MobileNetV3,MobileNetV3Large,EfficientNetB0,ViTB16`,
//! one [`WORKLOADS`] entry each: ResNet-18 as a plain Sequential of
//! `kiln::models::resnet::BasicBlock`s, the others from `kiln::models`.
//!
//! All follow torchvision's layer lists exactly (same shapes, strides,
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

use crate::models::efficientnet::{efficientnet_b0, EfficientNetOptions};
use crate::models::mobilenetv3::{mobilenet_v3_large, mobilenet_v3_small, MobileNetV3Options};
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

/// One vision row of `kiln bench`: its `--only` name, what it is, and how to
/// build the model (random weights). Each model is one entry of [`WORKLOADS`].
pub struct VisionModel {
    /// The row's `workload` name (`--only`, and `benches/torch_baseline.py`'s).
    pub name: &'static str,
    /// The torchvision constructor it follows (`torchvision.models.NAME`).
    pub torchvision: &'static str,
    /// Builds the model with fresh (seeded) random weights.
    pub build: fn() -> Result<Box<dyn Module>>,
}

fn boxed<M: Module + 'static>(m: Result<M>) -> Result<Box<dyn Module>> {
    Ok(Box::new(m?))
}

/// The vision workloads `kiln bench --only` names (run only when named), at
/// batch 8, 224x224, eval, random weights. `ResNet18` is the hand port
/// above; the others are `kiln::models`.
pub const WORKLOADS: [VisionModel; 7] = [
    VisionModel {
        name: "ResNet18",
        torchvision: "resnet18",
        build: || boxed(resnet18(1000)),
    },
    VisionModel {
        name: "ResNet34",
        torchvision: "resnet34",
        build: || boxed(crate::models::resnet::resnet34(1000)),
    },
    VisionModel {
        name: "ResNet50",
        torchvision: "resnet50",
        build: || boxed(crate::models::resnet::resnet50(1000)),
    },
    VisionModel {
        name: "MobileNetV3",
        torchvision: "mobilenet_v3_small",
        build: || boxed(mobilenet_v3_small(&MobileNetV3Options::default())),
    },
    VisionModel {
        name: "MobileNetV3Large",
        torchvision: "mobilenet_v3_large",
        build: || boxed(mobilenet_v3_large(&MobileNetV3Options::default())),
    },
    VisionModel {
        name: "EfficientNetB0",
        torchvision: "efficientnet_b0",
        build: || boxed(efficientnet_b0(&EfficientNetOptions::default())),
    },
    VisionModel {
        name: "ViTB16",
        torchvision: "vit_b_16",
        build: || boxed(crate::models::vit::vit_b_16()),
    },
];

impl VisionModel {
    /// The model in eval mode on a random batch of 8 at 224x224, as a bench
    /// workload (the weights seeded the same way on every run).
    pub fn workload(&self) -> Result<super::Workload> {
        use crate::nn::ModuleExt;
        crate::manual_seed(0);
        let m = (self.build)()?;
        m.eval();
        Ok(super::Workload {
            name: self.name,
            what: format!(
                "torchvision {} eval, random weights, batch 8, 224x224",
                self.torchvision
            ),
            unit: "",
            amount: 0.0,
            inputs: vec![super::randn(&[8, 3, 224, 224], 23)],
            f: Box::new(move |t: &[Tensor]| Ok(vec![m.forward(&t[0])?])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::ModuleExt;

    fn count(m: &dyn Module) -> usize {
        m.parameters().iter().map(|p| p.numel()).sum()
    }

    /// Every row's parameter count equals torchvision's
    /// (`sum(p.numel() for p in torchvision.models.NAME().parameters())`),
    /// so each table entry builds the model its name says.
    #[test]
    fn parameter_counts_match_torchvision() {
        let want = [
            ("resnet18", 11_689_512),
            ("resnet34", 21_797_672),
            ("resnet50", 25_557_032),
            ("mobilenet_v3_small", 2_542_856),
            ("mobilenet_v3_large", 5_483_032),
            ("efficientnet_b0", 5_288_548),
            ("vit_b_16", 86_567_656),
        ];
        assert_eq!(WORKLOADS.len(), want.len());
        for (v, (tv, n)) in WORKLOADS.iter().zip(want) {
            assert_eq!(v.torchvision, tv, "{}", v.name);
            assert_eq!(count(&*(v.build)().unwrap()), n, "{}", v.name);
        }
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
