//! `kiln::models`: architectures from torchvision and transformers (plus an
//! LSTM classifier and a small U-Net) under their own constructor arguments
//! and state_dict key names, so a PyTorch checkpoint saved as safetensors
//! loads with a strict report.

pub mod bert;
pub mod catalog;
pub mod efficientnet;
pub mod gpt2;
pub mod hf;
pub mod lstm;
pub mod mobilenetv3;
pub mod ops;
pub mod resnet;
pub mod unet;
pub mod vit;
