//! `torch.nn` for kiln: the [`Module`] trait and the standard layers.
//!
//! ```
//! use kiln_frontend::nn::{Activation, Linear, ModuleExt, Sequential};
//! let mlp = Sequential::new()
//!     .add(Linear::new(64, 32, true).unwrap())
//!     .add(Activation::relu())
//!     .add(Linear::new(32, 10, true).unwrap());
//! let names: Vec<String> = mlp.state_dict().into_iter().map(|(k, _)| k).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//! ```

mod container;
mod fields;
pub mod hooks;
pub mod init;
mod layers;
mod loss;
mod module;
mod norm;
pub(crate) mod recurrent;
mod simple;

pub use container::{ModuleDict, ModuleList, Sequential};
pub use fields::{ModuleField, Training};
/// `#[derive(Module)]`: `visit`, `visit_mut`, `describe` and the training
/// flag generated from the struct's fields (see the `kiln-derive` crate).
pub use kiln_derive::Module;
pub use kiln_ir::op::conv::Padding;
pub use kiln_ir::op::pool::Pool2dParams;
pub use layers::{Conv, ConvOptions, ConvTranspose2d, Embedding, Linear};
pub use loss::{
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss,
};
pub use module::{Entry, EntryMut, LoadReport, Module, ModuleExt};
pub use norm::{BatchNorm, BatchNormOptions, GroupNorm, LayerNorm};
pub use recurrent::{
    CellKind, CellWeights, GRUCell, LSTMCell, RNNCell, RnnOptions, GRU, LSTM, RNN,
};
pub use simple::{Activation, Dropout, Flatten, Identity, Pool2d};
