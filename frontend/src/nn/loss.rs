//! Loss modules (`nn.CrossEntropyLoss`, `nn.MSELoss`, ...): the options of a
//! loss held in a struct whose `forward(input, target)` calls the functional
//! version. (A loss takes two inputs, so it is not a [`super::Module`].)
//!
//! ```
//! use kiln_frontend::nn::CrossEntropyLoss;
//! use kiln_frontend::{DType, Tensor};
//! let logits = Tensor::zeros(&[2, 3], DType::F32);
//! let target = Tensor::from_vec(vec![0i64, 2], &[2]).unwrap();
//! let loss = CrossEntropyLoss::new().label_smoothing(0.1).forward(&logits, &target).unwrap();
//! assert!((loss.item().unwrap() - 3f64.ln()).abs() < 1e-6);
//! ```

use crate::functional as F;
use crate::Tensor;
use kiln_ir::{bail, Result};
use kiln_passes::{ClassLossOpts, Reduction};

/// `nn.CrossEntropyLoss(weight, ignore_index=-100, reduction='mean',
/// label_smoothing=0.0)`: class indices or class probabilities as target.
#[derive(Clone, Debug)]
pub struct CrossEntropyLoss {
    pub weight: Option<Tensor>,
    pub ignore_index: i64,
    pub reduction: Reduction,
    pub label_smoothing: f64,
}

impl Default for CrossEntropyLoss {
    fn default() -> Self {
        CrossEntropyLoss {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

impl CrossEntropyLoss {
    pub fn new() -> Self {
        Self::default()
    }
    /// A manual rescaling weight per class (shape `[C]`).
    pub fn weight(mut self, w: Tensor) -> Self {
        self.weight = Some(w);
        self
    }
    pub fn ignore_index(mut self, i: i64) -> Self {
        self.ignore_index = i;
        self
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn label_smoothing(mut self, eps: f64) -> Self {
        self.label_smoothing = eps;
        self
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            bail!(
                "cross_entropy",
                "label_smoothing must be between 0.0 and 1.0, got {}",
                self.label_smoothing
            );
        }
        let o = ClassLossOpts {
            reduction: self.reduction,
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
        };
        F::cross_entropy(input, target, self.weight.as_ref(), o)
    }
    /// `CrossEntropyLoss()`, as PyTorch prints it.
    pub fn describe(&self) -> String {
        "CrossEntropyLoss()".into()
    }
}

/// `nn.NLLLoss(weight, ignore_index=-100, reduction='mean')` on log-probabilities.
#[derive(Clone, Debug)]
pub struct NLLLoss {
    pub weight: Option<Tensor>,
    pub ignore_index: i64,
    pub reduction: Reduction,
}

impl Default for NLLLoss {
    fn default() -> Self {
        NLLLoss {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

impl NLLLoss {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn weight(mut self, w: Tensor) -> Self {
        self.weight = Some(w);
        self
    }
    pub fn ignore_index(mut self, i: i64) -> Self {
        self.ignore_index = i;
        self
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let o = ClassLossOpts {
            reduction: self.reduction,
            ignore_index: self.ignore_index,
            label_smoothing: 0.0,
        };
        F::nll_loss(input, target, self.weight.as_ref(), o)
    }
    pub fn describe(&self) -> String {
        "NLLLoss()".into()
    }
}

/// The regression losses: a reduction and (for two of them) a threshold.
/// A target whose shape differs from the input's broadcasts, with PyTorch's
/// `UserWarning` ("Using a target size ... that is different to the input
/// size ..."), once per call site — see [`crate::warnings`].
macro_rules! regression_loss {
    ($(#[$m:meta])* $name:ident, $f:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            pub reduction: Reduction,
        }
        impl Default for $name {
            fn default() -> Self {
                $name { reduction: Reduction::Mean }
            }
        }
        impl $name {
            pub fn new() -> Self {
                Self::default()
            }
            pub fn reduction(mut self, r: Reduction) -> Self {
                self.reduction = r;
                self
            }
            #[track_caller]
            pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
                F::$f(input, target, self.reduction)
            }
            pub fn describe(&self) -> String {
                concat!(stringify!($name), "()").into()
            }
        }
    };
}

regression_loss!(
    /// `nn.MSELoss(reduction='mean')`: mean((input - target)^2).
    MSELoss,
    mse_loss
);
regression_loss!(
    /// `nn.L1Loss(reduction='mean')`: mean(|input - target|).
    L1Loss,
    l1_loss
);

/// `nn.SmoothL1Loss(reduction='mean', beta=1.0)`.
#[derive(Clone, Copy, Debug)]
pub struct SmoothL1Loss {
    pub reduction: Reduction,
    pub beta: f64,
}

impl Default for SmoothL1Loss {
    fn default() -> Self {
        SmoothL1Loss {
            reduction: Reduction::Mean,
            beta: 1.0,
        }
    }
}

impl SmoothL1Loss {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn beta(mut self, beta: f64) -> Self {
        self.beta = beta;
        self
    }
    #[track_caller]
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        if self.beta < 0.0 {
            bail!(
                "smooth_l1_loss",
                "smooth_l1_loss does not support negative values for beta, got {}",
                self.beta
            );
        }
        F::smooth_l1_loss(input, target, self.reduction, self.beta)
    }
    pub fn describe(&self) -> String {
        "SmoothL1Loss()".into()
    }
}

/// `nn.HuberLoss(reduction='mean', delta=1.0)`.
#[derive(Clone, Copy, Debug)]
pub struct HuberLoss {
    pub reduction: Reduction,
    pub delta: f64,
}

impl Default for HuberLoss {
    fn default() -> Self {
        HuberLoss {
            reduction: Reduction::Mean,
            delta: 1.0,
        }
    }
}

impl HuberLoss {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn delta(mut self, delta: f64) -> Self {
        self.delta = delta;
        self
    }
    #[track_caller]
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        if self.delta <= 0.0 {
            bail!(
                "huber_loss",
                "huber_loss does not support non-positive values for delta, got {}",
                self.delta
            );
        }
        F::huber_loss(input, target, self.reduction, self.delta)
    }
    pub fn describe(&self) -> String {
        "HuberLoss()".into()
    }
}

/// `nn.BCEWithLogitsLoss(weight, reduction='mean', pos_weight)`: the stable
/// sigmoid + binary cross-entropy; `pos_weight` (broadcast along the last
/// dim, one per class) weighs the positive examples.
#[derive(Clone, Debug)]
pub struct BCEWithLogitsLoss {
    pub weight: Option<Tensor>,
    pub pos_weight: Option<Tensor>,
    pub reduction: Reduction,
}

impl Default for BCEWithLogitsLoss {
    fn default() -> Self {
        BCEWithLogitsLoss {
            weight: None,
            pos_weight: None,
            reduction: Reduction::Mean,
        }
    }
}

impl BCEWithLogitsLoss {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn weight(mut self, w: Tensor) -> Self {
        self.weight = Some(w);
        self
    }
    pub fn pos_weight(mut self, pw: Tensor) -> Self {
        self.pos_weight = Some(pw);
        self
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        F::binary_cross_entropy_with_logits(
            input,
            target,
            self.weight.as_ref(),
            self.pos_weight.as_ref(),
            self.reduction,
        )
    }
    pub fn describe(&self) -> String {
        "BCEWithLogitsLoss()".into()
    }
}

/// `nn.BCELoss(weight, reduction='mean')` on probabilities (logs clamped at -100).
#[derive(Clone, Debug)]
pub struct BCELoss {
    pub weight: Option<Tensor>,
    pub reduction: Reduction,
}

impl Default for BCELoss {
    fn default() -> Self {
        BCELoss {
            weight: None,
            reduction: Reduction::Mean,
        }
    }
}

impl BCELoss {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn weight(mut self, w: Tensor) -> Self {
        self.weight = Some(w);
        self
    }
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        F::binary_cross_entropy(input, target, self.weight.as_ref(), self.reduction)
    }
    pub fn describe(&self) -> String {
        "BCELoss()".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warnings;
    use kiln_ir::DType;

    fn t(v: &[f32], dims: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), dims).unwrap()
    }

    fn close(a: &Tensor, b: &Tensor) {
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn modules_match_the_functional_losses() {
        let x = t(&[0.2, -1.0, 3.0, 0.5, 2.0, -0.3], &[2, 3]);
        let y = t(&[0.0, 1.0, 2.5, 0.5, -2.0, 0.1], &[2, 3]);
        let sum = Reduction::Sum;
        close(
            &MSELoss::new().forward(&x, &y).unwrap(),
            &F::mse_loss(&x, &y, Reduction::Mean).unwrap(),
        );
        close(
            &L1Loss::new().reduction(sum).forward(&x, &y).unwrap(),
            &F::l1_loss(&x, &y, sum).unwrap(),
        );
        close(
            &SmoothL1Loss::new().beta(0.5).forward(&x, &y).unwrap(),
            &F::smooth_l1_loss(&x, &y, Reduction::Mean, 0.5).unwrap(),
        );
        close(
            &HuberLoss::new()
                .delta(2.0)
                .reduction(Reduction::None)
                .forward(&x, &y)
                .unwrap(),
            &F::huber_loss(&x, &y, Reduction::None, 2.0).unwrap(),
        );
        let p = t(&[0.1, 0.9, 0.5, 0.3, 0.7, 0.2], &[2, 3]);
        let b = t(&[0.0, 1.0, 1.0, 0.0, 1.0, 0.0], &[2, 3]);
        let w = t(&[1.0, 2.0, 0.5], &[3]);
        close(
            &BCELoss::new().weight(w.clone()).forward(&p, &b).unwrap(),
            &F::binary_cross_entropy(&p, &b, Some(&w), Reduction::Mean).unwrap(),
        );
        let l = BCEWithLogitsLoss::new()
            .pos_weight(w.clone())
            .forward(&x, &b)
            .unwrap();
        close(
            &l,
            &F::binary_cross_entropy_with_logits(&x, &b, None, Some(&w), Reduction::Mean).unwrap(),
        );
        // pos_weight = 1 is the plain loss
        let ones = Tensor::ones(&[3], DType::F32);
        close(
            &BCEWithLogitsLoss::new()
                .pos_weight(ones)
                .forward(&x, &b)
                .unwrap(),
            &BCEWithLogitsLoss::new().forward(&x, &b).unwrap(),
        );
    }

    #[test]
    fn class_losses_with_options() {
        let x = t(&[2.0, 0.5, -1.0, 0.1, 0.2, 3.0, 1.0, 1.0, 1.0], &[3, 3]);
        let idx = Tensor::from_vec(vec![0i64, 2, -100], &[3]).unwrap();
        let w = t(&[1.0, 2.0, 3.0], &[3]);
        let ce = CrossEntropyLoss::new()
            .weight(w.clone())
            .ignore_index(-100)
            .label_smoothing(0.2);
        let o = ClassLossOpts {
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.2,
        };
        close(
            &ce.forward(&x, &idx).unwrap(),
            &F::cross_entropy(&x, &idx, Some(&w), o).unwrap(),
        );
        // the ignored row does not count: same as the first two rows alone
        let l = CrossEntropyLoss::new()
            .forward(&x, &idx)
            .unwrap()
            .item()
            .unwrap();
        let two = CrossEntropyLoss::new()
            .forward(&x.narrow(0, 0, 2).unwrap(), &idx.narrow(0, 0, 2).unwrap())
            .unwrap();
        assert!((l - two.item().unwrap()).abs() < 1e-6);
        let nll = NLLLoss::new()
            .reduction(Reduction::Sum)
            .forward(&x.log_softmax(1).unwrap(), &idx)
            .unwrap();
        let ce_sum = CrossEntropyLoss::new()
            .reduction(Reduction::Sum)
            .forward(&x, &idx)
            .unwrap();
        close(&nll, &ce_sum);
        let err = CrossEntropyLoss::new()
            .label_smoothing(1.5)
            .forward(&x, &idx)
            .unwrap_err();
        assert!(err.to_string().contains("label_smoothing"), "{err}");
        assert_eq!(ce.describe(), "CrossEntropyLoss()");
        assert_eq!(MSELoss::new().describe(), "MSELoss()");
        assert_eq!(BCEWithLogitsLoss::new().describe(), "BCEWithLogitsLoss()");
    }

    #[test]
    fn mse_target_size_pitfall_warns_and_broadcasts() {
        warnings::take();
        let x = t(&[1.0, 2.0, 3.0], &[3, 1]);
        let y = t(&[1.0, 2.0, 3.0], &[3]);
        let mse = MSELoss::new();
        let mut vals = vec![];
        for _ in 0..3 {
            vals.push(mse.forward(&x, &y).unwrap().item().unwrap()); // one call site
        }
        // PyTorch: the (3,1) - (3,) difference broadcasts to (3,3): 12/9, not 0
        assert!((vals[0] - 12.0 / 9.0).abs() < 1e-6, "{vals:?}");
        let w = warnings::take();
        assert_eq!(w.len(), 1, "once per call site: {w:?}");
        assert!(
            w[0].contains("Using a target size ([3]) that is different to the input size ([3,1])"),
            "{w:?}"
        );
        assert!(w[0].contains("incorrect results due to broadcasting"));
        let none = F::mse_loss(&x, &y, Reduction::None).unwrap();
        assert_eq!(none.dims(), &[3, 3]);
        F::l1_loss(&x, &y, Reduction::Mean).unwrap();
        F::mse_loss(&x, &y, Reduction::Sum).unwrap();
        HuberLoss::new().forward(&x, &y).unwrap();
        SmoothL1Loss::new().forward(&x, &y).unwrap();
        assert_eq!(warnings::take().len(), 5);
        // same shapes: no warning
        MSELoss::new().forward(&x, &x).unwrap();
        assert!(warnings::take().is_empty());
    }

    #[test]
    fn non_broadcastable_targets_and_bce_shape_mismatch_are_errors() {
        let x = Tensor::zeros(&[4, 3], DType::F32);
        let y = Tensor::zeros(&[4], DType::F32);
        let e = MSELoss::new().forward(&x, &y).unwrap_err().to_string();
        assert!(
            e.contains("mse_loss") && e.contains("[4,3]") && e.contains("[4]"),
            "{e}"
        );
        let e = L1Loss::new().forward(&x, &y).unwrap_err().to_string();
        assert!(e.contains("l1_loss"), "{e}");
        let e = BCEWithLogitsLoss::new()
            .forward(&x, &Tensor::zeros(&[4, 1], DType::F32))
            .unwrap_err();
        assert!(e.to_string().contains("same shape"), "{e}");
    }

    #[test]
    fn gradients_flow_through_the_modules() {
        let x = t(&[1.0, 2.0, 3.0, 4.0], &[4]).requires_grad_(true);
        let y = t(&[0.0, 2.0, 1.0, 4.0], &[4]);
        MSELoss::new().forward(&x, &y).unwrap().backward().unwrap();
        // d/dx mean((x - y)^2) = 2 (x - y) / n
        close(&x.grad().unwrap(), &t(&[0.5, 0.0, 1.0, 0.0], &[4]));
    }
}
