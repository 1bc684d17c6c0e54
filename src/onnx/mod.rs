//! ONNX in both directions: [`export`] writes a kiln model as an ONNX file
//! (composite ops as their ONNX ops: Conv, BatchNormalization, Gemm,
//! Softmax, LayerNormalization, ...), [`load`] imports one as an eager
//! module that `compile()` accepts.
//!
//! ```no_run
//! use kiln::nn::ModuleExt;
//! let model = kiln::train::ModelKind::Cnn.build()?;
//! model.eval();
//! let x = kiln::Tensor::zeros(&[1, 1, 8, 8], kiln::DType::F32);
//! kiln::onnx::export(&model, &[x.clone()], "cnn.onnx", 17)?;
//! let back = kiln::onnx::load("cnn.onnx")?;
//! let y = back.forward(&[x])?;
//! # Ok::<(), kiln::Error>(())
//! ```

mod export;
mod import;
pub mod proto;
pub mod tensor;

pub use export::{export, export_dynamic, export_fn, from_exported, DEFAULT_OPSET};
pub use import::{from_bytes, load, OnnxModel};
