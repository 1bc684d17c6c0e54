//! `torch.optim`: the [`Optimizer`] trait, SGD, Adam, AdamW, RMSprop,
//! Adagrad, Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop, gradient clipping, and learning-rate schedulers.
//!
//! Optimizers follow PyTorch's single-tensor (`foreach=False`) formulas;
//! with `fused: true`, SGD, Adam and AdamW run them as one kernel per
//! parameter (compiled once per dtype). They
//! do their math under `no_grad` and write each parameter in place
//! (`p.copy_(new)`), so every clone of a parameter (a model's field) sees the
//! update. Parameters without a gradient are skipped.
//!
//! ```
//! use kiln_frontend::optim::{Optimizer, ParamGroup, SgdConfig, SGD};
//! use kiln_frontend::{DType, Tensor};
//! let a = Tensor::ones(&[2], DType::F32).requires_grad_(true);
//! let b = Tensor::ones(&[2], DType::F32).requires_grad_(true);
//! let groups = vec![ParamGroup::new(vec![a.clone()]), ParamGroup::new(vec![b.clone()]).with("lr", 0.5)];
//! let mut opt = SGD::new(groups, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }).unwrap();
//! for p in [&a, &b] { p.set_grad(Some(Tensor::ones(&[2], DType::F32))); }
//! opt.step().unwrap();
//! opt.zero_grad();
//! assert!(a.grad().is_none());
//! assert!((a.to_f64_vec()[0] - 0.9).abs() < 1e-6 && (b.to_f64_vec()[0] - 0.5).abs() < 1e-6);
//! ```

mod adadelta;
mod adagrad;
mod adam;
mod adamax;
mod asgd;
mod clip;
mod core;
mod fused;
#[cfg(test)]
mod fused_tests;
mod group;
pub mod lr_scheduler;
mod nadam;
mod radam;
mod rmsprop;
mod rprop;
mod sgd;
#[cfg(test)]
mod tests;

pub use self::core::{OptimCore, OptimizerStateDict, ParamState};
pub use adadelta::{Adadelta, AdadeltaConfig};
pub use adagrad::{Adagrad, AdagradConfig};
pub use adam::{Adam, AdamConfig, AdamW};
pub use adamax::{Adamax, AdamaxConfig};
pub use asgd::{AsgdConfig, ASGD};
pub use clip::{clip_grad_norm_, clip_grad_value_, vector_norm};
pub use group::{Dict, ParamGroup, Value};
pub use nadam::{NAdam, NadamConfig};
pub use radam::{RAdam, RadamConfig};
pub use rmsprop::{RMSprop, RmspropConfig};
pub use rprop::{Rprop, RpropConfig};
pub use sgd::{SgdConfig, SGD};

use crate::Tensor;
use kiln_ir::Result;

/// `torch.optim.Optimizer`.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    #[doc(hidden)]
    fn core(&self) -> &OptimCore;
    #[doc(hidden)]
    fn core_mut(&mut self) -> &mut OptimCore;

    /// Clears every parameter's `.grad` (sets it to None, PyTorch's default).
    fn zero_grad(&mut self) {
        self.core_mut().zero_grad()
    }

    /// The parameter groups with their hyper-parameters (`lr`, `momentum`, ...).
    fn param_groups(&self) -> &[ParamGroup] {
        &self.core().groups
    }

    /// Mutable groups: change `lr` or any other hyper-parameter between steps.
    fn param_groups_mut(&mut self) -> &mut [ParamGroup] {
        &mut self.core_mut().groups
    }

    /// `add_param_group`: missing hyper-parameters come from the defaults.
    fn add_param_group(&mut self, group: ParamGroup) -> Result<()> {
        self.core_mut().add_group(group)
    }

    /// The constructor's hyper-parameters (`optimizer.defaults`).
    fn defaults(&self) -> &Dict {
        &self.core().defaults
    }

    /// `optimizer.state[p]`: the named state tensors of one parameter.
    fn state(&self, param: &Tensor) -> Option<&ParamState> {
        self.core().state_of(param)
    }

    /// A deep copy of the state and the group hyper-parameters.
    fn state_dict(&self) -> OptimizerStateDict {
        self.core().state_dict()
    }

    /// Restores a [`Optimizer::state_dict`]; the groups must have the same sizes.
    fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> Result<()> {
        self.core_mut().load_state_dict(sd)
    }
}
