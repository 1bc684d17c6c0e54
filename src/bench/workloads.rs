//! The inference workloads W1-W4 (and W2F, W7 as a workload) of
//! `../shared/bench/WORKLOADS.md`: inputs and captured weights made on a
//! device, at the documented sizes or at tiny ones (`kiln bench --quick`, for
//! smoke tests and the CPU emulator of a CUDA device).

use super::{randn, MIB};
use crate::functional as F;
use crate::ir::op::conv::{ConvParams, Padding};
use crate::{Device, Result, Tensor};

/// A workload: its inputs and the computation, shared by eager and compiled runs.
pub struct Workload {
    pub name: &'static str,
    pub what: String,
    pub unit: &'static str,
    /// Bytes (gbps) or flops (gflops) per run.
    pub amount: f64,
    pub inputs: Vec<Tensor>,
    pub f: Box<WorkloadFn>,
}

/// What a workload computes from its inputs.
pub type WorkloadFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

/// Problem sizes: WORKLOADS.md's, or tiny ones that only show the path works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Size {
    #[default]
    Full,
    /// A few thousand elements per tensor: seconds on the CUDA emulator.
    Quick,
}

impl Size {
    /// `full` when `quick` is false.
    pub fn quick(quick: bool) -> Size {
        if quick {
            Size::Quick
        } else {
            Size::Full
        }
    }
    pub(crate) fn pick(self, full: usize, quick: usize) -> usize {
        match self {
            Size::Full => full,
            Size::Quick => quick,
        }
    }
    /// Rows and columns of W2, W2F and W3.
    fn rows_cols(self) -> (usize, usize) {
        (self.pick(4096, 4), self.pick(1024, 64))
    }
}

/// `4M`, `4K` or `100`: an element count as WORKLOADS.md writes it.
fn count(n: usize) -> String {
    match n {
        _ if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{}M", n >> 20),
        _ if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{}K", n >> 10),
        _ => n.to_string(),
    }
}

/// `randn(dims, seed)` on `dev`.
fn randn_on(dims: &[usize], seed: u64, dev: Device) -> Result<Tensor> {
    randn(dims, seed).to_device(dev)
}

/// W1: y = gelu(x*a + b) * 0.5 + x over 4M f32.
pub fn w1() -> Workload {
    w1_at(Size::Full, Device::Cpu).expect("host tensors")
}

/// [`w1`] at `size` on `dev`.
pub fn w1_at(size: Size, dev: Device) -> Result<Workload> {
    let n = size.pick(4 * 1024 * 1024, 4096);
    Ok(Workload {
        name: "W1",
        what: format!("gelu(x*a+b)*0.5+x, {} f32", count(n)),
        unit: "gbps",
        amount: 4.0 * 4.0 * n as f64,
        inputs: vec![
            randn_on(&[n], 1, dev)?,
            randn_on(&[n], 2, dev)?,
            randn_on(&[n], 3, dev)?,
        ],
        f: Box::new(|t: &[Tensor]| {
            let y = t[0].mul(&t[1])?.add(&t[2])?.gelu(false)?;
            Ok(vec![&(&y * 0.5) + &t[0]])
        }),
    })
}

/// W2: softmax over the last dim of (4096, 1024).
pub fn w2() -> Workload {
    w2_at(Size::Full, Device::Cpu).expect("host tensors")
}

/// [`w2`] at `size` on `dev`.
pub fn w2_at(size: Size, dev: Device) -> Result<Workload> {
    let (r, c) = size.rows_cols();
    Ok(Workload {
        name: "W2",
        what: format!("softmax({r}x{c}, dim=-1)"),
        unit: "gbps",
        amount: 2.0 * 4.0 * (r * c) as f64,
        inputs: vec![randn_on(&[r, c], 4, dev)?],
        f: Box::new(|t: &[Tensor]| Ok(vec![t[0].softmax(-1)?])),
    })
}

/// W2F: softmax(x * 0.125 + mask): a softmax fed by pointwise ops (attention scores).
pub fn w2f() -> Workload {
    Workload {
        name: "W2F",
        what: "softmax(x*0.125+mask, dim=-1), 4096x1024".into(),
        unit: "gbps",
        amount: 3.0 * 16.0 * MIB,
        inputs: vec![randn(&[4096, 1024], 4), randn(&[4096, 1024], 18)],
        f: Box::new(|t: &[Tensor]| Ok(vec![(&(&t[0] * 0.125) + &t[1]).softmax(-1)?])),
    }
}

/// W3: layer_norm over the last dim of (4096, 1024) with weight and bias.
pub fn w3() -> Workload {
    w3_at(Size::Full, Device::Cpu).expect("host tensors")
}

/// [`w3`] at `size` on `dev` (weight and bias there too).
pub fn w3_at(size: Size, dev: Device) -> Result<Workload> {
    let (r, c) = size.rows_cols();
    let (w, b) = (randn_on(&[c], 6, dev)?, randn_on(&[c], 7, dev)?);
    Ok(Workload {
        name: "W3",
        what: format!("layer_norm({r}x{c}) affine"),
        unit: "gbps",
        amount: 2.0 * 4.0 * (r * c) as f64,
        inputs: vec![randn_on(&[r, c], 5, dev)?],
        f: Box::new(move |t: &[Tensor]| {
            Ok(vec![F::layer_norm(&t[0], &[c], Some(&w), Some(&b), 1e-5)?])
        }),
    })
}

/// W4: Conv2d(64,64,3,p1) + BatchNorm2d(eval) + ReLU on (8,64,56,56).
pub fn w4() -> Workload {
    w4_at(Size::Full, Device::Cpu).expect("host tensors")
}

/// [`w4`] at `size` on `dev` (every weight and statistic there too).
pub fn w4_at(size: Size, dev: Device) -> Result<Workload> {
    let (n, ch, hw) = (size.pick(8, 2), size.pick(64, 8), size.pick(56, 8));
    let w = (&randn(&[ch, ch, 3, 3], 9) * 0.05).to_device(dev)?;
    let bias = randn_on(&[ch], 10, dev)?;
    let rm = randn_on(&[ch], 11, dev)?;
    let rv = (&randn(&[ch], 12).abs()? + 0.5).to_device(dev)?;
    let (g, beta) = (randn_on(&[ch], 13, dev)?, randn_on(&[ch], 14, dev)?);
    let p = ConvParams {
        padding: Padding::Explicit(vec![1]),
        ..ConvParams::default()
    };
    let flops = 2.0 * (n * ch * ch * 9 * hw * hw) as f64;
    Ok(Workload {
        name: "W4",
        what: format!("Conv2d({ch},{ch},3,p1)+BN(eval)+ReLU, {n}x{ch}x{hw}x{hw}"),
        unit: "gflops",
        amount: flops,
        inputs: vec![randn_on(&[n, ch, hw, hw], 8, dev)?],
        f: Box::new(move |t: &[Tensor]| {
            let y = F::conv2d(&t[0], &w, Some(&bias), &p)?;
            let y = F::batch_norm(
                &y,
                Some(&rm),
                Some(&rv),
                Some(&g),
                Some(&beta),
                false,
                0.1,
                1e-5,
            )?;
            Ok(vec![y.relu()?])
        }),
    })
}

/// W7: (1024,1024) @ (1024,1024) on the host, timed eager and compiled.
pub fn w7() -> Workload {
    w7_at(Size::Full, Device::Cpu).expect("host tensors")
}

/// W7 as a workload (so a device run times it eager and compiled):
/// (1024,1024) @ (1024,1024), or (32,32) @ (32,32) when quick.
pub fn w7_at(size: Size, dev: Device) -> Result<Workload> {
    let k = size.pick(1024, 32);
    Ok(Workload {
        name: "W7",
        what: format!("matmul {k}x{k} @ {k}x{k}"),
        unit: "gflops",
        amount: 2.0 * (k as f64).powi(3),
        inputs: vec![randn_on(&[k, k], 15, dev)?, randn_on(&[k, k], 16, dev)?],
        f: Box::new(|t: &[Tensor]| Ok(vec![F::matmul(&t[0], &t[1])?])),
    })
}
