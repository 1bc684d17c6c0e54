//! Bad input is an `Err` naming the op and the shapes/dtypes involved — never a panic.

use kiln::functional as F;
use kiln::ir::op::conv::ConvParams;
use kiln::{DType, Tensor};

fn zeros(d: &[usize]) -> Tensor {
    Tensor::zeros(d, DType::F32)
}

fn err(r: kiln::Result<impl std::fmt::Debug>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn broadcast_mismatch() {
    let e = err(zeros(&[32, 1]).add(&zeros(&[3, 4])));
    assert_eq!(
        e,
        "add: shapes [32,1] and [3,4] cannot broadcast at dim 0 (32 vs 3)"
    );
}

#[test]
fn matmul_inner_dim_mismatch() {
    let e = err(F::matmul(&zeros(&[2, 3]), &zeros(&[4, 5])));
    assert!(
        e.starts_with("matmul:") && e.contains("[2,3]") && e.contains("[4,5]"),
        "{e}"
    );
}

#[test]
fn conv_channel_and_group_mismatch() {
    let e = err(F::conv2d(
        &zeros(&[2, 3, 8, 8]),
        &zeros(&[4, 2, 3, 3]),
        None,
        &ConvParams::default(),
    ));
    assert!(
        e.starts_with("conv2d:") && e.contains("[2,3,8,8]") && e.contains("[4,2,3,3]"),
        "{e}"
    );
    let p = ConvParams {
        groups: 2,
        ..ConvParams::default()
    };
    let e = err(F::conv2d(
        &zeros(&[2, 4, 8, 8]),
        &zeros(&[3, 2, 3, 3]),
        None,
        &p,
    ));
    assert!(e.starts_with("conv2d:") && e.contains("groups"), "{e}");
}

#[test]
fn view_on_incompatible_strides_suggests_reshape() {
    let e = err(zeros(&[4, 6]).t().unwrap().view(&[-1]));
    assert!(
        e.starts_with("view:") && e.contains("[6,4]") && e.contains("reshape"),
        "{e}"
    );
}

#[test]
fn unsupported_dtype() {
    let i = Tensor::zeros(&[2, 2], DType::I64);
    let e = err(F::matmul(&i, &i));
    assert!(e.starts_with("matmul:") && e.contains("i64"), "{e}");
    let e = err(i.mean(None, false));
    assert!(e.starts_with("mean:") && e.contains("i64"), "{e}");
    let e = err(i.softmax(-1));
    assert!(e.starts_with("softmax:") && e.contains("i64"), "{e}");
    let b = Tensor::zeros(&[2], DType::Bool);
    let e = err(b.neg());
    assert!(e.starts_with("neg:") && e.contains("bool"), "{e}");
}

#[test]
fn dim_and_index_out_of_range() {
    let x = zeros(&[2, 3]);
    let e = err(x.sum(Some(&[2]), false));
    assert!(e.starts_with("sum:") && e.contains("dim 2"), "{e}");
    let e = err(x.select(1, 3));
    assert!(
        e.starts_with("select:") && e.contains("index 3") && e.contains("[2,3]"),
        "{e}"
    );
    let idx = Tensor::from_vec(vec![0i64, 5], &[2]).unwrap();
    let e = err(x.index_select(0, &idx));
    assert!(
        e.starts_with("index_select:") && e.contains("index 5"),
        "{e}"
    );
    let w = zeros(&[10, 4]);
    let e = err(F::embedding(
        &Tensor::from_vec(vec![3i64, 10], &[2]).unwrap(),
        &w,
        None,
    ));
    assert!(e.starts_with("embedding") && e.contains("10"), "{e}");
    let e = err(x.transpose(0, 2));
    assert!(e.starts_with("transpose:") && e.contains("dim 2"), "{e}");
}

#[test]
fn cat_of_mismatched_shapes() {
    let e = err(Tensor::cat(&[&zeros(&[2, 3]), &zeros(&[2, 4])], 0));
    assert_eq!(e, "cat: tensor 1 has shape [2,4] but tensor 0 has shape [2,3]: sizes must match except in dim 0");
}

#[test]
fn operator_overloads_panic_with_the_same_message() {
    let r = std::panic::catch_unwind(|| &zeros(&[2]) + &zeros(&[3]));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(
        msg,
        "add: shapes [2] and [3] cannot broadcast at dim 0 (2 vs 3)"
    );
}

fn ints(v: Vec<i64>, d: &[usize]) -> Tensor {
    Tensor::from_vec(v, d).unwrap()
}

#[test]
fn loss_arguments() {
    use kiln::Reduction::Mean;
    let e = err(F::kl_div(&zeros(&[2, 3]), &zeros(&[2, 3]), "avg", false));
    assert!(e.starts_with("kl_div:") && e.contains("'batchmean'"), "{e}");
    let (x, y) = (zeros(&[2, 3]), ints(vec![0, 1], &[2]));
    let e = err(F::multi_margin_loss(&x, &y, 3, 1.0, None, Mean));
    assert!(
        e.starts_with("multi_margin_loss:") && e.contains("p = 3"),
        "{e}"
    );
    let e = err(F::multi_margin_loss(
        &x,
        &ints(vec![0, 3], &[2]),
        1,
        1.0,
        None,
        Mean,
    ));
    assert!(e.contains("target 3 out of range for 3 classes"), "{e}");
    let e = err(F::multilabel_margin_loss(&x, &ints(vec![0, 1], &[2]), Mean));
    assert!(
        e.starts_with("multilabel_margin_loss:") && e.contains("[2]"),
        "{e}"
    );
    let var = Tensor::full(&[2, 3], -1.0, DType::F32);
    let e = err(F::gaussian_nll_loss(&x, &x, &var, false, 1e-6, Mean));
    assert!(e.contains("var has negative entry"), "{e}");
    let e = err(F::gaussian_nll_loss(
        &x,
        &x,
        &zeros(&[3]),
        false,
        1e-6,
        Mean,
    ));
    assert!(
        e.contains("var is of incorrect size") && e.contains("[3]"),
        "{e}"
    );
    let e = err(F::margin_ranking_loss(&x, &x, &zeros(&[2]), 0.0, Mean));
    assert!(
        e.contains("same dimension") && e.contains("target: [2]"),
        "{e}"
    );
}

#[test]
fn ctc_loss_arguments() {
    use kiln::functional::CtcOpts;
    let lp = zeros(&[4, 2, 3]);
    let (tg, il, tl) = (
        ints(vec![1, 2, 1, 0], &[2, 2]),
        ints(vec![4, 4], &[2]),
        ints(vec![2, 1], &[2]),
    );
    let o = CtcOpts::default();
    let blank = CtcOpts { blank: 3, ..o };
    let e = err(F::ctc_loss(&lp, &tg, &il, &tl, blank));
    assert!(e.starts_with("ctc_loss:") && e.contains("blank 3"), "{e}");
    let e = err(F::ctc_loss(&lp, &tg, &ints(vec![5, 4], &[2]), &tl, o));
    assert!(e.contains("input length 5") && e.contains("[4,2,3]"), "{e}");
    let e = err(F::ctc_loss(&lp, &tg, &il, &ints(vec![3, 1], &[2]), o));
    assert!(
        e.contains("target lengths [3, 1]") && e.contains("[2,2]"),
        "{e}"
    );
    let e = err(F::ctc_loss(&lp, &tg, &il, &ints(vec![2], &[1]), o));
    assert!(e.contains("expected 2 input and target lengths"), "{e}");
}

#[test]
fn optimizer_and_scheduler_arguments() {
    use kiln::optim::lr_scheduler::{ConstantLR, CyclicLR, CyclicOptions, LambdaLR};
    use kiln::optim::{Adamax, AdamaxConfig, Rprop, RpropConfig, SgdConfig, SGD};
    let p = || vec![zeros(&[2]).requires_grad_(true)];
    let bad = AdamaxConfig {
        betas: (1.0, 0.999),
        ..Default::default()
    };
    let e = err(Adamax::with_params(p(), bad).map(|_| ()));
    assert_eq!(e, "Adamax: Invalid beta parameter at index 0: 1");
    let bad = RpropConfig {
        etas: (1.5, 1.2),
        ..Default::default()
    };
    let e = err(Rprop::with_params(p(), bad).map(|_| ()));
    assert!(e.starts_with("Rprop: Invalid eta values"), "{e}");
    let mut opt = SGD::with_params(
        p(),
        SgdConfig {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    let e = err(ConstantLR::new(&mut opt, 2.0, 3).map(|_| ()));
    assert!(
        e.starts_with("ConstantLR:") && e.contains("between 0 and 1"),
        "{e}"
    );
    let two: Vec<kiln::optim::lr_scheduler::LrLambda> =
        vec![std::sync::Arc::new(|_| 1.0), std::sync::Arc::new(|_| 1.0)];
    let e = err(LambdaLR::new(&mut opt, two).map(|_| ()));
    assert_eq!(e, "LambdaLR: Expected 1 lr_lambdas, but got 2");
    let o = CyclicOptions {
        step_size_up: 0.0,
        ..Default::default()
    };
    let e = err(CyclicLR::new(&mut opt, 0.01, 0.1, o).map(|_| ()));
    assert!(
        e.starts_with("CyclicLR:") && e.contains("step_size_up"),
        "{e}"
    );
}
