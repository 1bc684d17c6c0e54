//! `kiln::models`: whole architectures with their PyTorch/torchvision/
//! transformers constructors and `state_dict` key names, so a PyTorch
//! checkpoint saved as safetensors loads with a strict report.

pub mod lstm;
