//! `nn.LSTMCell`, `nn.GRUCell`, `nn.RNNCell`: one step of a recurrence
//! with its own weights (`weight_ih`, `weight_hh`, `bias_ih`, `bias_hh`).

use super::step::{input_projection, step, State};
use super::weights::{CellKind, CellWeights};
use super::{check_state, py_bool_arg};
use crate::nn::{Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// What the three cell modules share: the kind and the weights.
struct Cell {
    kind: CellKind,
    w: CellWeights,
}

impl Cell {
    fn new(kind: CellKind, input_size: usize, hidden_size: usize, bias: bool) -> Result<Cell> {
        Ok(Cell {
            kind,
            w: CellWeights::new(kind, input_size, hidden_size, 0, bias, "")?,
        })
    }

    fn name(&self) -> &'static str {
        match self.kind {
            CellKind::Lstm => "LSTMCell",
            CellKind::Gru => "GRUCell",
            CellKind::RnnTanh | CellKind::RnnRelu => "RNNCell",
        }
    }

    /// `cell(input, hx)`: `input` is (B, input_size) or unbatched
    /// (input_size); `hx` is `[h]` or, for an LSTM, `[h, c]`, each
    /// (B, hidden_size) or (hidden_size); absent, they start at zero.
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let n_state = if self.kind == CellKind::Lstm { 2 } else { 1 };
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
        let hx: Vec<Option<&Tensor>> = (0..n_state)
            .map(|k| inputs.get(1 + k).copied().flatten())
            .collect();
        let (unbatched, rank) = match x.rank() {
            1 => (true, 1),
            2 => (false, 2),
            _ => bail!(
                op,
                "expected a 1-D (unbatched) or 2-D (batch, input_size) input, got {}",
                fmt_dims(x.dims())
            ),
        };
        let input_size = self.w.input_size();
        if x.dims()[rank - 1] != input_size {
            bail!(
                op,
                "input has {} features ({}), the cell was built for input_size={input_size}",
                x.dims()[rank - 1],
                fmt_dims(x.dims())
            );
        }
        let x = if unbatched {
            x.unsqueeze(0)?
        } else {
            (*x).clone()
        };
        let batch = x.dims()[0];
        let hidden = self.w.hidden_size(self.kind);
        let names = ["h", "c"];
        let mut state = vec![];
        if hx.iter().any(|t| t.is_some()) && hx.iter().any(|t| t.is_none()) {
            bail!(op, "hx = (h_0, c_0) must be given both or neither");
        }
        for (k, t) in hx.iter().enumerate() {
            let want: &[usize] = if unbatched {
                &[hidden]
            } else {
                &[batch, hidden]
            };
            state.push(match t {
                Some(t) => {
                    check_state(op, names[k], t, want)?;
                    if unbatched {
                        t.unsqueeze(0)?
                    } else {
                        (*t).clone()
                    }
                }
                None => Tensor::zeros(&[batch, hidden], x.dtype()),
            });
        }
        let s = State {
            h: state[0].clone(),
            c: state.get(1).cloned(),
        };
        let cells = std::slice::from_ref(&self.w);
        let next = step(self.kind, cells, 0, &input_projection(&self.w, &x)?, &s)?;
        let mut out = vec![next.h];
        out.extend(next.c);
        if unbatched {
            out = out
                .iter()
                .map(|t| t.squeeze(Some(&[0])))
                .collect::<Result<_>>()?;
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "{}({}, {}",
            self.name(),
            self.w.input_size(),
            self.w.hidden_size(self.kind)
        );
        if self.w.bias_ih.is_none() {
            s += &py_bool_arg("bias", false);
        }
        if self.kind == CellKind::RnnRelu {
            s += ", nonlinearity=relu";
        }
        s + ")"
    }
}

/// Implements `Module` for a cell wrapper by delegating to its `Cell`;
/// `forward(x)` is the step from a zero state and returns `h_1`.
macro_rules! cell_module {
    ($name:ident) => {
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                crate::nn::hooks::run(self, x, |x| Ok(self.0.run(&[Some(x)])?.swap_remove(0)))
            }
            fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
                self.0.run(inputs)
            }
            fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
                self.0.w.visit(f)
            }
            fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
                self.0.w.visit_mut(f)
            }
            fn describe(&self) -> String {
                self.0.describe()
            }
        }
    };
}

/// `nn.LSTMCell(input_size, hidden_size, bias)`: `forward_many(&[Some(x),
/// h0, c0])` returns `[h_1, c_1]`.
///
/// ```
/// use kiln_frontend::nn::{LSTMCell, Module};
/// use kiln_frontend::{DType, Tensor};
/// let cell = LSTMCell::new(3, 4, true).unwrap();
/// let x = Tensor::zeros(&[2, 3], DType::F32);
/// let hc = cell.forward_many(&[Some(&x)]).unwrap();
/// assert_eq!((hc[0].dims(), hc[1].dims()), (&[2, 4][..], &[2, 4][..]));
/// ```
pub struct LSTMCell(Cell);

impl LSTMCell {
    pub fn new(input_size: usize, hidden_size: usize, bias: bool) -> Result<LSTMCell> {
        Ok(LSTMCell(Cell::new(
            CellKind::Lstm,
            input_size,
            hidden_size,
            bias,
        )?))
    }
}

/// `nn.GRUCell(input_size, hidden_size, bias)`: `forward_many(&[Some(x),
/// hx])` returns `[h_1]`.
///
/// ```
/// use kiln_frontend::nn::{GRUCell, Module};
/// use kiln_frontend::{DType, Tensor};
/// let cell = GRUCell::new(3, 4, true).unwrap();
/// let h = cell.forward(&Tensor::zeros(&[3], DType::F32)).unwrap();
/// assert_eq!(h.dims(), &[4]);
/// ```
pub struct GRUCell(Cell);

impl GRUCell {
    pub fn new(input_size: usize, hidden_size: usize, bias: bool) -> Result<GRUCell> {
        Ok(GRUCell(Cell::new(
            CellKind::Gru,
            input_size,
            hidden_size,
            bias,
        )?))
    }
}

/// `nn.RNNCell(input_size, hidden_size, bias, nonlinearity)` with
/// `nonlinearity` `"tanh"` or `"relu"`: `forward_many(&[Some(x), hx])`
/// returns `[h_1]`.
///
/// ```
/// use kiln_frontend::nn::{Module, RNNCell};
/// let cell = RNNCell::new(3, 4, true, "relu").unwrap();
/// assert_eq!(cell.describe(), "RNNCell(3, 4, nonlinearity=relu)");
/// assert!(RNNCell::new(3, 4, true, "gelu").is_err());
/// ```
pub struct RNNCell(Cell);

impl RNNCell {
    pub fn new(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        nonlinearity: &str,
    ) -> Result<RNNCell> {
        Ok(RNNCell(Cell::new(
            CellKind::rnn(nonlinearity)?,
            input_size,
            hidden_size,
            bias,
        )?))
    }
}

cell_module!(LSTMCell);
cell_module!(GRUCell);
cell_module!(RNNCell);
