//! Unit tests of the tape: accumulation, zeroing, no_grad, detach,
//! retain_graph, broadcast-reduced grads, grads through views, version
//! counters, in-place on leaves, anomaly mode.

use super::*;
use kiln_ir::DType;

fn t(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims).unwrap()
}

fn leaf(v: &[f32], dims: &[usize]) -> Tensor {
    t(v, dims).requires_grad_(true)
}

fn grad(x: &Tensor) -> Vec<f64> {
    x.grad().expect("has grad").to_f64_vec()
}

#[test]
fn accumulates_across_backward_calls_and_zeroes() {
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let y = x.mul(&x).unwrap().sum(None, false).unwrap();
    y.backward().unwrap();
    assert_eq!(grad(&x), vec![2.0, 4.0, 6.0]);
    let y = x.mul(&x).unwrap().sum(None, false).unwrap();
    y.backward().unwrap();
    assert_eq!(grad(&x), vec![4.0, 8.0, 12.0]);
    x.set_grad(None);
    assert!(x.grad().is_none());
    let y = x.sum(None, false).unwrap();
    y.backward().unwrap();
    assert_eq!(grad(&x), vec![1.0, 1.0, 1.0]);
}

#[test]
fn no_grad_records_nothing() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = {
        let _g = no_grad();
        x.exp().unwrap().sum(None, false).unwrap()
    };
    assert!(!y.requires_grad() && y.grad_fn().is_none());
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("does not require grad"), "{e}");
    let z = x.exp().unwrap();
    assert!(z.requires_grad() && !z.is_leaf());
    assert_eq!(z.grad_fn().unwrap().name(), "ExpBackward");
}

#[test]
fn detach_cuts_the_graph() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let d = x.mul(&x).unwrap().detach();
    assert!(!d.requires_grad());
    let y = x.mul(&d).unwrap().sum(None, false).unwrap();
    y.backward().unwrap();
    // d is a constant: dy/dx = d = x^2
    assert_eq!(grad(&x), vec![1.0, 4.0]);
}

#[test]
fn second_backward_through_freed_graph_is_an_error() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap().sum(None, false).unwrap();
    y.backward_opts(None, true).unwrap();
    y.backward().unwrap(); // retained once, freed now
    let e = y.backward().unwrap_err().to_string();
    assert!(
        e.contains("second time") && e.contains("retain_graph"),
        "{e}"
    );
    let g: Vec<f64> = grad(&x);
    assert!((g[0] - 2.0 * 1f64.exp()).abs() < 1e-5);
}

#[test]
fn broadcast_grads_are_summed_to_the_input_shape() {
    let a = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = leaf(&[10.0, 20.0, 30.0], &[3]);
    let c = leaf(&[2.0, 3.0], &[2, 1]);
    let y = a.add(&b).unwrap().mul(&c).unwrap();
    y.backward_with(&Tensor::ones(&[2, 3], DType::F32)).unwrap();
    assert_eq!(grad(&a), vec![2.0, 2.0, 2.0, 3.0, 3.0, 3.0]);
    assert_eq!(grad(&b), vec![5.0, 5.0, 5.0]);
    assert_eq!(x_dims(&c), vec![2, 1]);
    assert_eq!(grad(&c), vec![66.0, 75.0]);
}

fn x_dims(x: &Tensor) -> Vec<usize> {
    x.grad().unwrap().dims().to_vec()
}

#[test]
fn grads_flow_through_views() {
    let x = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let v = x.t().unwrap().narrow(0, 1, 2).unwrap(); // [[2,5],[3,6]]
    let w = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    v.mul(&w)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&x), vec![0.0, 1.0, 3.0, 0.0, 2.0, 4.0]);
}

#[test]
fn inplace_on_saved_tensor_names_the_op() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let e = x.exp().unwrap(); // exp saves its output
    let y = e.sum(None, false).unwrap();
    let z = e.mul(&e).unwrap().sum(None, false).unwrap(); // mul saves e
    {
        let _g = no_grad();
        e.copy_(&t(&[0.0, 0.0], &[2])).unwrap();
    }
    let _ = y;
    let err = z.backward().unwrap_err().to_string();
    assert!(err.contains("copy_"), "{err}");
    assert!(err.contains("modified by an inplace operation"), "{err}");
    assert!(err.contains("MulBackward"), "{err}");
}

#[test]
fn inplace_on_a_leaf_that_requires_grad_is_an_error() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let e = x.copy_(&t(&[3.0, 4.0], &[2])).unwrap_err().to_string();
    assert!(e.contains("copy_") && e.contains("leaf"), "{e}");
    {
        let _g = no_grad();
        x.copy_(&t(&[3.0, 4.0], &[2])).unwrap(); // allowed, as an optimizer step
    }
    assert_eq!(x.to_f64_vec(), vec![3.0, 4.0]);
    assert_eq!(x.version(), 1);
}

#[test]
fn anomaly_mode_names_the_op() {
    let x = leaf(&[-1.0, 2.0], &[2]);
    {
        let _a = detect_anomaly();
        let e = x.log().unwrap_err().to_string();
        assert!(e.starts_with("log:") && e.contains("NaN/Inf"), "{e}");
        // backward: sqrt at 0 is finite forward, infinite gradient
        let z = leaf(&[0.0, 4.0], &[2]);
        let s = z.sqrt().unwrap().sum(None, false).unwrap();
        let e = s.backward().unwrap_err().to_string();
        assert!(e.contains("SqrtBackward") && e.contains("NaN/Inf"), "{e}");
    }
    assert!(x.log().is_ok()); // off again
}

#[test]
fn composites_and_multi_root_backward() {
    let x = leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let y = x.softmax(-1).unwrap();
    let g = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
    let v = x.var(&[1], 1.0, false).unwrap();
    backward(&[&y, &v], &[&g, &t(&[1.0, 1.0], &[2])], false).unwrap();
    let gx = grad(&x);
    // softmax part: s(1-s) = 0.19661193 for row 0 col 0; var part: x - mean = -0.5
    assert!((gx[0] - (0.19661193 - 1.0)).abs() < 1e-5, "{gx:?}");
}

#[test]
fn tensors_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<crate::Tensor>();
}

#[test]
fn a_leaf_gradient_nothing_else_holds_becomes_its_grad_uncopied() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let made = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = made.clone();
    let y = record("probe", x.detach(), &[&x], move |g| {
        let gi = g.mul_scalar(3.0)?;
        *seen.lock().unwrap() = Some(gi.storage.id());
        Ok(vec![Some(gi)])
    })
    .unwrap();
    y.sum(None, false).unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![3.0, 3.0]);
    assert_eq!(Some(x.grad().unwrap().storage.id()), *made.lock().unwrap());
    // one gradient reaching two leaves (AddBackward passes it to both) is
    // copied for the first: the two `.grad`s must not alias
    let (a, b) = (leaf(&[1.0], &[1]), leaf(&[2.0], &[1]));
    a.add(&b)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
    assert_ne!(ga.storage.id(), gb.storage.id());
    ga.copy_(&t(&[5.0], &[1])).unwrap();
    assert_eq!(grad(&b), vec![1.0]);
}
