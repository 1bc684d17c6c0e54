//! `kiln::models`: architectures from torchvision and transformers (and an
//! LSTM classifier) under their own constructor arguments and state_dict key
//! names, so a PyTorch checkpoint saved as safetensors loads with a strict
//! report.

pub mod gpt2;
pub mod lstm;
pub mod resnet;
pub mod vit;
