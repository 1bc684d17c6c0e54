//! torchvision's box ops: `box_iou` as tensor ops (traceable, any boxes),
//! and `nms` / `batched_nms`, whose number of kept boxes depends on the
//! values: they read the boxes back and run the greedy suppression on the
//! host, so a trace stops there with the data-dependent graph break, as
//! `torch.compile` does for them.

use crate::compile::trace;
use crate::ops::nonzero::DATA_DEPENDENT;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

fn check_boxes(op: &str, b: &Tensor) -> Result<()> {
    if b.rank() != 2 || b.dims()[1] != 4 {
        bail!(
            op,
            "boxes must be (N, 4) in (x1, y1, x2, y2), got {}",
            fmt_dims(b.dims())
        );
    }
    Ok(())
}

/// `(x2 - x1) (y2 - y1)` of `(N, 4)` boxes.
fn area(b: &Tensor) -> Result<Tensor> {
    let w = b.select(1, 2)?.sub(&b.select(1, 0)?)?;
    let h = b.select(1, 3)?.sub(&b.select(1, 1)?)?;
    w.mul(&h)
}

/// `torchvision.ops.box_iou(boxes1, boxes2)`: the `(N, M)` intersection over
/// union of (x1, y1, x2, y2) boxes.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![0.0f32, 0.0, 2.0, 2.0], &[1, 4]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32, 0.0, 3.0, 2.0], &[1, 4]).unwrap();
/// let iou = F::box_iou(&a, &b).unwrap().to_f64_vec()[0];
/// assert!((iou - 1.0 / 3.0).abs() < 1e-6);
/// ```
pub fn box_iou(boxes1: &Tensor, boxes2: &Tensor) -> Result<Tensor> {
    check_boxes("box_iou", boxes1)?;
    check_boxes("box_iou", boxes2)?;
    let (a1, a2) = (area(boxes1)?, area(boxes2)?);
    let b1 = boxes1.unsqueeze(1)?;
    let b2 = boxes2.unsqueeze(0)?;
    let lt = b1.narrow(2, 0, 2)?.maximum(&b2.narrow(2, 0, 2)?)?;
    let rb = b1.narrow(2, 2, 2)?.minimum(&b2.narrow(2, 2, 2)?)?;
    let wh = rb.sub(&lt)?.clamp_min(0.0)?;
    let inter = wh.select(2, 0)?.mul(&wh.select(2, 1)?)?;
    let union = a1.unsqueeze(1)?.add(&a2.unsqueeze(0)?)?.sub(&inter)?;
    inter.div(&union)
}

/// The IoU of two (x1, y1, x2, y2) boxes.
fn iou(a: &[f64], b: &[f64]) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |x: &[f64]| (x[2] - x[0]) * (x[3] - x[1]);
    inter / (area(a) + area(b) - inter)
}

/// The greedy suppression: indices by decreasing score, each dropped when
/// its IoU with a kept box of the same class exceeds `threshold`.
fn greedy(boxes: &[f64], scores: &[f64], classes: Option<&[i64]>, threshold: f64) -> Vec<i64> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&i, &j| scores[j].total_cmp(&scores[i]));
    let mut kept: Vec<usize> = vec![];
    for &i in &order {
        let bi = &boxes[4 * i..4 * i + 4];
        let suppressed = kept.iter().any(|&k| {
            classes.is_none_or(|c| c[k] == c[i]) && iou(&boxes[4 * k..4 * k + 4], bi) > threshold
        });
        if !suppressed {
            kept.push(i);
        }
    }
    kept.into_iter().map(|i| i as i64).collect()
}

fn nms_impl(
    op: &str,
    boxes: &Tensor,
    scores: &Tensor,
    classes: Option<&Tensor>,
    threshold: f64,
) -> Result<Tensor> {
    check_boxes(op, boxes)?;
    let n = boxes.dims()[0];
    if scores.dims() != [n] || classes.is_some_and(|c| c.dims() != [n]) {
        bail!(
            op,
            "expected scores (and idxs) of shape [{n}] for boxes {}, got {}",
            fmt_dims(boxes.dims()),
            fmt_dims(scores.dims())
        );
    }
    trace::unsupported(op, DATA_DEPENDENT)?;
    let b = boxes.to_f64_vec();
    let s = scores.to_f64_vec();
    let c: Option<Vec<i64>> = classes.map(|c| c.to_f64_vec().iter().map(|&v| v as i64).collect());
    let keep = greedy(&b, &s, c.as_deref(), threshold);
    let k = keep.len();
    Tensor::from_vec(keep, &[k])?.to_device(boxes.device())
}

/// `torchvision.ops.nms(boxes, scores, iou_threshold)`: the kept indices
/// (i64), by decreasing score.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let b = Tensor::from_vec(vec![0.0f32, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], &[2, 4]).unwrap();
/// let s = Tensor::from_vec(vec![0.5f32, 0.9], &[2]).unwrap();
/// assert_eq!(F::nms(&b, &s, 0.5).unwrap().to_vec::<i64>().unwrap(), vec![1]);
/// ```
pub fn nms(boxes: &Tensor, scores: &Tensor, iou_threshold: f64) -> Result<Tensor> {
    nms_impl("nms", boxes, scores, None, iou_threshold)
}

/// `torchvision.ops.batched_nms(boxes, scores, idxs, iou_threshold)`: NMS
/// within each class `idxs`, the kept indices by decreasing score.
pub fn batched_nms(
    boxes: &Tensor,
    scores: &Tensor,
    idxs: &Tensor,
    iou_threshold: f64,
) -> Result<Tensor> {
    nms_impl("batched_nms", boxes, scores, Some(idxs), iou_threshold)
}
