//! ChainedScheduler: steps every one of its schedulers at each step, so
//! their factors multiply.

use super::{load_sub_states, HasParamGroups, LRScheduler};
use crate::optim::group::{get_floats, Dict, Value};
use kiln_ir::{bail, Result};

/// Several schedulers on one optimizer, stepped together in order.
pub struct ChainedScheduler {
    schedulers: Vec<Box<dyn LRScheduler>>,
    last_lr: Vec<f64>,
}

impl ChainedScheduler {
    /// The schedulers must already be built on `opt` (as in PyTorch).
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{ChainedScheduler, ExponentialLR, LRScheduler, StepLR};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 1.0, ..Default::default() }).unwrap();
    /// let a = ExponentialLR::new(&mut opt, 0.5).unwrap();
    /// let b = StepLR::new(&mut opt, 2, 0.1).unwrap();
    /// let subs: Vec<Box<dyn LRScheduler>> = vec![Box::new(a), Box::new(b)];
    /// let mut s = ChainedScheduler::new(&opt, subs).unwrap();
    /// s.step(&mut opt).unwrap();
    /// s.step(&mut opt).unwrap();
    /// assert!((opt.param_groups()[0].lr() - 0.025).abs() < 1e-12);
    /// ```
    pub fn new(
        opt: &dyn HasParamGroups,
        schedulers: Vec<Box<dyn LRScheduler>>,
    ) -> Result<ChainedScheduler> {
        if schedulers.is_empty() {
            bail!(
                "ChainedScheduler",
                "expects at least one scheduler to be chained, but got no scheduler"
            );
        }
        let last_lr = opt.groups().iter().map(|g| g.lr()).collect();
        Ok(ChainedScheduler {
            schedulers,
            last_lr,
        })
    }
}

impl LRScheduler for ChainedScheduler {
    fn step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        for s in self.schedulers.iter_mut() {
            s.step(opt)?;
        }
        self.last_lr = opt.groups().iter().map(|g| g.lr()).collect();
        Ok(())
    }

    fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }

    fn last_epoch(&self) -> i64 {
        self.schedulers[0].last_epoch()
    }

    fn state_dict(&self) -> Dict {
        let mut d = Dict::new();
        d.insert("_last_lr".into(), Value::Floats(self.last_lr.clone()));
        let subs = self.schedulers.iter().map(|s| s.state_dict()).collect();
        d.insert("_schedulers".into(), Value::List(subs));
        d
    }

    fn load_state_dict(&mut self, sd: &Dict) -> Result<()> {
        const NAME: &str = "ChainedScheduler";
        self.last_lr = get_floats(sd, NAME, "_last_lr")?;
        load_sub_states(NAME, sd, &mut self.schedulers)
    }

    fn update_lr(&mut self, opt: &mut dyn HasParamGroups, epoch: Option<i64>) -> Result<()> {
        match epoch {
            None => self.step(opt),
            Some(_) => bail!("ChainedScheduler", "cannot jump to an epoch"),
        }
    }

    fn initial_step(&mut self, opt: &mut dyn HasParamGroups) -> Result<()> {
        for s in self.schedulers.iter_mut() {
            s.initial_step(opt)?;
        }
        self.last_lr = opt.groups().iter().map(|g| g.lr()).collect();
        Ok(())
    }

    fn undo(&mut self) {
        for s in self.schedulers.iter_mut() {
            s.undo();
        }
    }
}
