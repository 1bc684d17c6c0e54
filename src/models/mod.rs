//! `kiln::models`: architectures from torchvision and transformers under
//! their own constructor arguments and state_dict key names.

pub mod gpt2;
pub mod vit;
