//! Layers as their ONNX ops: Gemm/MatMul for a Linear, Conv,
//! ConvTranspose, BatchNormalization (eval), LayerNormalization and the
//! pools.

use super::{attr_float, attr_int, attr_ints, unsupported, Writer};
use crate::ir::op::conv::resolve_padding;
use crate::ir::op::Op;
use crate::{Result, Tensor};
use kiln_ir::bail;
use kiln_ir::graph::NodeId;

impl Writer<'_> {
    /// One layer op (a Linear, a convolution, or see `norm_op`/`pool_op`);
    /// `Ok(false)` when `op` is not one.
    pub(super) fn layer_op(&mut self, id: NodeId, op: &Op, x: &[&str], out: &str) -> Result<bool> {
        let node = self.g.node(id);
        let o = [out];
        match op {
            Op::Linear => {
                if self.meta(node.operands[0]).dims.len() == 2 {
                    self.node("Gemm", &x, &o, vec![attr_int("transB", 1)]);
                } else {
                    let wt = self.tmp("weight_t");
                    self.node(
                        "Transpose",
                        &[x[1]],
                        &[&wt],
                        vec![attr_ints("perm", vec![1, 0])],
                    );
                    if x.len() > 2 {
                        let mm = self.tmp("matmul");
                        self.node("MatMul", &[x[0], &wt], &[&mm], vec![]);
                        self.node("Add", &[&mm, x[2]], &o, vec![]);
                    } else {
                        self.node("MatMul", &[x[0], &wt], &o, vec![]);
                    }
                }
            }
            Op::Conv { params, spatial } => {
                let wdims = &self.meta(node.operands[1]).dims;
                let kernel: Vec<usize> = wdims[2..].to_vec();
                let s = *spatial;
                let per = |v: &[usize]| -> Vec<usize> {
                    if v.len() == 1 {
                        vec![v[0]; s]
                    } else {
                        v.to_vec()
                    }
                };
                let (stride, dil) = (per(&params.stride), per(&params.dilation));
                let pads = resolve_padding("conv", &params.padding, &kernel, &dil, &stride)?;
                let mut p: Vec<i64> = pads.iter().map(|x| x.0 as i64).collect();
                p.extend(pads.iter().map(|x| x.1 as i64));
                let attrs = vec![
                    attr_ints("kernel_shape", kernel.iter().map(|&k| k as i64).collect()),
                    attr_ints("strides", stride.iter().map(|&k| k as i64).collect()),
                    attr_ints("dilations", dil.iter().map(|&k| k as i64).collect()),
                    attr_ints("pads", p),
                    attr_int("group", params.groups as i64),
                ];
                self.node("Conv", &x, &o, attrs);
            }
            Op::ConvTranspose2d(p) => {
                let wdims = &self.meta(node.operands[1]).dims;
                let two = |v: &[usize]| -> Vec<i64> {
                    if v.len() == 1 {
                        vec![v[0] as i64; 2]
                    } else {
                        v.iter().map(|&k| k as i64).collect()
                    }
                };
                let pad = two(&p.padding);
                let attrs = vec![
                    attr_ints(
                        "kernel_shape",
                        wdims[2..].iter().map(|&k| k as i64).collect(),
                    ),
                    attr_ints("strides", two(&p.stride)),
                    attr_ints("dilations", two(&p.dilation)),
                    attr_ints("pads", [pad.clone(), pad].concat()),
                    attr_ints("output_padding", two(&p.output_padding)),
                    attr_int("group", p.groups as i64),
                ];
                self.node("ConvTranspose", x, &o, attrs);
            }
            _ => return Ok(self.norm_op(id, op, x, out)? || self.pool_op(id, op, x, out)?),
        }
        Ok(true)
    }

    /// BatchNormalization (eval) and LayerNormalization; `Ok(false)` for other ops.
    fn norm_op(&mut self, id: NodeId, op: &Op, x: &[&str], out: &str) -> Result<bool> {
        let node = self.g.node(id);
        let o = [out];
        match op {
            Op::BatchNorm {
                training: false,
                eps,
                has_running_stats: true,
                has_weight,
                has_bias,
                ..
            } => {
                let c = self.meta(node.operands[0]).dims[1];
                let dt = self.meta(node.operands[0]).dtype;
                let (mean, var) = (x[1], x[2]);
                let mut k = 3;
                let scale = if *has_weight {
                    k += 1;
                    x[k - 1].to_string()
                } else {
                    self.constant("ones", &Tensor::ones(&[c], dt))?
                };
                let bias = if *has_bias {
                    x[k].to_string()
                } else {
                    self.constant("zeros", &Tensor::zeros(&[c], dt))?
                };
                self.node(
                    "BatchNormalization",
                    &[x[0], &scale, &bias, mean, var],
                    &o,
                    vec![attr_float("epsilon", eps.0)],
                );
            }
            Op::LayerNorm {
                normalized_shape,
                eps,
                has_weight,
                has_bias,
            } => {
                if self.opset < 17 {
                    bail!(
                        "onnx::export",
                        "layer_norm needs opset 17 or later (LayerNormalization), got {}",
                        self.opset
                    );
                }
                let dt = self.meta(node.operands[0]).dtype;
                let scale = if *has_weight {
                    x[1].to_string()
                } else {
                    self.constant("ones", &Tensor::ones(normalized_shape, dt))?
                };
                let mut args = vec![x[0].to_string(), scale];
                if *has_bias {
                    args.push(x[if *has_weight { 2 } else { 1 }].to_string());
                }
                let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                let attrs = vec![
                    attr_int("axis", -(normalized_shape.len() as i64)),
                    attr_float("epsilon", eps.0),
                ];
                self.node("LayerNormalization", &a, &o, attrs);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The pools; `Ok(false)` for other ops.
    fn pool_op(&mut self, id: NodeId, op: &Op, x: &[&str], out: &str) -> Result<bool> {
        let node = self.g.node(id);
        let o = [out];
        match op {
            Op::AdaptiveAvgPool2d(size) => {
                let d = &self.meta(node.operands[0]).dims;
                let (h, w) = (d[d.len() - 2], d[d.len() - 1]);
                if *size == [1, 1] {
                    self.node("GlobalAveragePool", &x, &o, vec![]);
                } else if h % size[0] == 0 && w % size[1] == 0 {
                    let k = vec![(h / size[0]) as i64, (w / size[1]) as i64];
                    self.node(
                        "AveragePool",
                        &x,
                        &o,
                        vec![
                            attr_ints("kernel_shape", k.clone()),
                            attr_ints("strides", k),
                        ],
                    );
                } else {
                    bail!("onnx::export", "adaptive_avg_pool2d from {h}x{w} to {size:?} has no ONNX export (sizes must divide)");
                }
            }
            Op::MaxPool2d(p) | Op::AvgPool2d { params: p, .. } => {
                let mut attrs = vec![
                    attr_ints("kernel_shape", p.kernel.iter().map(|&k| k as i64).collect()),
                    attr_ints("strides", p.stride.iter().map(|&k| k as i64).collect()),
                    attr_ints(
                        "pads",
                        [p.padding, p.padding]
                            .concat()
                            .iter()
                            .map(|&k| k as i64)
                            .collect(),
                    ),
                    attr_int("ceil_mode", p.ceil_mode as i64),
                ];
                let name = if let Op::AvgPool2d {
                    count_include_pad, ..
                } = op
                {
                    if p.dilation != [1, 1] {
                        return Err(unsupported("avg_pool2d with dilation"));
                    }
                    attrs.push(attr_int("count_include_pad", *count_include_pad as i64));
                    "AveragePool"
                } else {
                    attrs.push(attr_ints(
                        "dilations",
                        p.dilation.iter().map(|&k| k as i64).collect(),
                    ));
                    "MaxPool"
                };
                self.node(name, &x[..1], &o, attrs);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}
