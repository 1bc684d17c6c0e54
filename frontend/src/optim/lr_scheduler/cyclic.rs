//! CyclicLR: the lr cycles between `base_lr` and `max_lr` (and, with
//! `cycle_momentum`, the momentum inversely between `max_momentum` and
//! `base_momentum`), the amplitude scaled per cycle or per iteration.

use super::{num, HasParamGroups, Rule, SchedState, Scheduler};
use crate::optim::group::{get_floats, Dict, ParamGroup, Value};
use kiln_ir::{bail, Result};

/// CyclicLR's amplitude policy (`mode=`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CyclicMode {
    /// Constant amplitude.
    Triangular,
    /// The amplitude halves every cycle.
    Triangular2,
    /// The amplitude is `gamma ** iteration`.
    ExpRange,
}

impl CyclicMode {
    pub fn name(self) -> &'static str {
        match self {
            CyclicMode::Triangular => "triangular",
            CyclicMode::Triangular2 => "triangular2",
            CyclicMode::ExpRange => "exp_range",
        }
    }
    /// The mode named as in PyTorch; an error for any other name.
    pub fn parse(name: &str) -> Result<CyclicMode> {
        Ok(match name {
            "triangular" => CyclicMode::Triangular,
            "triangular2" => CyclicMode::Triangular2,
            "exp_range" => CyclicMode::ExpRange,
            other => bail!(
                "CyclicLR",
                "mode is invalid and scale_fn is None: '{other}'"
            ),
        })
    }
    /// `scale_fn(cycle)` for the cycle modes, `scale_fn(last_epoch)` for exp_range.
    fn scale(self, gamma: f64, cycle: f64, iteration: f64) -> f64 {
        match self {
            CyclicMode::Triangular => 1.0,
            CyclicMode::Triangular2 => 1.0 / 2f64.powf(cycle - 1.0),
            CyclicMode::ExpRange => gamma.powf(iteration),
        }
    }
}

/// CyclicLR's keyword arguments (PyTorch's defaults).
#[derive(Clone, Debug)]
pub struct CyclicOptions {
    pub step_size_up: f64,
    /// `None`: as `step_size_up`.
    pub step_size_down: Option<f64>,
    pub mode: CyclicMode,
    pub gamma: f64,
    pub cycle_momentum: bool,
    pub base_momentum: f64,
    pub max_momentum: f64,
}

impl Default for CyclicOptions {
    fn default() -> Self {
        CyclicOptions {
            step_size_up: 2000.0,
            step_size_down: None,
            mode: CyclicMode::Triangular,
            gamma: 1.0,
            cycle_momentum: true,
            base_momentum: 0.8,
            max_momentum: 0.9,
        }
    }
}

#[derive(Clone, Debug)]
pub struct CyclicRule {
    pub max_lrs: Vec<f64>,
    pub total_size: f64,
    pub step_ratio: f64,
    pub mode: CyclicMode,
    pub gamma: f64,
    pub cycle_momentum: bool,
    pub base_momentums: Vec<f64>,
    pub max_momentums: Vec<f64>,
}
pub type CyclicLR = Scheduler<CyclicRule>;

impl Rule for CyclicRule {
    const NAME: &'static str = "CyclicLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        let e = s.last_epoch as f64;
        let cycle = (1.0 + e / self.total_size).floor();
        let x = 1.0 + e / self.total_size - cycle;
        let factor = if x <= self.step_ratio {
            x / self.step_ratio
        } else {
            (x - 1.0) / (self.step_ratio - 1.0)
        };
        let scale = self.mode.scale(self.gamma, cycle, e);
        if self.cycle_momentum {
            let ms = self.base_momentums.iter().zip(&self.max_momentums);
            for (g, (b, m)) in groups.iter_mut().zip(ms) {
                g.set_momentum(m - (m - b) * factor * scale);
            }
        }
        let pairs = s.base_lrs.iter().zip(&self.max_lrs);
        pairs.map(|(b, m)| b + (m - b) * factor * scale).collect()
    }
    fn save(&self, d: &mut Dict) {
        d.insert("max_lrs".into(), Value::Floats(self.max_lrs.clone()));
        d.insert("total_size".into(), Value::Float(self.total_size));
        d.insert("step_ratio".into(), Value::Float(self.step_ratio));
        d.insert("mode".into(), Value::Str(self.mode.name().into()));
        d.insert("gamma".into(), Value::Float(self.gamma));
        d.insert("cycle_momentum".into(), Value::Bool(self.cycle_momentum));
        d.insert(
            "base_momentums".into(),
            Value::Floats(self.base_momentums.clone()),
        );
        d.insert(
            "max_momentums".into(),
            Value::Floats(self.max_momentums.clone()),
        );
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.max_lrs = get_floats(d, Self::NAME, "max_lrs")?;
        self.total_size = num(d, Self::NAME, "total_size")?;
        self.step_ratio = num(d, Self::NAME, "step_ratio")?;
        self.mode = match d.get("mode") {
            Some(Value::Str(m)) => CyclicMode::parse(m)?,
            _ => bail!(Self::NAME, "state has no string under key 'mode'"),
        };
        self.gamma = num(d, Self::NAME, "gamma")?;
        self.cycle_momentum = matches!(d.get("cycle_momentum"), Some(Value::Bool(true)));
        if self.cycle_momentum {
            self.base_momentums = get_floats(d, Self::NAME, "base_momentums")?;
            self.max_momentums = get_floats(d, Self::NAME, "max_momentums")?;
        }
        Ok(())
    }
}

impl CyclicLR {
    /// Sets every group's lr to `base_lr` (and, cycling momentum, its
    /// momentum to `max_momentum`), then takes the initial step.
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{CyclicLR, CyclicOptions, LRScheduler};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let cfg = SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() };
    /// let mut opt = SGD::with_params(vec![w], cfg).unwrap();
    /// let o = CyclicOptions { step_size_up: 2.0, ..Default::default() };
    /// let mut s = CyclicLR::new(&mut opt, 0.0, 1.0, o).unwrap();
    /// let mut lrs = vec![];
    /// for _ in 0..5 {
    ///     lrs.push(opt.param_groups()[0].lr());
    ///     s.step(&mut opt).unwrap();
    /// }
    /// assert_eq!(lrs, vec![0.0, 0.5, 1.0, 0.5, 0.0]);
    /// ```
    pub fn new(
        opt: &mut dyn HasParamGroups,
        base_lr: f64,
        max_lr: f64,
        o: CyclicOptions,
    ) -> Result<CyclicLR> {
        let n = opt.groups().len();
        if o.cycle_momentum && !opt.groups().iter().all(|g| g.momentum().is_some()) {
            bail!(
                "CyclicLR",
                "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
            );
        }
        if o.step_size_up <= 0.0 || o.step_size_down.is_some_and(|d| d < 0.0) {
            bail!(
                "CyclicLR",
                "step_size_up ({}) must be positive and step_size_down ({:?}) not negative",
                o.step_size_up,
                o.step_size_down
            );
        }
        for g in opt.groups_mut() {
            g.set_lr(base_lr);
            if o.cycle_momentum {
                g.set_momentum(o.max_momentum);
                g.set("max_momentum", o.max_momentum);
                g.set("base_momentum", o.base_momentum);
            }
        }
        let total_size = o.step_size_up + o.step_size_down.unwrap_or(o.step_size_up);
        let rule = CyclicRule {
            max_lrs: vec![max_lr; n],
            total_size,
            step_ratio: o.step_size_up / total_size,
            mode: o.mode,
            gamma: o.gamma,
            cycle_momentum: o.cycle_momentum,
            base_momentums: vec![o.base_momentum; n],
            max_momentums: vec![o.max_momentum; n],
        };
        Scheduler::start(opt, rule)
    }
}
