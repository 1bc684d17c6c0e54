//! SequentialLR: hands over from one scheduler to the next at milestones.

use super::{bisect_right, load_sub_states, HasParamGroups, LRScheduler};
use crate::optim::group::{get_floats, get_i64, Dict, Value};
use kiln_ir::{bail, Result};

/// Runs `schedulers[i]` between `milestones[i-1]` and `milestones[i]`; at a
/// milestone the next one starts from its epoch 0 (closed form).
pub struct SequentialLR {
    schedulers: Vec<Box<dyn LRScheduler>>,
    milestones: Vec<i64>,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

impl SequentialLR {
    /// The sub-schedulers must already be built on `opt`, in order (as in
    /// PyTorch); this resets the lrs to `initial_lr` and restarts the first.
    pub fn new(
        opt: &mut dyn HasParamGroups,
        mut schedulers: Vec<Box<dyn LRScheduler>>,
        milestones: Vec<i64>,
    ) -> Result<SequentialLR> {
        if schedulers.is_empty() {
            bail!(
                "SequentialLR",
                "expects at least one scheduler, but got no scheduler"
            );
        }
        if milestones.len() != schedulers.len() - 1 {
            bail!(
                "SequentialLR",
                "expects one more scheduler than milestones, got {} schedulers and {} milestones",
                schedulers.len(),
                milestones.len()
            );
        }
        for g in opt.groups_mut() {
            let lr = g.f64("initial_lr")?;
            g.set_lr(lr);
        }
        for s in schedulers.iter_mut() {
            s.undo();
        }
        schedulers[0].initial_step(opt)?;
        let last_lr = schedulers[0].get_last_lr();
        Ok(SequentialLR {
            schedulers,
            milestones,
            last_epoch: 0,
            last_lr,
        })
    }
}

impl LRScheduler for SequentialLR {
    fn step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        self.last_epoch += 1;
        let idx = bisect_right(&self.milestones, self.last_epoch);
        let s = &mut self.schedulers[idx];
        if idx > 0 && self.milestones[idx - 1] == self.last_epoch {
            s.update_lr(opt, Some(0))?;
        } else {
            s.step(opt)?;
        }
        self.last_lr = s.get_last_lr();
        Ok(())
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    fn state_dict(&self) -> Dict {
        let mut d = Dict::new();
        d.insert("last_epoch".into(), Value::Int(self.last_epoch));
        d.insert("_milestones".into(), Value::Ints(self.milestones.clone()));
        d.insert("_last_lr".into(), Value::Floats(self.last_lr.clone()));
        let subs = self.schedulers.iter().map(|s| s.state_dict()).collect();
        d.insert("_schedulers".into(), Value::List(subs));
        d
    }

    fn load_state_dict(&mut self, sd: &Dict) -> Result<()> {
        const NAME: &str = "SequentialLR";
        self.last_epoch = get_i64(sd, NAME, "last_epoch")?;
        self.last_lr = get_floats(sd, NAME, "_last_lr")?;
        if let Some(Value::Ints(m)) = sd.get("_milestones") {
            self.milestones = m.clone();
        }
        load_sub_states(NAME, sd, &mut self.schedulers)
    }

    fn update_lr(&mut self, opt: &mut dyn HasParamGroups, epoch: Option<i64>) -> Result<()> {
        match epoch {
            None => self.step(opt),
            Some(_) => bail!("SequentialLR", "cannot jump to an epoch"),
        }
    }

    fn initial_step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        self.schedulers[0].initial_step(opt)?;
        self.last_lr = self.schedulers[0].get_last_lr();
        Ok(())
    }

    fn undo(&mut self) {
        for s in self.schedulers.iter_mut() {
            s.undo();
        }
    }
}
