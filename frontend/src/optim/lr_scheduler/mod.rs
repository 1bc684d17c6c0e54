//! `torch.optim.lr_scheduler`: schedulers that set `lr` (and, for
//! OneCycleLR and CyclicLR, `momentum`) in an optimizer's param groups.
//!
//! A scheduler does not own the optimizer: each call takes it, so the
//! training loop keeps using it in between (`opt.step()`, then
//! `sched.step(&mut opt)`), exactly in PyTorch's order. The schedulers use
//! PyTorch's recursive (chainable) formulas, so they match it step for step,
//! and `state_dict` / `load_state_dict` save and restore their position.
//!
//! ```
//! use kiln_frontend::optim::lr_scheduler::{LRScheduler, StepLR};
//! use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
//! use kiln_frontend::{DType, Tensor};
//! let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
//! let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
//! let mut sched = StepLR::new(&mut opt, 2, 0.5).unwrap();
//! let mut lrs = vec![];
//! for _ in 0..5 {
//!     lrs.push(opt.param_groups()[0].lr());
//!     opt.step().unwrap();
//!     sched.step(&mut opt).unwrap();
//! }
//! assert_eq!(lrs, vec![0.1, 0.1, 0.05, 0.05, 0.025]);
//! ```

mod basic;
mod chained;
mod cosine;
mod cyclic;
mod factor;
mod one_cycle;
mod plateau;
mod sequential;
#[cfg(test)]
mod tests;

pub use basic::{ExponentialLR, LinearLR, MultiStepLR, StepLR};
pub use chained::ChainedScheduler;
pub use cosine::{CosineAnnealingLR, CosineAnnealingWarmRestarts};
pub use cyclic::{CyclicLR, CyclicMode, CyclicOptions};
pub use factor::{ConstantLR, LambdaLR, LrLambda, MultiplicativeLR, PolynomialLR};
pub use one_cycle::{Anneal, OneCycleLR, OneCycleOptions};
pub use plateau::{PlateauOptions, ReduceLROnPlateau};
pub use sequential::SequentialLR;

use super::group::{get_f64, get_floats, get_i64, Dict, ParamGroup, Value};
use super::Optimizer;
use kiln_ir::Result;

/// Whatever holds param groups a scheduler can drive (every optimizer).
pub trait HasParamGroups {
    fn groups(&self) -> &[ParamGroup];
    fn groups_mut(&mut self) -> &mut [ParamGroup];
}

impl<T: Optimizer> HasParamGroups for T {
    fn groups(&self) -> &[ParamGroup] {
        self.param_groups()
    }
    fn groups_mut(&mut self) -> &mut [ParamGroup] {
        self.param_groups_mut()
    }
}

impl HasParamGroups for Box<dyn Optimizer> {
    fn groups(&self) -> &[ParamGroup] {
        self.param_groups()
    }
    fn groups_mut(&mut self) -> &mut [ParamGroup] {
        self.param_groups_mut()
    }
}

impl HasParamGroups for Vec<ParamGroup> {
    fn groups(&self) -> &[ParamGroup] {
        self
    }
    fn groups_mut(&mut self) -> &mut [ParamGroup] {
        self
    }
}

/// An epoch-stepped scheduler (`torch.optim.lr_scheduler.LRScheduler`).
pub trait LRScheduler {
    /// `scheduler.step()`: advance one epoch and write the new lrs.
    fn step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()>;
    /// The lrs this scheduler last set, one per group.
    fn get_last_lr(&self) -> Vec<f64>;
    fn last_epoch(&self) -> i64;
    /// Its state under PyTorch's attribute names (`last_epoch`, `base_lrs`, ...).
    fn state_dict(&self) -> Dict;
    fn load_state_dict(&mut self, sd: &Dict) -> Result<()>;

    /// `_update_lr(epoch)`: with an epoch, jump there (closed form when the
    /// scheduler has one); SequentialLR uses it at its milestones.
    #[doc(hidden)]
    fn update_lr(&mut self, opt: &mut dyn HasParamGroups, epoch: Option<i64>) -> Result<()>;
    /// `_initial_step()`.
    #[doc(hidden)]
    fn initial_step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()>;
    /// SequentialLR's `recursive_undo`.
    #[doc(hidden)]
    fn undo(&mut self);
}

/// The counters every chainable scheduler keeps.
#[derive(Clone, Debug)]
pub struct SchedState {
    pub base_lrs: Vec<f64>,
    pub last_epoch: i64,
    pub step_count: i64,
    pub last_lr: Vec<f64>,
    pub is_initial: bool,
}

/// The formula of one chainable scheduler.
#[doc(hidden)]
pub trait Rule {
    const NAME: &'static str;
    /// `get_lr()`: the new lrs from the current ones (may set momentum).
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64>;
    /// `_get_closed_form_lr()`, when the scheduler has one.
    fn closed_form(&self, _s: &SchedState) -> Option<Vec<f64>> {
        None
    }
    fn save(&self, d: &mut Dict);
    fn load(&mut self, d: &Dict) -> Result<()>;
}

/// A chainable scheduler: the shared counters plus its formula.
pub struct Scheduler<R: Rule> {
    s: SchedState,
    rule: R,
}

impl<R: Rule> Scheduler<R> {
    /// `LRScheduler.__init__` with `last_epoch=-1`: records `initial_lr`,
    /// then takes the initial step.
    pub(crate) fn start(opt: &mut dyn HasParamGroups, rule: R) -> Result<Self> {
        for g in opt.groups_mut() {
            if g.get("initial_lr").is_none() {
                let lr = g.f64("lr")?;
                g.set("initial_lr", lr);
            }
        }
        let base_lrs = opt
            .groups()
            .iter()
            .map(|g| g.f64("initial_lr"))
            .collect::<Result<Vec<_>>>()?;
        let mut me = Scheduler {
            s: SchedState {
                base_lrs,
                last_epoch: -1,
                step_count: 0,
                last_lr: vec![],
                is_initial: false,
            },
            rule,
        };
        me.initial_step(opt)?;
        Ok(me)
    }

    /// The formula's parameters.
    pub fn rule(&self) -> &R {
        &self.rule
    }

    pub fn base_lrs(&self) -> &[f64] {
        &self.s.base_lrs
    }

    fn apply(&mut self, opt: &mut dyn HasParamGroups, values: Vec<f64>) {
        for (g, lr) in opt.groups_mut().iter_mut().zip(values) {
            g.set_lr(lr);
        }
        self.s.last_lr = opt.groups().iter().map(|g| g.lr()).collect();
    }
}

impl<R: Rule> LRScheduler for Scheduler<R> {
    fn step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        self.s.step_count += 1;
        self.update_lr(opt, None)
    }

    fn update_lr(&mut self, opt: &mut dyn HasParamGroups, epoch: Option<i64>) -> Result<()> {
        let values = match epoch {
            None => {
                self.s.last_epoch += 1;
                self.rule.get_lr(&self.s, opt.groups_mut())
            }
            Some(e) => {
                self.s.last_epoch = e;
                match self.rule.closed_form(&self.s) {
                    Some(v) => v,
                    None => self.rule.get_lr(&self.s, opt.groups_mut()),
                }
            }
        };
        self.apply(opt, values);
        Ok(())
    }

    fn initial_step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        self.s.step_count = 0;
        self.s.is_initial = true;
        let r = self.step(opt);
        self.s.is_initial = false;
        r
    }

    fn undo(&mut self) {
        self.s.last_epoch -= 1;
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.s.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.s.last_epoch
    }

    fn state_dict(&self) -> Dict {
        let mut d = Dict::new();
        d.insert("base_lrs".into(), Value::Floats(self.s.base_lrs.clone()));
        d.insert("last_epoch".into(), Value::Int(self.s.last_epoch));
        d.insert("_step_count".into(), Value::Int(self.s.step_count));
        d.insert("_last_lr".into(), Value::Floats(self.s.last_lr.clone()));
        self.rule.save(&mut d);
        d
    }

    fn load_state_dict(&mut self, sd: &Dict) -> Result<()> {
        self.s.base_lrs = get_floats(sd, R::NAME, "base_lrs")?;
        self.s.last_epoch = get_i64(sd, R::NAME, "last_epoch")?;
        self.s.step_count = get_i64(sd, R::NAME, "_step_count")?;
        self.s.last_lr = get_floats(sd, R::NAME, "_last_lr")?;
        self.rule.load(sd)
    }
}

/// Reads a number of a scheduler's state dict (an error naming the key).
pub(crate) fn num(d: &Dict, owner: &str, key: &str) -> Result<f64> {
    get_f64(d, owner, key)
}

/// Python's `bisect_right`.
pub(crate) fn bisect_right(xs: &[i64], x: i64) -> usize {
    xs.partition_point(|&m| m <= x)
}

/// Loads a container scheduler's `_schedulers` list (`owner` names it in
/// errors) into its sub-schedulers, one state each, in order.
pub(crate) fn load_sub_states(
    owner: &str,
    sd: &Dict,
    schedulers: &mut [Box<dyn LRScheduler>],
) -> Result<()> {
    let subs = match sd.get("_schedulers") {
        Some(Value::List(l)) => l,
        _ => kiln_ir::bail!(owner, "state has no '_schedulers' list"),
    };
    if subs.len() != schedulers.len() {
        kiln_ir::bail!(
            owner,
            "state has {} sub-schedulers, this one {}",
            subs.len(),
            schedulers.len()
        );
    }
    for (s, d) in schedulers.iter_mut().zip(subs) {
        s.load_state_dict(d)?;
    }
    Ok(())
}
