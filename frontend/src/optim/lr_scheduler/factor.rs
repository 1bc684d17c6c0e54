//! The factor schedulers: ConstantLR, MultiplicativeLR, LambdaLR and
//! PolynomialLR (PyTorch's chainable forms and closed forms).

use super::{num, HasParamGroups, Rule, SchedState, Scheduler};
use crate::optim::group::{get_i64, Dict, ParamGroup, Value};
use kiln_ir::{bail, Result};
use std::sync::Arc;

fn lrs(groups: &[ParamGroup], f: impl Fn(f64) -> f64) -> Vec<f64> {
    groups.iter().map(|g| f(g.lr())).collect()
}

/// `lr * factor` until epoch `total_iters`, then the base lr.
#[derive(Clone, Debug)]
pub struct ConstantRule {
    pub factor: f64,
    pub total_iters: i64,
}
pub type ConstantLR = Scheduler<ConstantRule>;

impl Rule for ConstantRule {
    const NAME: &'static str = "ConstantLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        match s.last_epoch {
            0 => lrs(groups, |lr| lr * self.factor),
            e if e == self.total_iters => lrs(groups, |lr| lr * (1.0 / self.factor)),
            _ => lrs(groups, |lr| lr),
        }
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let done = if s.last_epoch >= self.total_iters {
            1.0
        } else {
            0.0
        };
        let f = self.factor + done * (1.0 - self.factor);
        Some(s.base_lrs.iter().map(|b| b * f).collect())
    }
    fn save(&self, d: &mut Dict) {
        d.insert("factor".into(), Value::Float(self.factor));
        d.insert("total_iters".into(), Value::Int(self.total_iters));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.factor = num(d, Self::NAME, "factor")?;
        self.total_iters = get_i64(d, Self::NAME, "total_iters")?;
        Ok(())
    }
}

impl ConstantLR {
    /// PyTorch's defaults are `factor` 1/3, `total_iters` 5.
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{ConstantLR, LRScheduler};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    /// let mut s = ConstantLR::new(&mut opt, 0.5, 2).unwrap();
    /// let mut lrs = vec![];
    /// for _ in 0..3 {
    ///     lrs.push(opt.param_groups()[0].lr());
    ///     s.step(&mut opt).unwrap();
    /// }
    /// assert_eq!(lrs, vec![0.05, 0.05, 0.1]);
    /// ```
    pub fn new(opt: &mut dyn HasParamGroups, factor: f64, total_iters: i64) -> Result<ConstantLR> {
        if !(0.0..=1.0).contains(&factor) {
            bail!(
                "ConstantLR",
                "Constant multiplicative factor expected to be between 0 and 1, got {factor}"
            );
        }
        Scheduler::start(
            opt,
            ConstantRule {
                factor,
                total_iters,
            },
        )
    }
}

/// A user function of the epoch (`lr_lambda`): shared, so one function can
/// serve every param group.
pub type LrLambda = Arc<dyn Fn(i64) -> f64 + Send + Sync>;

/// One `lr_lambda` per param group: `one` for every group, or exactly one each.
fn per_group(name: &str, opt: &dyn HasParamGroups, fs: Vec<LrLambda>) -> Result<Vec<LrLambda>> {
    let n = opt.groups().len();
    match fs.len() {
        1 => Ok(vec![fs[0].clone(); n]),
        m if m == n => Ok(fs),
        m => bail!(name, "Expected {n} lr_lambdas, but got {m}"),
    }
}

/// `lr = base_lr * lr_lambda(epoch)`.
pub struct LambdaRule {
    pub lr_lambdas: Vec<LrLambda>,
}
pub type LambdaLR = Scheduler<LambdaRule>;

impl Rule for LambdaRule {
    const NAME: &'static str = "LambdaLR";
    fn get_lr(&mut self, s: &SchedState, _groups: &mut [ParamGroup]) -> Vec<f64> {
        let pairs = s.base_lrs.iter().zip(&self.lr_lambdas);
        pairs.map(|(b, f)| b * f(s.last_epoch)).collect()
    }
    // functions are not state (PyTorch saves only callable objects' dicts)
    fn save(&self, _d: &mut Dict) {}
    fn load(&mut self, _d: &Dict) -> Result<()> {
        Ok(())
    }
}

impl LambdaLR {
    /// `lr_lambdas`: one function for every group, or one per group.
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{LRScheduler, LambdaLR};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// use std::sync::Arc;
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    /// let mut s = LambdaLR::new(&mut opt, vec![Arc::new(|e: i64| 0.5f64.powi(e as i32))]).unwrap();
    /// s.step(&mut opt).unwrap();
    /// assert_eq!(opt.param_groups()[0].lr(), 0.05);
    /// ```
    pub fn new(opt: &mut dyn HasParamGroups, lr_lambdas: Vec<LrLambda>) -> Result<LambdaLR> {
        let lr_lambdas = per_group("LambdaLR", opt, lr_lambdas)?;
        Scheduler::start(opt, LambdaRule { lr_lambdas })
    }
}

/// `lr *= lr_lambda(epoch)` from epoch 1 on.
pub struct MultiplicativeRule {
    pub lr_lambdas: Vec<LrLambda>,
}
pub type MultiplicativeLR = Scheduler<MultiplicativeRule>;

impl Rule for MultiplicativeRule {
    const NAME: &'static str = "MultiplicativeLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        let pairs = groups.iter().zip(&self.lr_lambdas);
        match s.last_epoch {
            e if e > 0 => pairs.map(|(g, f)| g.lr() * f(e)).collect(),
            _ => lrs(groups, |lr| lr),
        }
    }
    fn save(&self, _d: &mut Dict) {}
    fn load(&mut self, _d: &Dict) -> Result<()> {
        Ok(())
    }
}

impl MultiplicativeLR {
    /// `lr_lambdas`: one function for every group, or one per group.
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{LRScheduler, MultiplicativeLR};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// use std::sync::Arc;
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    /// let mut s = MultiplicativeLR::new(&mut opt, vec![Arc::new(|_: i64| 0.5)]).unwrap();
    /// s.step(&mut opt).unwrap();
    /// s.step(&mut opt).unwrap();
    /// assert_eq!(opt.param_groups()[0].lr(), 0.025);
    /// ```
    pub fn new(
        opt: &mut dyn HasParamGroups,
        lr_lambdas: Vec<LrLambda>,
    ) -> Result<MultiplicativeLR> {
        let lr_lambdas = per_group("MultiplicativeLR", opt, lr_lambdas)?;
        Scheduler::start(opt, MultiplicativeRule { lr_lambdas })
    }
}

/// `base_lr * (1 - epoch / total_iters)^power`, then constant.
#[derive(Clone, Debug)]
pub struct PolynomialRule {
    pub total_iters: i64,
    pub power: f64,
}
pub type PolynomialLR = Scheduler<PolynomialRule>;

impl Rule for PolynomialRule {
    const NAME: &'static str = "PolynomialLR";
    fn get_lr(&mut self, s: &SchedState, groups: &mut [ParamGroup]) -> Vec<f64> {
        let (e, n) = (s.last_epoch, self.total_iters);
        if e == 0 || e > n {
            return lrs(groups, |lr| lr);
        }
        let (e, n) = (e as f64, n as f64);
        let f = ((1.0 - e / n) / (1.0 - (e - 1.0) / n)).powf(self.power);
        lrs(groups, |lr| lr * f)
    }
    fn closed_form(&self, s: &SchedState) -> Option<Vec<f64>> {
        let n = self.total_iters;
        let f = (1.0 - n.min(s.last_epoch) as f64 / n as f64).powf(self.power);
        Some(s.base_lrs.iter().map(|b| b * f).collect())
    }
    fn save(&self, d: &mut Dict) {
        d.insert("total_iters".into(), Value::Int(self.total_iters));
        d.insert("power".into(), Value::Float(self.power));
    }
    fn load(&mut self, d: &Dict) -> Result<()> {
        self.total_iters = get_i64(d, Self::NAME, "total_iters")?;
        self.power = num(d, Self::NAME, "power")?;
        Ok(())
    }
}

impl PolynomialLR {
    /// PyTorch's defaults are `total_iters` 5, `power` 1.
    ///
    /// ```
    /// use kiln_frontend::optim::lr_scheduler::{LRScheduler, PolynomialLR};
    /// use kiln_frontend::optim::{Optimizer, SgdConfig, SGD};
    /// use kiln_frontend::{DType, Tensor};
    /// let w = Tensor::zeros(&[1], DType::F32).requires_grad_(true);
    /// let mut opt = SGD::with_params(vec![w], SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    /// let mut s = PolynomialLR::new(&mut opt, 2, 1.0).unwrap();
    /// s.step(&mut opt).unwrap();
    /// assert!((opt.param_groups()[0].lr() - 0.05).abs() < 1e-12);
    /// ```
    pub fn new(opt: &mut dyn HasParamGroups, total_iters: i64, power: f64) -> Result<PolynomialLR> {
        if total_iters <= 0 {
            bail!(
                "PolynomialLR",
                "total_iters must be positive, got {total_iters}"
            );
        }
        Scheduler::start(opt, PolynomialRule { total_iters, power })
    }
}
