//! ReduceLROnPlateau: lowers the lr when a metric stops improving.

use super::{num, HasParamGroups};
use crate::optim::group::{get_floats, get_i64, Dict, Value};
use kiln_ir::{bail, Result};

/// ReduceLROnPlateau's arguments (PyTorch's defaults). `mode` is `"min"` or
/// `"max"`, `threshold_mode` `"rel"` or `"abs"`.
#[derive(Clone, Debug)]
pub struct PlateauOptions {
    pub mode: String,
    pub factor: f64,
    pub patience: i64,
    pub threshold: f64,
    pub threshold_mode: String,
    pub cooldown: i64,
    /// One value for every group, or one per group.
    pub min_lr: Vec<f64>,
    pub eps: f64,
}

impl Default for PlateauOptions {
    fn default() -> Self {
        PlateauOptions {
            mode: "min".into(),
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            threshold_mode: "rel".into(),
            cooldown: 0,
            min_lr: vec![0.0],
            eps: 1e-8,
        }
    }
}

/// `torch.optim.lr_scheduler.ReduceLROnPlateau`; `step` takes the metric.
pub struct ReduceLROnPlateau {
    o: PlateauOptions,
    min_lrs: Vec<f64>,
    best: f64,
    num_bad_epochs: i64,
    cooldown_counter: i64,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

const NAME: &str = "ReduceLROnPlateau";

impl ReduceLROnPlateau {
    pub fn new(opt: &mut dyn HasParamGroups, o: PlateauOptions) -> Result<ReduceLROnPlateau> {
        if o.factor >= 1.0 {
            bail!(NAME, "Factor should be < 1.0, got {}", o.factor);
        }
        if o.mode != "min" && o.mode != "max" {
            bail!(NAME, "mode {} is unknown!", o.mode);
        }
        if o.threshold_mode != "rel" && o.threshold_mode != "abs" {
            bail!(NAME, "threshold mode {} is unknown!", o.threshold_mode);
        }
        let n = opt.groups().len();
        let min_lrs = match o.min_lr.len() {
            1 => vec![o.min_lr[0]; n],
            k if k == n => o.min_lr.clone(),
            k => bail!(NAME, "expected {n} min_lrs, got {k}"),
        };
        let mut me = ReduceLROnPlateau {
            o,
            min_lrs,
            best: 0.0,
            num_bad_epochs: 0,
            cooldown_counter: 0,
            last_epoch: 0,
            last_lr: opt.groups().iter().map(|g| g.lr()).collect(),
        };
        me.best = me.mode_worse();
        Ok(me)
    }

    fn mode_worse(&self) -> f64 {
        if self.o.mode == "min" {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        }
    }

    fn is_better(&self, a: f64, best: f64) -> bool {
        let t = self.o.threshold;
        match (self.o.mode.as_str(), self.o.threshold_mode.as_str()) {
            ("min", "rel") => a < best * (1.0 - t),
            ("min", _) => a < best - t,
            (_, "rel") => a > best * (t + 1.0),
            _ => a > best + t,
        }
    }

    /// `scheduler.step(metrics)`.
    pub fn step(&mut self, opt: &mut dyn HasParamGroups, metric: f64) -> Result<()> {
        self.last_epoch += 1;
        if self.is_better(metric, self.best) {
            self.best = metric;
            self.num_bad_epochs = 0;
        } else {
            self.num_bad_epochs += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
        }
        if self.num_bad_epochs > self.o.patience {
            if self.min_lrs.len() != opt.groups().len() {
                bail!(
                    NAME,
                    "the optimizer has {} param groups, min_lrs {}",
                    opt.groups().len(),
                    self.min_lrs.len()
                );
            }
            for (g, &min_lr) in opt.groups_mut().iter_mut().zip(&self.min_lrs) {
                let old = g.lr();
                let new = (old * self.o.factor).max(min_lr);
                if old - new > self.o.eps {
                    g.set_lr(new);
                }
            }
            self.cooldown_counter = self.o.cooldown;
            self.num_bad_epochs = 0;
        }
        self.last_lr = opt.groups().iter().map(|g| g.lr()).collect();
        Ok(())
    }

    pub fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }

    pub fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    /// Every setting and counter under PyTorch's attribute names.
    pub fn state_dict(&self) -> Dict {
        let mut d = Dict::new();
        let o = &self.o;
        d.insert("mode".into(), Value::Str(o.mode.clone()));
        d.insert("factor".into(), Value::Float(o.factor));
        d.insert("patience".into(), Value::Int(o.patience));
        d.insert("threshold".into(), Value::Float(o.threshold));
        d.insert(
            "threshold_mode".into(),
            Value::Str(o.threshold_mode.clone()),
        );
        d.insert("cooldown".into(), Value::Int(o.cooldown));
        d.insert("min_lrs".into(), Value::Floats(self.min_lrs.clone()));
        d.insert("eps".into(), Value::Float(o.eps));
        d.insert("best".into(), Value::Float(self.best));
        d.insert("num_bad_epochs".into(), Value::Int(self.num_bad_epochs));
        d.insert("cooldown_counter".into(), Value::Int(self.cooldown_counter));
        d.insert("last_epoch".into(), Value::Int(self.last_epoch));
        d.insert("_last_lr".into(), Value::Floats(self.last_lr.clone()));
        d
    }

    pub fn load_state_dict(&mut self, d: &Dict) -> Result<()> {
        let s = |k: &str| match d.get(k) {
            Some(Value::Str(s)) => Ok(s.clone()),
            _ => Err(kiln_ir::Error::op(
                NAME,
                format!("state has no string under key '{k}'"),
            )),
        };
        self.o.mode = s("mode")?;
        self.o.threshold_mode = s("threshold_mode")?;
        self.o.factor = num(d, NAME, "factor")?;
        self.o.patience = get_i64(d, NAME, "patience")?;
        self.o.threshold = num(d, NAME, "threshold")?;
        self.o.cooldown = get_i64(d, NAME, "cooldown")?;
        self.o.eps = num(d, NAME, "eps")?;
        self.min_lrs = get_floats(d, NAME, "min_lrs")?;
        self.best = num(d, NAME, "best")?;
        self.num_bad_epochs = get_i64(d, NAME, "num_bad_epochs")?;
        self.cooldown_counter = get_i64(d, NAME, "cooldown_counter")?;
        self.last_epoch = get_i64(d, NAME, "last_epoch")?;
        self.last_lr = get_floats(d, NAME, "_last_lr")?;
        Ok(())
    }
}
