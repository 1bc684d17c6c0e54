//! Lowering composites to primitives inside a graph: the decomposition table
//! (`decompose`, `decompose_loss`) run against a [`Builder`] that appends graph
//! nodes, so a compiled softmax means exactly what the eager one does.
//!
//! What stays: primitives (pointwise, reductions, views), extern ops (matmul,
//! conv, pools, ...) and BatchNorm in training mode, whose running-stat update
//! is a side effect the runtime performs in place.

use crate::decompose::{self, Builder, Moments};
use crate::decompose_loss::{self as loss, ClassLossOpts};
use kiln_ir::graph::{Constant, Graph, Node, NodeId, NodeOp, ScalarValue};
use kiln_ir::op::Op;
use kiln_ir::shape::Dims;
use kiln_ir::{BinaryOp, DType, Float, ReduceKind, Result, UnaryOp};

/// Appends primitive nodes to a graph.
pub struct GraphBuilder<'a>(pub &'a mut Graph);

impl GraphBuilder<'_> {
    fn meta(&self, x: NodeId) -> &kiln_ir::op::Meta {
        self.0.meta(x).expect("single-valued operand")
    }
    /// A Python number as the builders see it: integral against an integer tensor stays integer.
    fn number(dt: DType, s: f64) -> ScalarValue {
        if !dt.is_float() && s.fract() == 0.0 {
            ScalarValue::Int(s as i64)
        } else {
            ScalarValue::Float(Float(s))
        }
    }
}

impl Builder for GraphBuilder<'_> {
    type T = NodeId;
    fn dims(&self, x: &NodeId) -> Dims {
        self.meta(*x).dims.clone()
    }
    fn dtype(&self, x: &NodeId) -> DType {
        self.meta(*x).dtype
    }
    fn unary(&mut self, op: UnaryOp, x: &NodeId) -> Result<NodeId> {
        self.0.op(Op::Unary(op), &[*x])
    }
    fn binary(&mut self, op: BinaryOp, a: &NodeId, b: &NodeId) -> Result<NodeId> {
        self.0.op(Op::Binary(op), &[*a, *b])
    }
    fn scalar(&mut self, op: BinaryOp, a: &NodeId, s: f64) -> Result<NodeId> {
        let value = Self::number(self.dtype(a), s);
        self.0.op(
            Op::BinaryScalar {
                op,
                value,
                reversed: false,
            },
            &[*a],
        )
    }
    fn select(&mut self, c: &NodeId, a: &NodeId, b: &NodeId) -> Result<NodeId> {
        self.0.op(Op::Where, &[*c, *a, *b])
    }
    fn select_scalar(&mut self, c: &NodeId, a: &NodeId, s: f64) -> Result<NodeId> {
        let k = self.0.constant(Constant::scalar(s, self.dtype(a)))?;
        self.0.op(Op::Where, &[*c, *a, k])
    }
    fn reduce(
        &mut self,
        kind: ReduceKind,
        x: &NodeId,
        dims: &[i64],
        keepdim: bool,
    ) -> Result<NodeId> {
        let dims = dims.to_vec();
        self.0.op(
            Op::Reduce {
                kind,
                dims,
                keepdim,
            },
            &[*x],
        )
    }
    fn mean(&mut self, x: &NodeId, dims: &[i64], keepdim: bool) -> Result<NodeId> {
        let dims = dims.to_vec();
        self.0.op(Op::Mean { dims, keepdim }, &[*x])
    }
    fn reshape(&mut self, x: &NodeId, shape: &[i64]) -> Result<NodeId> {
        self.0.op(Op::View(shape.to_vec()), &[*x])
    }
    fn cast(&mut self, x: &NodeId, dt: DType) -> Result<NodeId> {
        if self.dtype(x) == dt {
            return Ok(*x);
        }
        self.0.op(Op::Cast(dt), &[*x])
    }
    fn gather(&mut self, x: &NodeId, dim: i64, index: &NodeId) -> Result<NodeId> {
        self.0.op(Op::Gather { dim }, &[*x, *index])
    }
    fn lse_parts(&mut self, x: &NodeId, dims: &[i64]) -> Result<(NodeId, NodeId)> {
        let t = self.0.op(
            Op::LseParts {
                dims: dims.to_vec(),
            },
            &[*x],
        )?;
        Ok((self.0.project(t, 0)?, self.0.project(t, 1)?))
    }
    fn moments(&mut self, x: &NodeId, dims: &[i64], eps: f64) -> Result<Moments<NodeId>> {
        let op = Op::Moments {
            dims: dims.to_vec(),
            eps: Float(eps),
        };
        let t = self.0.op(op, &[*x])?;
        Ok(Moments {
            mean: self.0.project(t, 0)?,
            var: self.0.project(t, 1)?,
            rstd: self.0.project(t, 2)?,
        })
    }
}

/// The operand after `x` that a `has_*` flag says is present.
fn take(ops: &[NodeId], at: &mut usize, present: bool) -> Option<NodeId> {
    if !present {
        return None;
    }
    let v = ops.get(*at).copied();
    *at += 1;
    v
}

/// Replaces every composite node by its decomposition (see the module docs).
pub fn decompose_composites(g: &Graph) -> Result<Graph> {
    Ok(decompose_with_map(g)?.0)
}

/// [`decompose_composites`], also returning where each node of `g` went (a
/// composite: the root of its decomposition).
pub fn decompose_with_map(g: &Graph) -> Result<(Graph, Vec<NodeId>)> {
    g.rewrite_with_map(|out, node: &Node, ops| {
        let NodeOp::Op(op) = &node.op else {
            return Ok(None);
        };
        let b = &mut GraphBuilder(out);
        let x = ops.first().copied();
        let y = match op {
            Op::Softmax { dim } => decompose::softmax(b, &x.unwrap(), *dim)?,
            Op::LogSoftmax { dim } => decompose::log_softmax(b, &x.unwrap(), *dim)?,
            Op::LogSumExp { dims, keepdim } => {
                decompose::logsumexp(b, &x.unwrap(), dims, *keepdim)?
            }
            Op::Var {
                dims,
                correction,
                keepdim,
            } => decompose::var(b, &x.unwrap(), dims, correction.0, *keepdim)?,
            Op::Std {
                dims,
                correction,
                keepdim,
            } => decompose::std(b, &x.unwrap(), dims, correction.0, *keepdim)?,
            Op::LayerNorm {
                normalized_shape,
                eps,
                has_weight,
                has_bias,
            } => {
                let mut at = 1;
                let w = take(ops, &mut at, *has_weight);
                let bi = take(ops, &mut at, *has_bias);
                decompose::layer_norm(b, &ops[0], normalized_shape, w.as_ref(), bi.as_ref(), eps.0)?
            }
            Op::GroupNorm {
                groups,
                eps,
                has_weight,
                has_bias,
            } => {
                let mut at = 1;
                let w = take(ops, &mut at, *has_weight);
                let bi = take(ops, &mut at, *has_bias);
                decompose::group_norm(b, &ops[0], *groups, w.as_ref(), bi.as_ref(), eps.0)?
            }
            Op::BatchNorm {
                training: false,
                momentum,
                eps,
                has_running_stats: true,
                has_weight,
                has_bias,
            } => {
                let mut at = 1;
                let rm = take(ops, &mut at, true);
                let rv = take(ops, &mut at, true);
                let w = take(ops, &mut at, *has_weight);
                let bi = take(ops, &mut at, *has_bias);
                let r = decompose::batch_norm(
                    b,
                    &ops[0],
                    rm.as_ref(),
                    rv.as_ref(),
                    w.as_ref(),
                    bi.as_ref(),
                    false,
                    momentum.0,
                    eps.0,
                )?;
                r.y
            }
            Op::CrossEntropy {
                reduction,
                ignore_index,
                label_smoothing,
                has_weight,
            } => {
                let mut at = 2;
                let w = take(ops, &mut at, *has_weight);
                let o = ClassLossOpts {
                    reduction: *reduction,
                    ignore_index: *ignore_index,
                    label_smoothing: label_smoothing.0,
                };
                loss::cross_entropy(b, &ops[0], &ops[1], w.as_ref(), o)?
            }
            Op::NllLoss {
                reduction,
                ignore_index,
                has_weight,
            } => {
                let mut at = 2;
                let w = take(ops, &mut at, *has_weight);
                let o = ClassLossOpts {
                    reduction: *reduction,
                    ignore_index: *ignore_index,
                    label_smoothing: 0.0,
                };
                loss::nll_loss(b, &ops[0], &ops[1], w.as_ref(), o)?
            }
            _ => return Ok(None),
        };
        Ok(Some(y))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lower(text: &str) -> String {
        let g = Graph::parse(text).unwrap();
        let d = decompose_composites(&g).unwrap();
        d.verify().unwrap();
        d.to_text()
    }

    #[test]
    fn softmax_becomes_reductions_and_pointwise() {
        let t = lower(
            "graph s(%0 x: f32[4,8]) {\n  %1 = softmax(%0) {dim=1} : f32[4,8]\n  return %1\n}\n",
        );
        assert!(!t.contains("softmax"), "{t}");
        assert!(t.contains("exp("), "{t}");
    }

    #[test]
    fn train_mode_batch_norm_stays() {
        let g = "graph b(%0 x: f32[2,3,4], %1 m: f32[3], %2 v: f32[3]) {\n  %3 = batch_norm(%0, %1, %2) {eps=1e-5, has_bias=false, has_running_stats=true, has_weight=false, momentum=0.1, training=true} : f32[2,3,4]\n  return %3\n}\n";
        assert!(lower(g).contains("batch_norm"));
    }
}
