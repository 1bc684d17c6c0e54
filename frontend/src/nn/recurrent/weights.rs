//! The parameters of one recurrent cell (one layer and direction of an
//! `nn.LSTM`/`GRU`/`RNN`, or a whole `nn.LSTMCell`/`GRUCell`/`RNNCell`),
//! under PyTorch's `state_dict` names.

use super::super::init::uniform_;
use super::super::layers::param;
use super::super::{Entry, EntryMut};
use crate::Tensor;
use kiln_ir::Result;

/// Which recurrence a cell computes; fixes the number of gate blocks in
/// `weight_ih` / `weight_hh` rows and their order (PyTorch's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellKind {
    /// Rows `[i, f, g, o]`.
    Lstm,
    /// Rows `[r, z, n]`, with `n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`.
    Gru,
    /// One block: `h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`.
    RnnTanh,
    /// The same with ReLU.
    RnnRelu,
}

impl CellKind {
    /// Gate blocks stacked in the weight rows.
    pub fn gates(self) -> usize {
        match self {
            CellKind::Lstm => 4,
            CellKind::Gru => 3,
            CellKind::RnnTanh | CellKind::RnnRelu => 1,
        }
    }

    /// PyTorch's `nonlinearity` argument of `nn.RNN` / `nn.RNNCell`.
    pub fn rnn(nonlinearity: &str) -> Result<CellKind> {
        match nonlinearity {
            "tanh" => Ok(CellKind::RnnTanh),
            "relu" => Ok(CellKind::RnnRelu),
            other => kiln_ir::bail!(
                "RNN",
                "unknown nonlinearity '{other}' (expected 'tanh' or 'relu')"
            ),
        }
    }
}

/// `weight_ih{sfx}`, `weight_hh{sfx}`, `bias_ih{sfx}`, `bias_hh{sfx}` and,
/// for an LSTM with `proj_size`, `weight_hr{sfx}`; `sfx` is `_l0`,
/// `_l1_reverse`, ... in a layer and empty in a cell.
pub struct CellWeights {
    pub weight_ih: Tensor,
    pub weight_hh: Tensor,
    pub bias_ih: Option<Tensor>,
    pub bias_hh: Option<Tensor>,
    pub weight_hr: Option<Tensor>,
    names: [String; 5],
}

impl CellWeights {
    /// Fresh weights drawn as PyTorch's `reset_parameters` does: every
    /// parameter uniform in ±1/sqrt(hidden_size).
    pub fn new(
        kind: CellKind,
        input_size: usize,
        hidden_size: usize,
        proj_size: usize,
        bias: bool,
        suffix: &str,
    ) -> Result<CellWeights> {
        let rows = kind.gates() * hidden_size;
        let h_out = if proj_size > 0 {
            proj_size
        } else {
            hidden_size
        };
        let w = CellWeights {
            weight_ih: param(&[rows, input_size]),
            weight_hh: param(&[rows, h_out]),
            bias_ih: bias.then(|| param(&[rows])),
            bias_hh: bias.then(|| param(&[rows])),
            weight_hr: (proj_size > 0).then(|| param(&[proj_size, hidden_size])),
            names: ["weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"]
                .map(|n| format!("{n}{suffix}")),
        };
        let stdv = 1.0 / (hidden_size.max(1) as f64).sqrt();
        let mut all = vec![];
        w.visit(&mut |e| {
            if let Entry::Param(_, t) = e {
                all.push(t.clone())
            }
        });
        for t in &all {
            uniform_(t, -stdv, stdv)?;
        }
        Ok(w)
    }

    /// The parameters in PyTorch's order.
    pub fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        let n = &self.names;
        f(Entry::Param(&n[0], &self.weight_ih));
        f(Entry::Param(&n[1], &self.weight_hh));
        if let Some(b) = &self.bias_ih {
            f(Entry::Param(&n[2], b));
        }
        if let Some(b) = &self.bias_hh {
            f(Entry::Param(&n[3], b));
        }
        if let Some(w) = &self.weight_hr {
            f(Entry::Param(&n[4], w));
        }
    }

    /// [`CellWeights::visit`] with write access, same order.
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        let n = &self.names;
        f(EntryMut::Param(&n[0], &mut self.weight_ih));
        f(EntryMut::Param(&n[1], &mut self.weight_hh));
        if let Some(b) = &mut self.bias_ih {
            f(EntryMut::Param(&n[2], b));
        }
        if let Some(b) = &mut self.bias_hh {
            f(EntryMut::Param(&n[3], b));
        }
        if let Some(w) = &mut self.weight_hr {
            f(EntryMut::Param(&n[4], w));
        }
    }

    /// `hidden_size`: the rows of one gate block.
    pub fn hidden_size(&self, kind: CellKind) -> usize {
        self.weight_ih.dims()[0] / kind.gates()
    }

    /// The size of `h`: `proj_size` when projected, else `hidden_size`.
    pub fn output_size(&self) -> usize {
        self.weight_hh.dims()[1]
    }

    /// The name suffix: `_l0`, `_l1_reverse`, ... (empty in a cell).
    pub fn suffix(&self) -> &str {
        &self.names[0]["weight_ih".len()..]
    }

    pub fn input_size(&self) -> usize {
        self.weight_ih.dims()[1]
    }
}
