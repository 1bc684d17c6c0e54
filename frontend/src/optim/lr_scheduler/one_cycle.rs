//! OneCycleLR: the 1cycle policy for lr and (inversely) momentum.

use super::{num, HasParamGroups, Rule, SchedState, Scheduler};
use crate::optim::group::{get_i64, Dict, ParamGroup, Value};
use kiln_ir::{bail, Result};
use std::f64::consts::PI;

/// How OneCycleLR moves between phase end points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Anneal {
    Cos,
    Linear,
}

impl Anneal {
    fn apply(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Anneal::Cos => end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0),
            Anneal::Linear => (end - start) * pct + start,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Anneal::Cos => "cos",
            Anneal::Linear => "linear",
        }
    }
}

/// OneCycleLR's arguments besides `max_lr` and `total_steps` (PyTorch's defaults).
#[derive(Clone, Debug)]
pub struct OneCycleOptions {
    pub pct_start: f64,
    pub anneal_strategy: Anneal,
    pub cycle_momentum: bool,
    pub base_momentum: f64,
    pub max_momentum: f64,
    pub div_factor: f64,
    pub final_div_factor: f64,
    pub three_phase: bool,
}

impl Default for OneCycleOptions {
    fn default() -> Self {
        OneCycleOptions {
            pct_start: 0.3,
            anneal_strategy: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// One phase: the step it ends at and the group keys it moves between.
#[derive(Clone, Debug)]
struct Phase {
    end_step: f64,
    lr: (&'static str, &'static str),
    momentum: (&'static str, &'static str),
}

#[derive(Clone, Debug)]
pub struct OneCycleRule {
    pub total_steps: i64,
    pub pct_start: f64,
    pub three_phase: bool,
    pub anneal: Anneal,
    pub cycle_momentum: bool,
    pub use_beta1: bool,
    phases: Vec<Phase>,
}
pub type OneCycleLR = Scheduler<OneCycleRule>;

fn phases(total: i64, pct: f64, three: bool) -> Vec<Phase> {
    let n = total as f64;
    let up = Phase {
        end_step: pct * n - 1.0,
        lr: ("initial_lr", "max_lr"),
        momentum: ("max_momentum", "base_momentum"),
    };
    if three {
        vec![
            up,
            Phase {
                end_step: 2.0 * pct * n - 2.0,
                lr: ("max_lr", "initial_lr"),
                momentum: ("base_momentum", "max_momentum"),
            },
            Phase {
                end_step: n - 1.0,
                lr: ("initial_lr", "min_lr"),
                momentum: ("max_momentum", "max_momentum"),
            },
        ]
    } else {
        vec![
            up,
            Phase {
                end_step: n - 1.0,
                lr: ("max_lr", "min_lr"),
                momentum: ("base_momentum", "max_momentum"),
            },
        ]
    }
}

impl Rule for OneCycleRule {
    const NAME: &'static str = "OneCycleLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        // PyTorch raises past total_steps; here the schedule just holds its end point.
        let step = s.last_epoch.min(self.total_steps) as f64;
        let mut lrs = vec![];
        for g in groups.iter_mut() {
            let get = |k: &str| g.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            let mut start = 0.0;
            let last = self.phases.len() - 1;
            for (i, ph) in self.phases.iter().enumerate() {
                if step <= ph.end_step || i == last {
                    let pct = (step - start) / (ph.end_step - start);
                    lrs.push(self.anneal.apply(get(ph.lr.0), get(ph.lr.1), pct));
                    if self.cycle_momentum {
                        let m = self
                            .anneal
                            .apply(get(ph.momentum.0), get(ph.momentum.1), pct);
                        g.set_momentum(m);
                    }
                    break;
                }
                start = ph.end_step;
            }
        }
        lrs
    }
    fn save(&self, d: &mut Dict) {
        d.insert("total_steps".into(), Value::Int(self.total_steps));
        d.insert("pct_start".into(), Value::Float(self.pct_start));
        d.insert("three_phase".into(), Value::Bool(self.three_phase));
        d.insert(
            "_anneal_func_type".into(),
            Value::Str(self.anneal.name().into()),
        );
        d.insert("cycle_momentum".into(), Value::Bool(self.cycle_momentum));
        d.insert("use_beta1".into(), Value::Bool(self.use_beta1));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.total_steps = get_i64(d, Self::NAME, "total_steps")?;
        self.pct_start = num(d, Self::NAME, "pct_start")?;
        let flag = |k: &str| d.get(k).and_then(Value::as_bool).unwrap_or(false);
        self.three_phase = flag("three_phase");
        self.cycle_momentum = flag("cycle_momentum");
        self.use_beta1 = flag("use_beta1");
        self.anneal = match d.get("_anneal_func_type") {
            Some(Value::Str(s)) if s == "linear" => Anneal::Linear,
            _ => Anneal::Cos,
        };
        self.phases = phases(self.total_steps, self.pct_start, self.three_phase);
        Ok(())
    }
}

impl OneCycleLR {
    /// `OneCycleLR(optimizer, max_lr, total_steps, **options)`; `max_lr` is
    /// one value for every group.
    pub fn new(
        opt: &mut dyn HasParamGroups,
        max_lr: f64,
        total_steps: i64,
        o: OneCycleOptions,
    ) -> Result<OneCycleLR> {
        let lrs = vec![max_lr; opt.groups().len()];
        OneCycleLR::with_max_lrs(opt, &lrs, total_steps, o)
    }

    /// One `max_lr` per group.
    pub fn with_max_lrs(
        opt: &mut dyn HasParamGroups,
        max_lrs: &[f64],
        total_steps: i64,
        o: OneCycleOptions,
    ) -> Result<OneCycleLR> {
        const NAME: &str = "OneCycleLR";
        if total_steps <= 0 {
            bail!(
                NAME,
                "Expected positive integer total_steps, but got {total_steps}"
            );
        }
        if !(0.0..=1.0).contains(&o.pct_start) {
            bail!(
                NAME,
                "Expected float between 0 and 1 pct_start, but got {}",
                o.pct_start
            );
        }
        if max_lrs.len() != opt.groups().len() {
            bail!(
                NAME,
                "max_lr has {} values, param_groups has {}",
                max_lrs.len(),
                opt.groups().len()
            );
        }
        let use_beta1 = opt
            .groups()
            .first()
            .is_some_and(|g| g.get("betas").is_some());
        if o.cycle_momentum
            && !opt
                .groups()
                .iter()
                .all(|g| g.get("betas").is_some() || g.get("momentum").is_some())
        {
            bail!(
                NAME,
                "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
            );
        }
        for (g, &m) in opt.groups_mut().iter_mut().zip(max_lrs) {
            let initial = m / o.div_factor;
            g.set("initial_lr", initial);
            g.set("max_lr", m);
            g.set("min_lr", initial / o.final_div_factor);
            if o.cycle_momentum {
                g.set_momentum(o.max_momentum);
                g.set("max_momentum", o.max_momentum);
                g.set("base_momentum", o.base_momentum);
            }
        }
        let rule = OneCycleRule {
            total_steps,
            pct_start: o.pct_start,
            three_phase: o.three_phase,
            anneal: o.anneal_strategy,
            cycle_momentum: o.cycle_momentum,
            use_beta1,
            phases: phases(total_steps, o.pct_start, o.three_phase),
        };
        Scheduler::start(opt, rule)
    }
}
