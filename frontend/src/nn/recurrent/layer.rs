//! `nn.LSTM`, `nn.GRU`, `nn.RNN`: stacked, optionally bidirectional
//! recurrences over a sequence.
//!
//! Each layer and direction first projects the whole sequence through
//! `weight_ih` in one GEMM; the loop over time then only multiplies by
//! `weight_hh` and applies the gate math of [`super::step`]. The loop is
//! plain Rust over kiln ops, so `compile` unrolls it into one graph (the
//! sequence length is part of the input shape guard).

use super::step::{step, Projections, State};
use super::weights::{CellKind, CellWeights};
use super::{check_state, py_bool_arg};
use crate::nn::{Dropout, Entry, EntryMut, Module, Training};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// The constructor arguments of `nn.LSTM` / `nn.GRU` / `nn.RNN` after
/// `input_size` and `hidden_size`, with PyTorch's defaults (`Default`).
/// `proj_size` is for LSTM only and `nonlinearity` (`"tanh"`, `"relu"`)
/// for RNN only; the other layers refuse a non-default value.
#[derive(Debug, Clone, PartialEq)]
pub struct RnnOptions {
    pub num_layers: usize,
    pub bias: bool,
    pub batch_first: bool,
    /// Dropout on the outputs of every layer but the last, in training.
    pub dropout: f64,
    pub bidirectional: bool,
    pub proj_size: usize,
    pub nonlinearity: String,
}

impl Default for RnnOptions {
    fn default() -> Self {
        RnnOptions {
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
            proj_size: 0,
            nonlinearity: "tanh".into(),
        }
    }
}

/// What LSTM, GRU and RNN share: the options and one [`CellWeights`] per
/// layer and direction (index `layer * directions + direction`).
pub(crate) struct Stack {
    pub(crate) kind: CellKind,
    input_size: usize,
    hidden_size: usize,
    opts: RnnOptions,
    pub(crate) cells: Vec<CellWeights>,
    dropout: Dropout,
    training: Training,
}

impl Stack {
    fn new(
        kind: CellKind,
        input_size: usize,
        hidden_size: usize,
        opts: RnnOptions,
    ) -> Result<Stack> {
        let op = name(kind);
        if hidden_size == 0 || opts.num_layers == 0 {
            bail!(
                op,
                "hidden_size ({hidden_size}) and num_layers ({}) must be positive",
                opts.num_layers
            );
        }
        if opts.proj_size > 0 && (kind != CellKind::Lstm || opts.proj_size >= hidden_size) {
            bail!(
                op,
                "proj_size={} needs an LSTM with hidden_size > proj_size (hidden_size={hidden_size})",
                opts.proj_size
            );
        }
        let rnn = matches!(kind, CellKind::RnnTanh | CellKind::RnnRelu);
        if !rnn && opts.nonlinearity != "tanh" {
            bail!(
                op,
                "nonlinearity='{}' is an nn.RNN argument",
                opts.nonlinearity
            );
        }
        let dirs = if opts.bidirectional { 2 } else { 1 };
        let h_out = if opts.proj_size > 0 {
            opts.proj_size
        } else {
            hidden_size
        };
        let mut cells = vec![];
        for layer in 0..opts.num_layers {
            let layer_in = if layer == 0 { input_size } else { h_out * dirs };
            for dir in 0..dirs {
                let sfx = format!("_l{layer}{}", if dir == 1 { "_reverse" } else { "" });
                cells.push(CellWeights::new(
                    kind,
                    layer_in,
                    hidden_size,
                    opts.proj_size,
                    opts.bias,
                    &sfx,
                )?);
            }
        }
        Ok(Stack {
            kind,
            input_size,
            hidden_size,
            dropout: Dropout::new(opts.dropout)?,
            opts,
            cells,
            training: Training::default(),
        })
    }

    /// Whether the layer projects `h` (`proj_size > 0`).
    pub(crate) fn proj_size(&self) -> usize {
        self.opts.proj_size
    }

    pub(crate) fn describe_layer(&self) -> String {
        self.describe()
    }

    fn dirs(&self) -> usize {
        if self.opts.bidirectional {
            2
        } else {
            1
        }
    }

    fn h_out(&self) -> usize {
        self.cells[0].output_size()
    }

    /// `layer(input, hx)` -> `[output, h_n]` (and `c_n` for an LSTM).
    /// An ONNX export sees an LSTM or GRU as one scope (written as ONNX
    /// `LSTM`/`GRU` nodes, see `trace::export_scope`); any other trace sees
    /// the ops of the unrolled loop.
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let run = || self.run_with(inputs, self.cells.as_slice());
        let batched = inputs
            .first()
            .copied()
            .flatten()
            .is_some_and(|x| x.rank() == 3);
        let mode = match self.kind {
            CellKind::Lstm => 0,
            CellKind::Gru => 1,
            _ => return run(),
        };
        // ONNX's LSTM has no projection; such layers export as their steps
        if !crate::compile::trace::scopes_wanted() || !batched || self.opts.proj_size > 0 {
            return run();
        }
        let o = &self.opts;
        let attrs = vec![
            ("mode", mode),
            ("input_size", self.input_size as i64),
            ("hidden_size", self.hidden_size as i64),
            ("num_layers", o.num_layers as i64),
            ("bidirectional", o.bidirectional as i64),
            ("batch_first", o.batch_first as i64),
            ("bias", o.bias as i64),
        ];
        let mut ins: Vec<(String, Option<&Tensor>)> = ["input", "h0", "c0"]
            .iter()
            .enumerate()
            .map(|(i, r)| (r.to_string(), inputs.get(i).copied().flatten()))
            .collect();
        for (idx, c) in self.cells.iter().enumerate() {
            let rev = if idx % self.dirs() == 1 {
                "_reverse"
            } else {
                ""
            };
            let sfx = format!("_l{}{rev}", idx / self.dirs());
            ins.push((format!("weight_ih{sfx}"), Some(&c.weight_ih)));
            ins.push((format!("weight_hh{sfx}"), Some(&c.weight_hh)));
            ins.push((format!("bias_ih{sfx}"), c.bias_ih.as_ref()));
            ins.push((format!("bias_hh{sfx}"), c.bias_hh.as_ref()));
        }
        crate::compile::trace::export_scope("rnn", attrs, &ins, run)
    }

    /// [`Stack::run`] with the products computed by `proj` (the quantized
    /// LSTM's int8 kernels) instead of this stack's float weights.
    pub(crate) fn run_with(
        &self,
        inputs: &[Option<&Tensor>],
        proj: &(impl Projections + ?Sized),
    ) -> Result<Vec<Tensor>> {
        let op = name(self.kind);
        let lstm = self.kind == CellKind::Lstm;
        let n_state = if lstm { 2 } else { 1 };
        let Some(Some(x)) = inputs.first() else {
            bail!(
                op,
                "the input is missing (forward_many(&[Some(input), ...]))"
            );
        };
        if inputs.len() > 1 + n_state {
            bail!(
                op,
                "takes the input and {n_state} state tensor(s), got {} arguments",
                inputs.len()
            );
        }
        let unbatched = match x.rank() {
            2 => true,
            3 => false,
            _ => bail!(
                op,
                "expected a 2-D (unbatched) or 3-D input, got {}",
                fmt_dims(x.dims())
            ),
        };
        if x.dims()[x.rank() - 1] != self.input_size {
            bail!(
                op,
                "input has {} features ({}), the layer was built for input_size={}",
                x.dims()[x.rank() - 1],
                fmt_dims(x.dims()),
                self.input_size
            );
        }
        // time-major (T, B, F) from here on
        let seq = if unbatched {
            x.unsqueeze(1)?
        } else if self.opts.batch_first {
            x.transpose(0, 1)?
        } else {
            (*x).clone()
        };
        let (steps, batch) = (seq.dims()[0], seq.dims()[1]);
        if steps == 0 {
            bail!(op, "the input sequence is empty ({})", fmt_dims(x.dims()));
        }
        let initial = self.initial_states(op, inputs, unbatched, batch, x)?;
        let mut layer_in = seq;
        let (mut h_n, mut c_n) = (vec![], vec![]);
        for layer in 0..self.opts.num_layers {
            let mut outs = vec![];
            for dir in 0..self.dirs() {
                let idx = layer * self.dirs() + dir;
                let (out, last) = self.direction(proj, idx, &layer_in, &initial[idx], dir == 1)?;
                outs.push(out);
                h_n.push(last.h);
                c_n.extend(last.c);
            }
            layer_in = match outs.as_slice() {
                [one] => one.clone(),
                two => Tensor::cat(&two.iter().collect::<Vec<_>>(), -1)?,
            };
            if layer + 1 < self.opts.num_layers {
                layer_in = self.dropout.forward(&layer_in)?;
            }
        }
        let output = if unbatched {
            layer_in.squeeze(Some(&[1]))?
        } else if self.opts.batch_first {
            layer_in.transpose(0, 1)?
        } else {
            layer_in
        };
        let mut result = vec![output];
        for finals in [h_n, c_n] {
            if finals.is_empty() {
                continue;
            }
            let t = Tensor::stack(&finals.iter().collect::<Vec<_>>(), 0)?;
            result.push(if unbatched { t.squeeze(Some(&[1]))? } else { t });
        }
        Ok(result)
    }

    /// The per-(layer, direction) initial states from `hx` (checked against
    /// PyTorch's shapes), or zeros.
    fn initial_states(
        &self,
        op: &str,
        inputs: &[Option<&Tensor>],
        unbatched: bool,
        batch: usize,
        x: &Tensor,
    ) -> Result<Vec<State>> {
        let lstm = self.kind == CellKind::Lstm;
        let given: Vec<Option<&Tensor>> = (0..if lstm { 2 } else { 1 })
            .map(|k| inputs.get(1 + k).copied().flatten())
            .collect();
        if given.iter().any(|t| t.is_some()) && given.iter().any(|t| t.is_none()) {
            bail!(op, "hx = (h_0, c_0) must be given both or neither");
        }
        let layers = self.opts.num_layers * self.dirs();
        let sizes = [self.h_out(), self.hidden_size];
        let mut per_kind: Vec<Vec<Tensor>> = vec![];
        for (k, t) in given.iter().enumerate() {
            let want: Vec<usize> = if unbatched {
                vec![layers, sizes[k]]
            } else {
                vec![layers, batch, sizes[k]]
            };
            per_kind.push(match t {
                Some(t) => {
                    check_state(op, ["h_0", "c_0"][k], t, &want)?;
                    let t = if unbatched {
                        t.unsqueeze(1)?
                    } else {
                        (*t).clone()
                    };
                    (0..layers)
                        .map(|i| t.select(0, i as i64))
                        .collect::<Result<_>>()?
                }
                None => (0..layers)
                    .map(|_| Tensor::zeros(&[batch, sizes[k]], x.dtype()))
                    .collect(),
            });
        }
        Ok((0..layers)
            .map(|i| State {
                h: per_kind[0][i].clone(),
                c: per_kind.get(1).map(|c| c[i].clone()),
            })
            .collect())
    }

    /// One layer and direction over the whole sequence `seq` (T, B, F):
    /// the outputs (T, B, H_out) in time order and the last state.
    fn direction(
        &self,
        p: &(impl Projections + ?Sized),
        idx: usize,
        seq: &Tensor,
        init: &State,
        reverse: bool,
    ) -> Result<(Tensor, State)> {
        let proj = p.input(idx, seq)?;
        let steps = seq.dims()[0];
        let mut state = init.clone();
        let mut outs: Vec<Option<Tensor>> = vec![None; steps];
        for k in 0..steps {
            let t = if reverse { steps - 1 - k } else { k };
            state = step(self.kind, p, idx, &proj.select(0, t as i64)?, &state)?;
            outs[t] = Some(state.h.clone());
        }
        let outs: Vec<Tensor> = outs.into_iter().flatten().collect();
        Ok((Tensor::stack(&outs.iter().collect::<Vec<_>>(), 0)?, state))
    }

    fn describe(&self) -> String {
        let o = &self.opts;
        let mut s = format!(
            "{}({}, {}",
            name(self.kind),
            self.input_size,
            self.hidden_size
        );
        if o.proj_size != 0 {
            s += &format!(", proj_size={}", o.proj_size);
        }
        if o.num_layers != 1 {
            s += &format!(", num_layers={}", o.num_layers);
        }
        if !o.bias {
            s += &py_bool_arg("bias", false);
        }
        if o.batch_first {
            s += &py_bool_arg("batch_first", true);
        }
        if o.dropout != 0.0 {
            s += &format!(", dropout={}", o.dropout);
        }
        if o.bidirectional {
            s += &py_bool_arg("bidirectional", true);
        }
        s + ")"
    }
}

fn name(kind: CellKind) -> &'static str {
    match kind {
        CellKind::Lstm => "LSTM",
        CellKind::Gru => "GRU",
        CellKind::RnnTanh | CellKind::RnnRelu => "RNN",
    }
}

/// Implements `Module` for a layer wrapper by delegating to its `Stack`;
/// `forward(x)` runs from zero states and returns `output` alone.
macro_rules! stack_module {
    ($name:ident) => {
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                crate::nn::hooks::run(self, x, |x| Ok(self.0.run(&[Some(x)])?.swap_remove(0)))
            }
            fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
                self.0.run(inputs)
            }
            fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
                for c in &self.0.cells {
                    c.visit(f)
                }
            }
            fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
                for c in &mut self.0.cells {
                    c.visit_mut(f)
                }
            }
            fn set_own_training(&self, on: bool) {
                self.0.training.set(on);
                self.0.dropout.set_own_training(on);
            }
            fn is_training(&self) -> bool {
                self.0.training.get()
            }
            fn describe(&self) -> String {
                self.0.describe()
            }
            fn as_lstm(&self) -> Option<&LSTM> {
                (self as &dyn std::any::Any).downcast_ref::<LSTM>()
            }
        }
    };
}

/// `nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first,
/// dropout, bidirectional, proj_size)`, gates `[i, f, g, o]`.
/// `forward_many(&[Some(input), h_0, c_0])` returns `[output, h_n, c_n]`;
/// the parameters are `weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`,
/// `bias_hh_l0` (`weight_hr_l0` with `proj_size`), `..._reverse`, as in
/// PyTorch's `state_dict`.
///
/// ```
/// use kiln_frontend::nn::{ModuleExt, Module, RnnOptions, LSTM};
/// use kiln_frontend::{DType, Tensor};
/// let opts = RnnOptions { num_layers: 2, batch_first: true, ..RnnOptions::default() };
/// let lstm = LSTM::new(3, 4, opts).unwrap();
/// assert_eq!(lstm.describe(), "LSTM(3, 4, num_layers=2, batch_first=True)");
/// assert_eq!(lstm.state_dict()[4].0, "weight_ih_l1");
/// let x = Tensor::zeros(&[2, 5, 3], DType::F32); // (batch, time, features)
/// let out = lstm.forward_many(&[Some(&x)]).unwrap();
/// assert_eq!(out[0].dims(), &[2, 5, 4]);
/// assert_eq!(out[1].dims(), &[2, 2, 4]); // h_n: (num_layers, batch, hidden)
/// ```
pub struct LSTM(pub(crate) Stack);

impl LSTM {
    pub fn new(input_size: usize, hidden_size: usize, opts: RnnOptions) -> Result<LSTM> {
        Ok(LSTM(Stack::new(
            CellKind::Lstm,
            input_size,
            hidden_size,
            opts,
        )?))
    }
}

/// `nn.GRU(input_size, hidden_size, num_layers, bias, batch_first,
/// dropout, bidirectional)`, gates `[r, z, n]`: `forward_many(&[Some(input),
/// h_0])` returns `[output, h_n]`.
///
/// ```
/// use kiln_frontend::nn::{Module, RnnOptions, GRU};
/// use kiln_frontend::{DType, Tensor};
/// let gru = GRU::new(3, 4, RnnOptions { bidirectional: true, ..RnnOptions::default() }).unwrap();
/// let out = gru.forward_many(&[Some(&Tensor::zeros(&[5, 2, 3], DType::F32))]).unwrap();
/// assert_eq!((out[0].dims(), out[1].dims()), (&[5, 2, 8][..], &[2, 2, 4][..]));
/// ```
pub struct GRU(pub(crate) Stack);

impl GRU {
    pub fn new(input_size: usize, hidden_size: usize, opts: RnnOptions) -> Result<GRU> {
        Ok(GRU(Stack::new(
            CellKind::Gru,
            input_size,
            hidden_size,
            opts,
        )?))
    }
}

/// `nn.RNN(input_size, hidden_size, num_layers, nonlinearity, bias,
/// batch_first, dropout, bidirectional)`: `forward_many(&[Some(input),
/// h_0])` returns `[output, h_n]`.
///
/// ```
/// use kiln_frontend::nn::{Module, RnnOptions, RNN};
/// let relu = RnnOptions { nonlinearity: "relu".into(), ..RnnOptions::default() };
/// assert_eq!(RNN::new(3, 4, relu).unwrap().describe(), "RNN(3, 4)");
/// ```
pub struct RNN(pub(crate) Stack);

impl RNN {
    pub fn new(input_size: usize, hidden_size: usize, opts: RnnOptions) -> Result<RNN> {
        let kind = CellKind::rnn(&opts.nonlinearity)?;
        Ok(RNN(Stack::new(kind, input_size, hidden_size, opts)?))
    }
}

stack_module!(LSTM);
stack_module!(GRU);
stack_module!(RNN);
