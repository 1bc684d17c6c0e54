//! Recurrent layers: `nn.LSTM`, `nn.GRU`, `nn.RNN` and their cells, with
//! PyTorch's constructor arguments, gate orders and `state_dict` names.
//!
//! ```
//! use kiln_frontend::nn::{Module, RnnOptions, LSTM};
//! use kiln_frontend::{DType, Tensor};
//! let lstm = LSTM::new(3, 4, RnnOptions::default()).unwrap();
//! let x = Tensor::zeros(&[5, 2, 3], DType::F32); // (time, batch, features)
//! let h0 = Tensor::zeros(&[1, 2, 4], DType::F32);
//! let [out, h_n, c_n] = &lstm.forward_many(&[Some(&x), Some(&h0), Some(&h0)]).unwrap()[..] else {
//!     unreachable!()
//! };
//! assert_eq!((out.dims(), h_n.dims(), c_n.dims()), (&[5, 2, 4][..], &[1, 2, 4][..], &[1, 2, 4][..]));
//! ```

mod cell;
pub(crate) mod layer;
pub(crate) mod step;
mod weights;

pub use cell::{GRUCell, LSTMCell, RNNCell};
pub use layer::{RnnOptions, GRU, LSTM, RNN};
pub use weights::{CellKind, CellWeights};

use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// An initial state must have exactly PyTorch's shape (no broadcasting).
fn check_state(op: &str, what: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        bail!(
            op,
            "{what} has shape {}, expected {}",
            fmt_dims(t.dims()),
            fmt_dims(want)
        );
    }
    Ok(())
}

/// `, name=True` / `, name=False`, as PyTorch's `extra_repr` prints a flag.
fn py_bool_arg(name: &str, on: bool) -> String {
    format!(", {name}={}", super::layers::py_bool(on))
}
