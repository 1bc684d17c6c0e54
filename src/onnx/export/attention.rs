//! The fused `attention` op as its ONNX decomposition, as `torch.onnx`
//! writes `scaled_dot_product_attention` at opset 17: `MatMul(q, k^T)`,
//! `Mul` by the scale, the causal triangle and a bool mask as `Where(.., -inf)`,
//! a float mask as `Add`, `Softmax` over the keys, `MatMul` with v. Key and
//! value heads shared by a GQA group are repeated (`Unsqueeze`, `Expand`,
//! `Reshape`). Where a mask hides a whole row, kiln (as PyTorch's CPU kernel)
//! gives zeros where ONNX's softmax gives NaN, so masked calls add the
//! `Where` that zeroes such rows.

use super::{attr_int, attr_ints, Writer};
use crate::ir::op::attention::{AttentionParams, MaskKind};
use crate::{Result, Tensor};
use kiln_ir::bail;
use kiln_ir::graph::NodeId;

impl Writer<'_> {
    /// Writes the result of an `attention` node (its logsumexp, a training
    /// value, has no ONNX export) under `out`.
    pub(super) fn attention_op(
        &mut self,
        id: NodeId,
        p: &AttentionParams,
        x: &[&str],
        out: &str,
    ) -> Result<()> {
        let ops = self.g.node(id).operands.clone();
        let (qd, kd) = (
            self.meta(ops[0]).dims.clone(),
            self.meta(ops[1]).dims.clone(),
        );
        let dt = self.meta(ops[0]).dtype;
        let (h, hk) = (qd[1], kd[1]);
        let (k, v) = if hk != h && hk != 1 {
            (
                self.repeat_heads(x[1], h / hk)?,
                self.repeat_heads(x[2], h / hk)?,
            )
        } else {
            // one key/value head broadcasts in MatMul
            (x[1].to_string(), x[2].to_string())
        };
        let kt = self.tmp("key_t");
        self.node(
            "Transpose",
            &[&k],
            &[&kt],
            vec![attr_ints("perm", vec![0, 1, 3, 2])],
        );
        let qk = self.tmp("qk");
        self.node("MatMul", &[x[0], &kt], &[&qk], vec![]);
        let scale = self.constant(
            "scale",
            &Tensor::from_vec(vec![p.scale.0], &[])?.to_dtype(dt)?,
        )?;
        let mut scores = self.tmp("scores");
        self.node("Mul", &[&qk, &scale], &[&scores], vec![]);
        let neg_inf = Tensor::from_vec(vec![f64::NEG_INFINITY], &[])?.to_dtype(dt)?;
        let neg_inf = self.constant("neg_inf", &neg_inf)?;
        if p.is_causal {
            let hidden = self.causal_hidden([ops[0], ops[1]], qd[2], kd[2])?;
            let masked = self.tmp("causal_scores");
            self.node("Where", &[&hidden, &neg_inf, &scores], &[&masked], vec![]);
            scores = masked;
        }
        match p.mask {
            MaskKind::None => {}
            MaskKind::Bool => {
                let masked = self.tmp("masked_scores");
                self.node("Where", &[x[3], &scores, &neg_inf], &[&masked], vec![]);
                scores = masked;
            }
            MaskKind::Float => {
                let masked = self.tmp("masked_scores");
                self.node("Add", &[&scores, x[3]], &[&masked], vec![]);
                scores = masked;
            }
        }
        let mut probs = self.tmp("attn_weights");
        self.node("Softmax", &[&scores], &[&probs], vec![attr_int("axis", -1)]);
        if p.mask.present() {
            probs = self.zero_hidden_rows(&scores, &probs, &neg_inf, dt)?;
        }
        self.node("MatMul", &[&probs, &v], &[out], vec![]);
        Ok(())
    }

    /// `[N, Hk, S, E]` as `[N, Hk * group, S, E]`, each head `group` times
    /// (`repeat_interleave` over the heads).
    fn repeat_heads(&mut self, t: &str, group: usize) -> Result<String> {
        let axes = self.ints_const("axes", &[2])?;
        let un = self.tmp("kv_unsqueezed");
        self.node("Unsqueeze", &[t, &axes], &[&un], vec![]);
        let reps = self.ints_const("expand", &[1, 1, group as i64, 1, 1])?;
        let ex = self.tmp("kv_expanded");
        self.node("Expand", &[&un, &reps], &[&ex], vec![]);
        // [N, Hk, G, S, E] -> [N, Hk*G, S, E], N copied, S inferred
        let un_dims = self.tmp("kv_shape");
        self.node("Shape", &[t], &[&un_dims], vec![]);
        let shape = self.tmp("kv_heads_shape");
        let (n, hk, e) = (
            self.gather(&un_dims, 0)?,
            self.gather(&un_dims, 1)?,
            self.gather(&un_dims, 3)?,
        );
        let g = self.ints_const("group", &[group as i64])?;
        let heads = self.tmp("heads");
        self.node("Mul", &[&hk, &g], &[&heads], vec![]);
        let any = self.ints_const("any", &[-1])?;
        self.node(
            "Concat",
            &[&n, &heads, &any, &e],
            &[&shape],
            vec![attr_int("axis", 0)],
        );
        let out = self.tmp("kv_repeated");
        self.node("Reshape", &[&ex, &shape], &[&out], vec![]);
        Ok(out)
    }

    /// Entry `i` of the 1-D i64 tensor `shape`, as a 1-element tensor.
    fn gather(&mut self, shape: &str, i: i64) -> Result<String> {
        let idx = self.ints_const("dim", &[i])?;
        let out = self.tmp("dim");
        self.node("Gather", &[shape, &idx], &[&out], vec![attr_int("axis", 0)]);
        Ok(out)
    }

    /// The constant `[L, S]` bool tensor that is true above the diagonal
    /// (key `j > i`: hidden from query `i`).
    fn causal_hidden(&mut self, qk: [NodeId; 2], l: usize, s: usize) -> Result<String> {
        for id in qk {
            let (base, bumped) = self.dims_pair(id);
            if bumped.is_some_and(|b| b[2] != base[2]) {
                bail!(
                    "onnx::export",
                    "causal attention whose sequence lengths ({l} queries, {s} keys) change with the dynamic dims has no static ONNX export"
                );
            }
        }
        let above: Vec<bool> = (0..l * s).map(|i| i % s > i / s).collect();
        self.constant("causal_hidden", &Tensor::from_vec(above, &[l, s])?)
    }

    /// `probs` with the rows whose every score is `-inf` set to zero.
    fn zero_hidden_rows(
        &mut self,
        scores: &str,
        probs: &str,
        neg_inf: &str,
        dt: crate::DType,
    ) -> Result<String> {
        let rmax = self.tmp("row_max");
        self.reduce("ReduceMax", scores, &rmax, &[-1], true)?;
        let none = self.tmp("row_hidden");
        self.node("Equal", &[&rmax, neg_inf], &[&none], vec![]);
        let zero = self.constant("zero", &Tensor::from_vec(vec![0.0], &[])?.to_dtype(dt)?)?;
        let out = self.tmp("attn_weights_safe");
        self.node("Where", &[&none, &zero, probs], &[&out], vec![]);
        Ok(out)
    }
}
