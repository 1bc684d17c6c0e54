//! An LSTM sequence classifier: `nn.LSTM(input_size, hidden_size,
//! num_layers, batch_first=True)` followed by `nn.Linear(hidden_size,
//! num_classes)` on the last time step, with PyTorch's `state_dict` keys
//! (`lstm.weight_ih_l0`, ..., `head.weight`, `head.bias`).
//!
//! This is the model of `real/lstm` in the PyTorch fixtures:
//!
//! ```python
//! class LSTMClassifier(nn.Module):
//!     def __init__(self):
//!         super().__init__()
//!         self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
//!         self.head = nn.Linear(32, 5)
//!     def forward(self, x):
//!         out, _ = self.lstm(x)
//!         return self.head(out[:, -1])
//! ```
//!
//! ```
//! use kiln::models::lstm::{LstmClassifier, LstmClassifierConfig};
//! use kiln::nn::{Module, ModuleExt};
//! let m = LstmClassifier::new(&LstmClassifierConfig::default()).unwrap();
//! assert_eq!(m.state_dict()[0].0, "lstm.weight_ih_l0");
//! let x = kiln::Tensor::zeros(&[3, 7, 16], kiln::DType::F32); // (batch, time, features)
//! assert_eq!(m.forward(&x).unwrap().dims(), &[3, 5]);
//! ```

use crate::nn::{Linear, Module, RnnOptions, Training, LSTM};
use crate::{Result, Tensor};
use kiln_ir::bail;
use kiln_ir::shape::fmt_dims;

/// The classifier's sizes; `Default` is the `real/lstm` fixture's model
/// (16 features, hidden 32, 2 layers, 5 classes).
#[derive(Debug, Clone, PartialEq)]
pub struct LstmClassifierConfig {
    pub input_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_classes: usize,
    /// Between LSTM layers, in training (PyTorch's `dropout`).
    pub dropout: f64,
}

impl Default for LstmClassifierConfig {
    fn default() -> Self {
        LstmClassifierConfig {
            input_size: 16,
            hidden_size: 32,
            num_layers: 2,
            num_classes: 5,
            dropout: 0.0,
        }
    }
}

/// `lstm` (batch-first) then `head` on the last step's output.
#[derive(crate::nn::Module)]
#[module(crate = "crate", describe = "describe")]
pub struct LstmClassifier {
    pub lstm: LSTM,
    pub head: Linear,
    training: Training,
}

fn describe(m: &LstmClassifier) -> String {
    format!(
        "LSTMClassifier(\n  (lstm): {}\n  (head): {}\n)",
        m.lstm.describe(),
        m.head.describe()
    )
}

impl LstmClassifier {
    pub fn new(cfg: &LstmClassifierConfig) -> Result<LstmClassifier> {
        let opts = RnnOptions {
            num_layers: cfg.num_layers,
            batch_first: true,
            dropout: cfg.dropout,
            ..RnnOptions::default()
        };
        Ok(LstmClassifier {
            lstm: LSTM::new(cfg.input_size, cfg.hidden_size, opts)?,
            head: Linear::new(cfg.hidden_size, cfg.num_classes, true)?,
            training: Training::default(),
        })
    }

    /// `x`: (batch, time, input_size) -> logits (batch, num_classes).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            bail!(
                "LSTMClassifier",
                "expected a (batch, time, features) input, got {}",
                fmt_dims(x.dims())
            );
        }
        let out = self.lstm.forward(x)?;
        let last = out.select(1, x.dims()[1] as i64 - 1)?;
        self.head.forward(&last)
    }
}
