//! CosineAnnealingLR (PyTorch's recursive form: past `T_max` it climbs
//! again) and CosineAnnealingWarmRestarts (SGDR).

use super::{num, HasParamGroups, Rule, SchedState, Scheduler};
use crate::optim::group::{get_i64, Dict, ParamGroup, Value};
use kiln_ir::{bail, Result};
use std::f64::consts::PI;

/// Cosine annealing from the base lr to `eta_min` over `t_max` epochs.
#[derive(Clone, Debug)]
pub struct CosineRule {
    pub t_max: i64,
    pub eta_min: f64,
}
pub type CosineAnnealingLR = Scheduler<CosineRule>;

impl Rule for CosineRule {
    const NAME: &'static str = "CosineAnnealingLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        let (t, e, eta) = (self.t_max as f64, s.last_epoch, self.eta_min);
        let pairs = s.base_lrs.iter().zip(groups.iter());
        if s.is_initial {
            groups.iter().map(|g| g.lr()).collect()
        } else if s.step_count == 1 && e > 0 {
            pairs
                .map(|(b, _)| eta + (b - eta) * (1.0 + (e as f64 * PI / t).cos()) / 2.0)
                .collect()
        } else if (e - 1 - self.t_max).rem_euclid(2 * self.t_max) == 0 {
            pairs
                .map(|(b, g)| g.lr() + (b - eta) * (1.0 - (PI / t).cos()) / 2.0)
                .collect()
        } else {
            let e = e as f64;
            groups
                .iter()
                .map(|g| {
                    (1.0 + (PI * e / t).cos()) / (1.0 + (PI * (e - 1.0) / t).cos()) * (g.lr() - eta)
                        + eta
                })
                .collect()
        }
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let (t, e, eta) = (self.t_max as f64, s.last_epoch as f64, self.eta_min);
        Some(
            s.base_lrs
                .iter()
                .map(|b| eta + (b - eta) * (1.0 + (PI * e / t).cos()) / 2.0)
                .collect(),
        )
    }
    fn save(&self, d: &mut Dict) {
        d.insert("T_max".into(), Value::Int(self.t_max));
        d.insert("eta_min".into(), Value::Float(self.eta_min));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.t_max = get_i64(d, Self::NAME, "T_max")?;
        self.eta_min = num(d, Self::NAME, "eta_min")?;
        Ok(())
    }
}

impl CosineAnnealingLR {
    pub fn new(
        opt: &mut dyn HasParamGroups,
        t_max: i64,
        eta_min: f64,
    ) -> Result<CosineAnnealingLR> {
        if t_max <= 0 {
            bail!("CosineAnnealingLR", "T_max must be positive, got {t_max}");
        }
        Scheduler::start(opt, CosineRule { t_max, eta_min })
    }
}

/// SGDR: cosine annealing restarted every `T_i` epochs, `T_i` growing by `t_mult`.
#[derive(Clone, Debug)]
pub struct WarmRestartsRule {
    pub t_0: i64,
    pub t_i: i64,
    pub t_mult: i64,
    pub eta_min: f64,
    pub t_cur: i64,
}
pub type CosineAnnealingWarmRestarts = Scheduler<WarmRestartsRule>;

impl Rule for WarmRestartsRule {
    const NAME: &'static str = "CosineAnnealingWarmRestarts";
    fn get_lr(&mut self, s: &SchedState, _groups: &mut [ParamGroup]) -> Vec<f64> {
        // PyTorch's step(): the first call (last_epoch -1 -> 0) is step(epoch=0)
        if s.last_epoch == 0 {
            self.t_i = self.t_0;
            self.t_cur = 0;
        } else {
            self.t_cur += 1;
            if self.t_cur >= self.t_i {
                self.t_cur %= self.t_i;
                self.t_i *= self.t_mult;
            }
        }
        let (eta, x) = (self.eta_min, self.t_cur as f64 / self.t_i as f64);
        s.base_lrs
            .iter()
            .map(|b| eta + (b - eta) * (1.0 + (PI * x).cos()) / 2.0)
            .collect()
    }
    fn save(&self, d: &mut Dict) {
        d.insert("T_0".into(), Value::Int(self.t_0));
        d.insert("T_i".into(), Value::Int(self.t_i));
        d.insert("T_mult".into(), Value::Int(self.t_mult));
        d.insert("eta_min".into(), Value::Float(self.eta_min));
        d.insert("T_cur".into(), Value::Int(self.t_cur));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.t_0 = get_i64(d, Self::NAME, "T_0")?;
        self.t_i = get_i64(d, Self::NAME, "T_i")?;
        self.t_mult = get_i64(d, Self::NAME, "T_mult")?;
        self.eta_min = num(d, Self::NAME, "eta_min")?;
        self.t_cur = get_i64(d, Self::NAME, "T_cur")?;
        Ok(())
    }
}

impl CosineAnnealingWarmRestarts {
    pub fn new(
        opt: &mut dyn HasParamGroups,
        t_0: i64,
        t_mult: i64,
        eta_min: f64,
    ) -> Result<CosineAnnealingWarmRestarts> {
        if t_0 <= 0 {
            bail!(
                WarmRestartsRule::NAME,
                "Expected positive integer T_0, but got {t_0}"
            );
        }
        if t_mult < 1 {
            bail!(
                WarmRestartsRule::NAME,
                "Expected integer T_mult >= 1, but got {t_mult}"
            );
        }
        Scheduler::start(
            opt,
            WarmRestartsRule {
                t_0,
                t_i: t_0,
                t_mult,
                eta_min,
                t_cur: -1,
            },
        )
    }
}
