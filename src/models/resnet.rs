//! torchvision's ResNet (`resnet18`, `resnet34`, `resnet50`) under its
//! constructor arguments and state_dict key names (`conv1.weight`,
//! `layer1.0.bn2.running_mean`, `layer2.0.downsample.0.weight`, `fc.bias`),
//! so a torchvision checkpoint saved as safetensors loads strictly.
//! Bottleneck puts the stride on its 3x3 conv, as torchvision's (ResNet v1.5).
//!
//! ```no_run
//! use kiln::nn::{Module, ModuleExt};
//! let m = kiln::models::resnet::resnet18(1000).unwrap();
//! m.eval();
//! let y = m.forward(&kiln::Tensor::zeros(&[1, 3, 224, 224], kiln::DType::F32)).unwrap();
//! assert_eq!(y.dims(), &[1, 1000]);
//! ```

use crate::nn::{self, BatchNorm, Conv, ConvOptions, Entry, Linear, Module, Sequential};
use crate::{Result, Tensor};
use kiln_ir::op::conv::Padding;
use kiln_ir::op::pool::Pool2dParams;

/// A `k`x`k` conv without bias, padded to keep the size at stride 1.
fn conv(c_in: usize, c_out: usize, k: usize, stride: usize) -> Result<Conv> {
    let options = ConvOptions {
        stride,
        padding: Padding::Explicit(vec![(k - 1) / 2]),
        bias: false,
        ..ConvOptions::default()
    };
    Conv::conv2d(c_in, c_out, k, options)
}

/// torchvision's `downsample`: a strided 1x1 conv and its BatchNorm, where
/// the block changes the size or the width.
fn downsample(c_in: usize, c_out: usize, stride: usize) -> Result<Option<Sequential>> {
    if stride == 1 && c_in == c_out {
        return Ok(None);
    }
    let c = conv(c_in, c_out, 1, stride)?;
    Ok(Some(Sequential::new().add(c).add(BatchNorm::new_2d(c_out))))
}

/// The residual `y + identity` (or the downsampled input), then ReLU.
fn residual(y: Tensor, x: &Tensor, downsample: &Option<Sequential>) -> Result<Tensor> {
    let identity = match downsample {
        Some(d) => d.forward(x)?,
        None => x.clone(),
    };
    y.add(&identity)?.relu()
}

/// torchvision's `BasicBlock` (two 3x3 convs; expansion 1).
pub struct BasicBlock {
    conv1: Conv,
    bn1: BatchNorm,
    conv2: Conv,
    bn2: BatchNorm,
    downsample: Option<Sequential>,
}

impl BasicBlock {
    pub fn new(c_in: usize, c_out: usize, stride: usize) -> Result<BasicBlock> {
        Ok(BasicBlock {
            conv1: conv(c_in, c_out, 3, stride)?,
            bn1: BatchNorm::new_2d(c_out),
            conv2: conv(c_out, c_out, 3, 1)?,
            bn2: BatchNorm::new_2d(c_out),
            downsample: downsample(c_in, c_out, stride)?,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let y = self.bn2.forward(&self.conv2.forward(&y)?)?;
        residual(y, x, &self.downsample)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("conv1", &self.conv1));
        f(Entry::Child("bn1", &self.bn1));
        f(Entry::Child("conv2", &self.conv2));
        f(Entry::Child("bn2", &self.bn2));
        if let Some(d) = &self.downsample {
            f(Entry::Child("downsample", d));
        }
    }
    fn describe(&self) -> String {
        "BasicBlock".into()
    }
}

/// torchvision's `Bottleneck` (1x1, strided 3x3, 1x1 to 4x the width).
pub struct Bottleneck {
    conv1: Conv,
    bn1: BatchNorm,
    conv2: Conv,
    bn2: BatchNorm,
    conv3: Conv,
    bn3: BatchNorm,
    downsample: Option<Sequential>,
}

impl Bottleneck {
    /// The output width: `planes * 4`.
    pub const EXPANSION: usize = 4;

    pub fn new(c_in: usize, planes: usize, stride: usize) -> Result<Bottleneck> {
        let c_out = planes * Self::EXPANSION;
        Ok(Bottleneck {
            conv1: conv(c_in, planes, 1, 1)?,
            bn1: BatchNorm::new_2d(planes),
            conv2: conv(planes, planes, 3, stride)?,
            bn2: BatchNorm::new_2d(planes),
            conv3: conv(planes, c_out, 1, 1)?,
            bn3: BatchNorm::new_2d(c_out),
            downsample: downsample(c_in, c_out, stride)?,
        })
    }
}

impl Module for Bottleneck {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let y = self.bn2.forward(&self.conv2.forward(&y)?)?.relu()?;
        let y = self.bn3.forward(&self.conv3.forward(&y)?)?;
        residual(y, x, &self.downsample)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("conv1", &self.conv1));
        f(Entry::Child("bn1", &self.bn1));
        f(Entry::Child("conv2", &self.conv2));
        f(Entry::Child("bn2", &self.bn2));
        f(Entry::Child("conv3", &self.conv3));
        f(Entry::Child("bn3", &self.bn3));
        if let Some(d) = &self.downsample {
            f(Entry::Child("downsample", d));
        }
    }
    fn describe(&self) -> String {
        "Bottleneck".into()
    }
}

/// Which residual block a [`ResNet`] stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Basic,
    Bottleneck,
}

/// torchvision's `ResNet(block, layers, num_classes)`: a 7x7 stem, a 3x3
/// max pool, four stages of 64/128/256/512 planes, global average pool, `fc`.
pub struct ResNet {
    conv1: Conv,
    bn1: BatchNorm,
    maxpool: nn::Pool2d,
    stages: [Sequential; 4],
    avgpool: nn::Pool2d,
    fc: Linear,
}

impl ResNet {
    pub fn new(block: Block, layers: [usize; 4], num_classes: usize) -> Result<ResNet> {
        let mut pool = Pool2dParams::new([3, 3]);
        pool.stride = [2, 2];
        pool.padding = [1, 1];
        let mut c_in = 64;
        let mut stages = vec![];
        for (i, &n) in layers.iter().enumerate() {
            let planes = 64 << i;
            let mut stage = Sequential::new();
            for b in 0..n {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                stage = match block {
                    Block::Basic => stage.add(BasicBlock::new(c_in, planes, stride)?),
                    Block::Bottleneck => stage.add(Bottleneck::new(c_in, planes, stride)?),
                };
                c_in = match block {
                    Block::Basic => planes,
                    Block::Bottleneck => planes * Bottleneck::EXPANSION,
                };
            }
            stages.push(stage);
        }
        let stages: [Sequential; 4] = stages
            .try_into()
            .map_err(|_| kiln_ir::Error::op("resnet", "four stages".to_string()))?;
        Ok(ResNet {
            conv1: conv(3, 64, 7, 2)?,
            bn1: BatchNorm::new_2d(64),
            maxpool: nn::Pool2d::Max(pool),
            stages,
            avgpool: nn::Pool2d::AdaptiveAvg([1, 1]),
            fc: Linear::new(c_in, num_classes, true)?,
        })
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        y = self.maxpool.forward(&y)?;
        for s in &self.stages {
            y = s.forward(&y)?;
        }
        let y = self.avgpool.forward(&y)?.flatten(1, -1)?;
        self.fc.forward(&y)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("conv1", &self.conv1));
        f(Entry::Child("bn1", &self.bn1));
        for (s, name) in self
            .stages
            .iter()
            .zip(["layer1", "layer2", "layer3", "layer4"])
        {
            f(Entry::Child(name, s));
        }
        f(Entry::Child("fc", &self.fc));
    }
    fn describe(&self) -> String {
        "ResNet".into()
    }
}

/// torchvision's `resnet18(num_classes=...)`.
pub fn resnet18(num_classes: usize) -> Result<ResNet> {
    ResNet::new(Block::Basic, [2, 2, 2, 2], num_classes)
}

/// torchvision's `resnet34(num_classes=...)`.
pub fn resnet34(num_classes: usize) -> Result<ResNet> {
    ResNet::new(Block::Basic, [3, 4, 6, 3], num_classes)
}

/// torchvision's `resnet50(num_classes=...)`.
pub fn resnet50(num_classes: usize) -> Result<ResNet> {
    ResNet::new(Block::Bottleneck, [3, 4, 6, 3], num_classes)
}
