//! StepLR, MultiStepLR, ExponentialLR, LinearLR (PyTorch's chainable forms).

use super::{num, HasParamGroups, Rule, SchedState, Scheduler};
use crate::optim::group::{get_i64, Dict, ParamGroup, Value};
use kiln_ir::{bail, Result};
use std::collections::BTreeMap;

fn lrs(groups: &[ParamGroup], f: impl Fn(f64) -> f64) -> Vec<f64> {
    groups.iter().map(|g| f(g.lr())).collect()
}

/// `lr *= gamma` every `step_size` epochs.
#[derive(Clone, Debug)]
pub struct StepRule {
    pub step_size: i64,
    pub gamma: f64,
}
pub type StepLR = Scheduler<StepRule>;

impl Rule for StepRule {
    const NAME: &'static str = "StepLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        if s.last_epoch == 0 || s.last_epoch.rem_euclid(self.step_size) != 0 {
            lrs(groups, |lr| lr)
        } else {
            lrs(groups, |lr| lr * self.gamma)
        }
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let k = s.last_epoch.div_euclid(self.step_size) as f64;
        Some(s.base_lrs.iter().map(|b| b * self.gamma.powf(k)).collect())
    }
    fn save(&self, d: &mut Dict) {
        d.insert("step_size".into(), Value::Int(self.step_size));
        d.insert("gamma".into(), Value::Float(self.gamma));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.step_size = get_i64(d, Self::NAME, "step_size")?;
        self.gamma = num(d, Self::NAME, "gamma")?;
        Ok(())
    }
}

impl StepLR {
    pub fn new(opt: &mut dyn HasParamGroups, step_size: i64, gamma: f64) -> Result<StepLR> {
        if step_size <= 0 {
            bail!("StepLR", "step_size must be positive, got {step_size}");
        }
        Scheduler::start(opt, StepRule { step_size, gamma })
    }
}

/// `lr *= gamma` at each milestone (repeated milestones multiply again).
#[derive(Clone, Debug)]
pub struct MultiStepRule {
    /// milestone -> how many times it was given (Python's `Counter`).
    pub milestones: BTreeMap<i64, i64>,
    pub gamma: f64,
}
pub type MultiStepLR = Scheduler<MultiStepRule>;

impl Rule for MultiStepRule {
    const NAME: &'static str = "MultiStepLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        match self.milestones.get(&s.last_epoch) {
            None => lrs(groups, |lr| lr),
            Some(&n) => lrs(groups, |lr| lr * self.gamma.powf(n as f64)),
        }
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let n: i64 = self.milestones.range(..=s.last_epoch).map(|(_, c)| c).sum();
        Some(
            s.base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(n as f64))
                .collect(),
        )
    }
    fn save(&self, d: &mut Dict) {
        let ms: Vec<i64> = self
            .milestones
            .iter()
            .flat_map(|(&m, &c)| std::iter::repeat_n(m, c as usize))
            .collect();
        d.insert("milestones".into(), Value::Ints(ms));
        d.insert("gamma".into(), Value::Float(self.gamma));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        let ms = match d.get("milestones") {
            Some(Value::Ints(v)) => v.clone(),
            _ => bail!(
                Self::NAME,
                "state has no list of integers under key 'milestones'"
            ),
        };
        self.milestones = counter(&ms);
        self.gamma = num(d, Self::NAME, "gamma")?;
        Ok(())
    }
}

fn counter(ms: &[i64]) -> BTreeMap<i64, i64> {
    let mut c = BTreeMap::new();
    for &m in ms {
        *c.entry(m).or_insert(0) += 1;
    }
    c
}

impl MultiStepLR {
    pub fn new(
        opt: &mut dyn HasParamGroups,
        milestones: &[i64],
        gamma: f64,
    ) -> Result<MultiStepLR> {
        Scheduler::start(
            opt,
            MultiStepRule {
                milestones: counter(milestones),
                gamma,
            },
        )
    }
}

/// `lr *= gamma` every epoch.
#[derive(Clone, Debug)]
pub struct ExponentialRule {
    pub gamma: f64,
}
pub type ExponentialLR = Scheduler<ExponentialRule>;

impl Rule for ExponentialRule {
    const NAME: &'static str = "ExponentialLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        if s.is_initial {
            lrs(groups, |lr| lr)
        } else {
            lrs(groups, |lr| lr * self.gamma)
        }
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let e = s.last_epoch as f64;
        Some(s.base_lrs.iter().map(|b| b * self.gamma.powf(e)).collect())
    }
    fn save(&self, d: &mut Dict) {
        d.insert("gamma".into(), Value::Float(self.gamma));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.gamma = num(d, Self::NAME, "gamma")?;
        Ok(())
    }
}

impl ExponentialLR {
    pub fn new(opt: &mut dyn HasParamGroups, gamma: f64) -> Result<ExponentialLR> {
        Scheduler::start(opt, ExponentialRule { gamma })
    }
}

/// The lr factor moves linearly from `start_factor` to `end_factor` over `total_iters` epochs.
#[derive(Clone, Debug)]
pub struct LinearRule {
    pub start_factor: f64,
    pub end_factor: f64,
    pub total_iters: i64,
}
pub type LinearLR = Scheduler<LinearRule>;

impl Rule for LinearRule {
    const NAME: &'static str = "LinearLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        let (sf, ef, n) = (self.start_factor, self.end_factor, self.total_iters as f64);
        if s.last_epoch == 0 {
            return lrs(groups, |lr| lr * sf);
        }
        if s.is_initial || s.last_epoch > self.total_iters {
            return lrs(groups, |lr| lr);
        }
        let e = s.last_epoch as f64;
        lrs(groups, |lr| {
            lr * (1.0 + (ef - sf) / (n * sf + (e - 1.0) * (ef - sf)))
        })
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let (sf, ef, n) = (self.start_factor, self.end_factor, self.total_iters);
        let k = n.min(s.last_epoch) as f64;
        Some(
            s.base_lrs
                .iter()
                .map(|b| b * (sf + (ef - sf) * k / n as f64))
                .collect(),
        )
    }
    fn save(&self, d: &mut Dict) {
        d.insert("start_factor".into(), Value::Float(self.start_factor));
        d.insert("end_factor".into(), Value::Float(self.end_factor));
        d.insert("total_iters".into(), Value::Int(self.total_iters));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.start_factor = num(d, Self::NAME, "start_factor")?;
        self.end_factor = num(d, Self::NAME, "end_factor")?;
        self.total_iters = get_i64(d, Self::NAME, "total_iters")?;
        Ok(())
    }
}

impl LinearLR {
    pub fn new(
        opt: &mut dyn HasParamGroups,
        start_factor: f64,
        end_factor: f64,
        total_iters: i64,
    ) -> Result<LinearLR> {
        if start_factor > 1.0 || start_factor <= 0.0 {
            bail!(
                "LinearLR",
                "start_factor must be in (0, 1], got {start_factor}"
            );
        }
        if !(0.0..=1.0).contains(&end_factor) {
            bail!("LinearLR", "end_factor must be in [0, 1], got {end_factor}");
        }
        Scheduler::start(
            opt,
            LinearRule {
                start_factor,
                end_factor,
                total_iters,
            },
        )
    }
}
