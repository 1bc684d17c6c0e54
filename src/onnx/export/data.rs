//! Data movement as ONNX nodes (Slice, Gather for select/embedding/
//! index_select, GatherElements, Where for masked_fill, Expand), and the
//! shapes that depend on a dynamic dim: an entry of a target shape that is
//! `k*batch + c` in the traces is computed at run time from `Shape` of the
//! input the batch comes from, so the file runs at any batch size.

use super::{attr_int, unsupported, Writer};
use crate::ir::op::Op;
use crate::onnx::proto::{attribute_type, AttributeProto};
use crate::onnx::tensor::to_proto;
use crate::{Result, Tensor};
use kiln_ir::graph::{Constant, NodeId, ScalarValue};
use kiln_ir::{bail, Error};

impl Writer<'_> {
    /// The result dims of node `id` at the example sizes and, when the
    /// export has dynamic dims, at the example sizes plus one.
    pub(super) fn dims_pair(&self, id: NodeId) -> (Vec<i64>, Option<Vec<i64>>) {
        let base = self.meta(id).dims.iter().map(|&d| d as i64).collect();
        let bumped = self.bumped.map(|b| {
            b.node(id)
                .meta()
                .expect("a single-result node")
                .dims
                .iter()
                .map(|&d| d as i64)
                .collect()
        });
        (base, bumped)
    }

    /// Whether node `id`'s result shape changes with the dynamic dims.
    pub(super) fn shape_is_dynamic(&self, id: NodeId) -> bool {
        let (base, bumped) = self.dims_pair(id);
        bumped.is_some_and(|b| b != base)
    }

    /// The dynamic dim as a 1-element i64 tensor, read from the shape of
    /// the input it belongs to (made once).
    fn batch_value(&mut self) -> Result<String> {
        if let Some(b) = &self.batch_cache {
            return Ok(b.clone());
        }
        let Some((input, dim)) = self.batch_source.clone() else {
            bail!(
                "onnx::export",
                "a shape depends on the dynamic dims, but the export has {} dynamic dim names (one is supported)",
                self.dynamic_names
            );
        };
        let shape = self.tmp("input_shape");
        self.node("Shape", &[&input], &[&shape], vec![]);
        let idx = self.ints_const("dim", &[dim as i64])?;
        let batch = self.tmp("batch");
        self.node(
            "Gather",
            &[&shape, &idx],
            &[&batch],
            vec![attr_int("axis", 0)],
        );
        self.batch_cache = Some(batch.clone());
        Ok(batch)
    }

    /// A 1-D i64 tensor holding node `id`'s result shape, with the entries
    /// that change with the dynamic dim computed at run time as `k*batch + c`.
    pub(super) fn shape_value(&mut self, id: NodeId) -> Result<String> {
        let (base, bumped) = self.dims_pair(id);
        let Some(bumped) = bumped.filter(|b| *b != base) else {
            return self.ints_const("shape", &base);
        };
        let n = self.example_batch as i64;
        let mut parts: Vec<String> = vec![];
        let mut fixed: Vec<i64> = vec![];
        for (&b, &b1) in base.iter().zip(&bumped) {
            if b == b1 {
                fixed.push(b);
                continue;
            }
            if !fixed.is_empty() {
                let f = std::mem::take(&mut fixed);
                parts.push(self.ints_const("shape", &f)?);
            }
            let (k, c) = (b1 - b, b - (b1 - b) * n);
            let batch = self.batch_value()?;
            let mut v = batch;
            if k != 1 {
                let kc = self.ints_const("k", &[k])?;
                let out = self.tmp("dim");
                self.node("Mul", &[&v, &kc], &[&out], vec![]);
                v = out;
            }
            if c != 0 {
                let cc = self.ints_const("c", &[c])?;
                let out = self.tmp("dim");
                self.node("Add", &[&v, &cc], &[&out], vec![]);
                v = out;
            }
            parts.push(v);
        }
        if !fixed.is_empty() {
            parts.push(self.ints_const("shape", &fixed)?);
        }
        if parts.len() == 1 {
            return Ok(parts.remove(0));
        }
        let out = self.tmp("shape");
        let refs: Vec<&str> = parts.iter().map(|s| s.as_str()).collect();
        self.node("Concat", &refs, &[&out], vec![attr_int("axis", 0)]);
        Ok(out)
    }

    /// A constant whose shape depends on the dynamic dim (an LSTM's zero
    /// initial state): `ConstantOfShape` of the run-time shape.
    pub(super) fn dynamic_const(&mut self, id: NodeId, c: &Constant) -> Result<()> {
        if c.values.len() != 1 {
            bail!(
                "onnx::export",
                "a constant of {} distinct values whose shape depends on the dynamic dims has no ONNX export",
                c.values.len()
            );
        }
        let shape = self.shape_value(id)?;
        let v = Tensor::from_vec(vec![c.values[0].0], &[1])?.to_dtype(c.meta.dtype)?;
        let value = AttributeProto {
            name: "value".into(),
            r#type: attribute_type::TENSOR,
            t: Some(to_proto("value", &v)?),
            ..Default::default()
        };
        let out = self.names[id.index()].clone();
        self.node("ConstantOfShape", &[&shape], &[&out], vec![value]);
        Ok(())
    }

    /// An error unless node `id`'s op is the same at the bumped sizes (its
    /// attributes are written as constants).
    fn static_op(&self, id: NodeId, op: &Op) -> Result<()> {
        if let Some(b) = self.bumped {
            if !matches!(&b.node(id).op, kiln_ir::graph::NodeOp::Op(o) if o == op) {
                return Err(Error::op(
                    "onnx::export",
                    format!(
                        "`{}` has attributes that change with the dynamic dims; no static ONNX export",
                        op.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A select's index as ONNX Gather takes it: as is, or counted from the
    /// end (`out[:, -1]` of a dynamic sequence) when it moves with the dim's size.
    fn select_index(&self, id: NodeId, dim: i64, index: i64) -> Result<i64> {
        let src = self.g.node(id).operands[0];
        let d = dim.rem_euclid(self.meta(src).dims.len().max(1) as i64) as usize;
        let size = self.meta(src).dims[d] as i64;
        let Some(b) = self.bumped else {
            return Ok(index);
        };
        let (bsize, bindex) = match (&b.node(id).op, b.node(src).meta()) {
            (kiln_ir::graph::NodeOp::Op(Op::Select { index: i, .. }), Some(m)) => {
                (m.dims[d] as i64, *i)
            }
            _ => (size, index),
        };
        if bindex == index {
            Ok(index)
        } else if bindex - bsize == index - size {
            Ok(index - size)
        } else {
            Err(Error::op(
                "onnx::export",
                format!("select's index {index} of dim {dim} changes with the dynamic dims other than from the end; no static ONNX Gather"),
            ))
        }
    }

    /// Slice, select, expand, embedding, index_select, gather and
    /// masked_fill; `Ok(false)` for any other op.
    pub(super) fn data_op(&mut self, id: NodeId, op: &Op, x: &[&str], out: &str) -> Result<bool> {
        let o = [out];
        match op {
            Op::Slice {
                dim,
                start,
                stop,
                step,
            } => {
                self.static_op(id, op)?;
                if *step < 1 {
                    return Err(unsupported("slice with a step below 1"));
                }
                let starts = self.ints_const("starts", &[start.unwrap_or(0)])?;
                let ends = self.ints_const("ends", &[stop.unwrap_or(i64::MAX)])?;
                let axes = self.ints_const("axes", &[*dim])?;
                let steps = self.ints_const("steps", &[*step])?;
                self.node("Slice", &[x[0], &starts, &ends, &axes, &steps], &o, vec![]);
            }
            Op::Select { dim, index } => {
                let i = self.select_index(id, *dim, *index)?;
                let i = self.constant("index", &Tensor::from_vec(vec![i], &[])?)?;
                self.node("Gather", &[x[0], &i], &o, vec![attr_int("axis", *dim)]);
            }
            Op::Expand(_) => {
                let shape = self.shape_value(id)?;
                self.node("Expand", &[x[0], &shape], &o, vec![]);
            }
            // operands: indices, weight
            Op::Embedding => self.node("Gather", &[x[1], x[0]], &o, vec![attr_int("axis", 0)]),
            Op::IndexSelect { dim } => {
                self.node("Gather", &x[..2], &o, vec![attr_int("axis", *dim)])
            }
            Op::Gather { dim } => {
                self.node("GatherElements", &x[..2], &o, vec![attr_int("axis", *dim)])
            }
            // operands: x, mask[, value]
            Op::MaskedFill { value } => {
                let v = match value {
                    Some(v) => {
                        let dt = self.meta(self.g.node(id).operands[0]).dtype;
                        let f = match v {
                            ScalarValue::Bool(b) => *b as i64 as f64,
                            ScalarValue::Int(i) => *i as f64,
                            ScalarValue::Float(f) => f.0,
                        };
                        self.constant("fill", &Tensor::from_vec(vec![f], &[])?.to_dtype(dt)?)?
                    }
                    None => x[2].to_string(),
                };
                self.node("Where", &[x[1], &v, x[0]], &o, vec![]);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}
