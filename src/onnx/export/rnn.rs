//! An `nn.LSTM` / `nn.GRU` scope as ONNX `LSTM` / `GRU` nodes, as
//! `torch.onnx.export` writes them: one node per layer (both directions in
//! one node when bidirectional), the weights regrouped into ONNX's gate
//! order (PyTorch's LSTM `i, f, g, o` -> ONNX `i, o, f, c`; GRU `r, z, n`
//! -> `z, r, h` with `linear_before_reset=1`, which is PyTorch's
//! formula), `W`/`R` initializers of shape `[D, gates*H, in]` and
//! `B = [Wb, Rb]`, time-major layout with Transposes around a batch-first
//! module, `Y` `[T, D, B, H]` reshaped to `[T, B, D*H]` for the next layer,
//! and `Y_h`/`Y_c` concatenated over the layers. Nothing depends on the
//! sequence length, so the file runs at any (dynamic) length and batch.

use super::{attr_int, attr_ints, attr_string, Writer};
use crate::export::scopes::Scope;
use crate::{Result, Tensor};
use kiln_ir::bail;
use kiln_ir::graph::NodeId;

/// PyTorch's gate blocks in the order ONNX stacks them.
const LSTM_ORDER: [usize; 4] = [0, 3, 1, 2];
const GRU_ORDER: [usize; 3] = [1, 0, 2];

impl Writer<'_> {
    /// Writes scope `s` (an `rnn` scope: see `nn::recurrent::layer`).
    pub(super) fn rnn_scope(&mut self, s: &Scope) -> Result<()> {
        let lstm = s.attr("mode")? == 0;
        let (layers, dirs) = (
            s.attr("num_layers")? as usize,
            1 + s.attr("bidirectional")? as usize,
        );
        let hidden = s.attr("hidden_size")? as usize;
        let name = |id: Option<NodeId>, w: &Writer| id.map(|i| w.names[i.index()].clone());
        let Some(x) = name(s.input("input"), self) else {
            bail!("onnx::export", "an LSTM/GRU scope without its input");
        };
        let (h0, c0) = (name(s.input("h0"), self), name(s.input("c0"), self));
        let out_name = |k: usize, w: &Writer| w.names[s.outputs[k].index()].clone();
        let batch_first = s.attr("batch_first")? != 0;
        let mut layer_in = if batch_first {
            let t = self.tmp("time_major");
            self.node(
                "Transpose",
                &[&x],
                &[&t],
                vec![attr_ints("perm", vec![1, 0, 2])],
            );
            t
        } else {
            x
        };
        let (mut hs, mut cs) = (vec![], vec![]);
        for l in 0..layers {
            let [w, r, b] = self.rnn_weights(s, lstm, l, dirs, hidden)?;
            let slice = |w: &mut Writer, t: &Option<String>| -> Result<String> {
                let Some(t) = t else { return Ok(String::new()) };
                let out = w.tmp("state");
                let (st, en) = (
                    w.ints_const("starts", &[(l * dirs) as i64])?,
                    w.ints_const("ends", &[((l + 1) * dirs) as i64])?,
                );
                let ax = w.ints_const("axes", &[0])?;
                w.node("Slice", &[t, &st, &en, &ax], &[&out], vec![]);
                Ok(out)
            };
            let (h, c) = (slice(self, &h0)?, slice(self, &c0)?);
            let (y, yh, yc) = (self.tmp("Y"), self.tmp("Y_h"), self.tmp("Y_c"));
            let mut attrs = vec![attr_int("hidden_size", hidden as i64)];
            if dirs == 2 {
                attrs.push(attr_string("direction", "bidirectional"));
            }
            if lstm {
                let ins = [layer_in.as_str(), &w, &r, &b, "", &h, &c];
                self.node("LSTM", &ins, &[&y, &yh, &yc], attrs);
            } else {
                attrs.push(attr_int("linear_before_reset", 1));
                let ins = [layer_in.as_str(), &w, &r, &b, "", &h];
                self.node("GRU", &ins, &[&y, &yh], attrs);
            }
            // Y: [T, D, B, H] -> [T, B, D*H]
            let t = self.tmp("Y_t");
            self.node(
                "Transpose",
                &[&y],
                &[&t],
                vec![attr_ints("perm", vec![0, 2, 1, 3])],
            );
            let last = l + 1 == layers;
            let out = if last && !batch_first {
                out_name(0, self)
            } else {
                self.tmp("layer_out")
            };
            let shape = self.ints_const("shape", &[0, 0, -1])?;
            self.node("Reshape", &[&t, &shape], &[&out], vec![]);
            layer_in = out;
            hs.push(yh);
            cs.push(yc);
        }
        if batch_first {
            let out = out_name(0, self);
            self.node(
                "Transpose",
                &[&layer_in],
                &[&out],
                vec![attr_ints("perm", vec![1, 0, 2])],
            );
        }
        let finals = [Some(hs), lstm.then_some(cs)];
        for (k, v) in finals.into_iter().flatten().enumerate() {
            if let Some(o) = s.outputs.get(1 + k) {
                let o = self.names[o.index()].clone();
                let refs: Vec<&str> = v.iter().map(|s| s.as_str()).collect();
                self.node("Concat", &refs, &[&o], vec![attr_int("axis", 0)]);
            }
        }
        Ok(())
    }

    /// Layer `l`'s `W`, `R` and `B` initializers (`B` empty without biases).
    fn rnn_weights(
        &mut self,
        s: &Scope,
        lstm: bool,
        l: usize,
        dirs: usize,
        hidden: usize,
    ) -> Result<[String; 3]> {
        let _ng = crate::autograd::no_grad();
        let order: &[usize] = if lstm { &LSTM_ORDER } else { &GRU_ORDER };
        let mut per = [vec![], vec![], vec![]];
        for d in 0..dirs {
            let sfx = format!("_l{l}{}", if d == 1 { "_reverse" } else { "" });
            let w = self.scope_weight(s, &format!("weight_ih{sfx}"))?;
            let r = self.scope_weight(s, &format!("weight_hh{sfx}"))?;
            per[0].push(regroup(&w.expect("weight_ih"), order, hidden)?);
            per[1].push(regroup(&r.expect("weight_hh"), order, hidden)?);
            let bi = self.scope_weight(s, &format!("bias_ih{sfx}"))?;
            let bh = self.scope_weight(s, &format!("bias_hh{sfx}"))?;
            if let (Some(bi), Some(bh)) = (bi, bh) {
                let b = Tensor::cat(
                    &[&regroup(&bi, order, hidden)?, &regroup(&bh, order, hidden)?],
                    0,
                )?;
                per[2].push(b);
            }
        }
        let mut out = [String::new(), String::new(), String::new()];
        for (k, what) in ["W", "R", "B"].iter().enumerate() {
            if per[k].is_empty() {
                continue;
            }
            let t = Tensor::stack(&per[k].iter().collect::<Vec<_>>(), 0)?.contiguous()?;
            out[k] = self.constant(what, &t)?;
        }
        Ok(out)
    }

    /// The tensor behind the scope's weight `role` (a graph input bound to a weight).
    fn scope_weight(&self, s: &Scope, role: &str) -> Result<Option<Tensor>> {
        let Some(id) = s.input(role) else {
            if role.starts_with("weight") {
                bail!("onnx::export", "the LSTM/GRU scope lacks `{role}`");
            }
            return Ok(None);
        };
        let key = &self.names[id.index()];
        match self.weights.iter().find(|(k, _)| k == key) {
            Some((_, t)) => Ok(Some(t.clone())),
            None => bail!(
                "onnx::export",
                "the LSTM/GRU weight `{role}` (`{key}`) is computed in the model, not a parameter; ONNX LSTM/GRU need constant weights"
            ),
        }
    }
}

/// The gate blocks of `t` (rows, or elements of a bias) in `order`.
fn regroup(t: &Tensor, order: &[usize], hidden: usize) -> Result<Tensor> {
    let blocks: Vec<Tensor> = order
        .iter()
        .map(|&g| t.narrow(0, (g * hidden) as i64, hidden))
        .collect::<Result<_>>()?;
    Tensor::cat(&blocks.iter().collect::<Vec<_>>(), 0)
}
