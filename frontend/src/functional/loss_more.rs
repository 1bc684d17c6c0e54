//! The losses of `kiln_passes::decompose_loss_more` (KL divergence, Poisson
//! NLL, the margin and embedding losses) as `torch.nn.functional` calls.
//! They have no graph node of their own: eagerly they run fused (or
//! through autograd when a gradient is needed), and `compile` traces their
//! primitives.

use super::{ins, op_scope};
use crate::amp::{self, Policy};
use crate::compile::trace;
use crate::ops::composite::decomposed;
use crate::Tensor;
use kiln_ir::Result;
use kiln_passes::decompose_loss::Reduction;
use kiln_passes::decompose_loss_more::{self as loss, KlReduction};

pub use kiln_passes::decompose_loss_more::TripletOpts;

/// Runs a decomposition: while tracing as recorded primitives (the
/// recording `TensorBuilder`), else as [`decomposed!`] does.
macro_rules! loss_ops {
    ($inputs:expr, |$b:ident, $cv:ident| $body:expr) => {{
        if trace::is_recording() {
            let $b = &mut crate::autograd::rules::builder::TensorBuilder;
            let $cv = |t: &Tensor| t.clone();
            $body
        } else {
            decomposed!($inputs, |$b, $cv| $body)
        }
    }};
}

/// `F.kl_div(input, target, reduction, log_target)`: `input` holds
/// log-probabilities; `reduction` is PyTorch's string (`"batchmean"` is the
/// true KL divergence per sample; `"mean"` divides by every element).
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let logp = Tensor::from_vec(vec![0.5f32.ln(), 0.5f32.ln()], &[1, 2]).unwrap();
/// let t = Tensor::from_vec(vec![0.5f32, 0.5], &[1, 2]).unwrap();
/// let kl = F::kl_div(&logp, &t, "batchmean", false).unwrap();
/// assert!(kl.item().unwrap().abs() < 1e-6);
/// ```
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: &str,
    log_target: bool,
) -> Result<Tensor> {
    let r = KlReduction::parse(reduction)?;
    let _p = op_scope("kl_div", &[input, target]);
    let c = amp::cast_for(Policy::F32, (input, target))?;
    let (x, t) = c.as_ref().map_or((input, target), |(x, t)| (x, t));
    loss_ops!(&[x, t], |b, cv| loss::kl_div(
        b,
        &cv(x),
        &cv(t),
        r,
        log_target
    ))
}

/// `F.poisson_nll_loss(input, target, log_input, full, eps, reduction)`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.0f32], &[1]).unwrap();
/// let t = Tensor::from_vec(vec![2.0f32], &[1]).unwrap();
/// // exp(0) - 2 * 0
/// let l = F::poisson_nll_loss(&x, &t, true, false, 1e-8, Reduction::Mean).unwrap();
/// assert_eq!(l.item().unwrap(), 1.0);
/// ```
pub fn poisson_nll_loss(
    input: &Tensor,
    target: &Tensor,
    log_input: bool,
    full: bool,
    eps: f64,
    r: Reduction,
) -> Result<Tensor> {
    let _p = op_scope("poisson_nll_loss", &[input, target]);
    let c = amp::cast_for(Policy::F32, (input, target))?;
    let (x, t) = c.as_ref().map_or((input, target), |(x, t)| (x, t));
    loss_ops!(&[x, t], |b, cv| loss::poisson_nll_loss(
        b,
        &cv(x),
        &cv(t),
        log_input,
        full,
        eps,
        r
    ))
}

/// `F.margin_ranking_loss(input1, input2, target, margin, reduction)`:
/// `max(0, -y (x1 - x2) + margin)`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 0.0], &[2]).unwrap();
/// let b = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
/// let y = Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap();
/// let l = F::margin_ranking_loss(&a, &b, &y, 0.0, Reduction::None).unwrap();
/// assert_eq!(l.to_f64_vec(), vec![0.0, 1.0]);
/// ```
pub fn margin_ranking_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    r: Reduction,
) -> Result<Tensor> {
    let _p = op_scope("margin_ranking_loss", &[x1, x2, y]);
    loss_ops!(&[x1, x2, y], |b, cv| loss::margin_ranking_loss(
        b,
        &cv(x1),
        &cv(x2),
        &cv(y),
        margin,
        r
    ))
}

/// `F.hinge_embedding_loss(input, target, margin, reduction)` for targets ±1.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.3f32, 0.3], &[2]).unwrap();
/// let y = Tensor::from_vec(vec![1.0f32, -1.0], &[2]).unwrap();
/// let l = F::hinge_embedding_loss(&x, &y, 1.0, Reduction::None).unwrap();
/// let v = l.to_f64_vec();
/// assert!((v[0] - 0.3).abs() < 1e-6 && (v[1] - 0.7).abs() < 1e-6);
/// ```
pub fn hinge_embedding_loss(x: &Tensor, y: &Tensor, margin: f64, r: Reduction) -> Result<Tensor> {
    let _p = op_scope("hinge_embedding_loss", &[x, y]);
    loss_ops!(&[x, y], |b, cv| loss::hinge_embedding_loss(
        b,
        &cv(x),
        &cv(y),
        margin,
        r
    ))
}

/// `F.soft_margin_loss(input, target, reduction)`: `log(1 + exp(-y x))`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.0f32], &[1]).unwrap();
/// let y = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// let l = F::soft_margin_loss(&x, &y, Reduction::Mean).unwrap();
/// assert!((l.item().unwrap() - 2f64.ln()).abs() < 1e-6);
/// ```
pub fn soft_margin_loss(x: &Tensor, y: &Tensor, r: Reduction) -> Result<Tensor> {
    let _p = op_scope("soft_margin_loss", &[x, y]);
    loss_ops!(&[x, y], |b, cv| loss::soft_margin_loss(
        b,
        &cv(x),
        &cv(y),
        r
    ))
}

/// `F.multilabel_soft_margin_loss(input, target, weight, reduction)`: per
/// sample the class mean of the binary cross-entropy with logits.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 2]).unwrap();
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2]).unwrap();
/// let l = F::multilabel_soft_margin_loss(&x, &y, None, Reduction::Mean).unwrap();
/// assert!((l.item().unwrap() - 2f64.ln()).abs() < 1e-6);
/// ```
pub fn multilabel_soft_margin_loss(
    x: &Tensor,
    y: &Tensor,
    weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    let _p = op_scope("multilabel_soft_margin_loss", &[x, y]);
    let inputs = ins(&[Some(x), Some(y), weight]);
    loss_ops!(&inputs, |b, cv| {
        let w = weight.map(cv);
        loss::multilabel_soft_margin_loss(b, &cv(x), &cv(y), w.as_ref(), r)
    })
}

/// `F.cosine_embedding_loss(input1, input2, target, margin, reduction)`:
/// `1 - cos` for y = 1, `max(0, cos - margin)` for y = -1.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2]).unwrap();
/// let y = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// let l = F::cosine_embedding_loss(&a, &a, &y, 0.0, Reduction::Mean).unwrap();
/// assert!(l.item().unwrap().abs() < 1e-6);
/// ```
pub fn cosine_embedding_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    r: Reduction,
) -> Result<Tensor> {
    let _p = op_scope("cosine_embedding_loss", &[x1, x2, y]);
    loss_ops!(&[x1, x2, y], |b, cv| loss::cosine_embedding_loss(
        b,
        &cv(x1),
        &cv(x2),
        &cv(y),
        margin,
        r
    ))
}

/// `F.pairwise_distance(x1, x2, p, eps, keepdim)`: the p-norm of
/// `x1 - x2 + eps` over the last dim.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![3.0f32, 0.0], &[1, 2]).unwrap();
/// let b = Tensor::from_vec(vec![0.0f32, 4.0], &[1, 2]).unwrap();
/// let d = F::pairwise_distance(&a, &b, 2.0, 0.0, false).unwrap();
/// assert_eq!(d.to_f64_vec(), vec![5.0]);
/// ```
pub fn pairwise_distance(
    x1: &Tensor,
    x2: &Tensor,
    p: f64,
    eps: f64,
    keepdim: bool,
) -> Result<Tensor> {
    let _p = op_scope("pairwise_distance", &[x1, x2]);
    let d = loss_ops!(&[x1, x2], |b, cv| loss::pairwise_distance(
        b,
        &cv(x1),
        &cv(x2),
        p,
        eps
    ))?;
    if keepdim {
        d.unsqueeze(-1)
    } else {
        Ok(d)
    }
}

/// `F.triplet_margin_loss(anchor, positive, negative, ...)`.
///
/// ```
/// use kiln_frontend::functional::{self as F, TripletOpts};
/// use kiln_frontend::Tensor;
/// let a = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 2]).unwrap();
/// let n = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2]).unwrap();
/// // d(a, a) = 0 (plus eps), d(a, n) = 5: no loss at margin 1
/// let l = F::triplet_margin_loss(&a, &a, &n, TripletOpts::default()).unwrap();
/// assert_eq!(l.item().unwrap(), 0.0);
/// ```
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    o: TripletOpts,
) -> Result<Tensor> {
    let _p = op_scope("triplet_margin_loss", &[anchor, positive, negative]);
    loss_ops!(&[anchor, positive, negative], |b, cv| {
        loss::triplet_margin_loss(b, &cv(anchor), &cv(positive), &cv(negative), o)
    })
}
