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

mod attention;
mod container;
pub(crate) mod conv3d;
mod embedding_bag;
mod fields;
pub mod hooks;
pub mod init;
mod instance_norm;
mod layers;
mod loss;
mod module;
mod norm;
mod padding_mode;
pub(crate) mod pixel_shuffle;
mod prelu;
pub(crate) mod recurrent;
mod simple;
mod transformer;
mod upsample;

pub use attention::{AttentionArgs, MultiheadAttention, MultiheadAttentionOptions};
pub use container::{ModuleDict, ModuleList, Sequential};
pub use embedding_bag::{BagMode, EmbeddingBag};
pub use fields::{ModuleField, Training};
pub use instance_norm::{InstanceNorm2d, InstanceNormOptions};
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
pub use padding_mode::{pad_symmetric, PaddingMode};
pub use pixel_shuffle::PixelShuffle;
pub use prelu::PReLU;
pub use recurrent::{
    CellKind, CellWeights, GRUCell, LSTMCell, RNNCell, RnnOptions, GRU, LSTM, RNN,
};
pub use simple::{Activation, Dropout, Flatten, Identity, Pool2d};
pub use transformer::{
    DecoderMasks, TransformerDecoderLayer, TransformerEncoderLayer, TransformerLayerOptions,
};
pub use upsample::{Upsample, UpsampleMode};
