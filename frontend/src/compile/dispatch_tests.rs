//! Unit tests of `run_op` and of the tracer's safety net (crate-internal
//! kernel paths, which integration tests cannot reach).

use super::run_op;
use crate::compile::trace;
use crate::ops::kernel::KernelCall;
use crate::Tensor;
use kiln_ir::graph::ScalarValue;
use kiln_ir::op::Op;
use kiln_ir::{BinaryOp, DType, Float, UnaryOp};

fn x23() -> Tensor {
    Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5, -0.5, 4.0], &[2, 3]).unwrap()
}

#[test]
fn a_kernel_launched_without_recording_is_refused() {
    let r = trace::trace("f", &[x23()], &[], |a| {
        // an "op" that forgot to record: the kernel path called directly
        let mut k = KernelCall::new();
        let v = k.input(&a[0], DType::F32);
        let y = k.unary(UnaryOp::Exp, v, DType::F32);
        let y = k.finish("exp", y, a[0].dims(), DType::F32)?;
        Ok(vec![y])
    })
    .unwrap();
    let b = r.err().expect("a graph break");
    assert_eq!(b.op, "exp");
    assert!(b.reason.contains("without recording"), "{b}");
    // the same kernel on an untraced tensor is fine (a constant)
    let c = x23();
    let r = trace::trace("f", &[x23()], &[], |a| {
        let mut k = KernelCall::new();
        let v = k.input(&c, DType::F32);
        let y = k.unary(UnaryOp::Exp, v, DType::F32);
        let y = k.finish("exp", y, c.dims(), DType::F32)?;
        Ok(vec![a[0].add(&y)?])
    })
    .unwrap();
    assert!(r.is_ok());
}

#[test]
fn an_unrecorded_view_of_a_traced_value_is_refused() {
    let r = trace::trace("f", &[x23()], &[], |a| {
        // a view made without recording (as a forgetful op would)
        let v = a[0].with_layout(kiln_ir::op::view::permute(a[0].layout(), &[1, 0])?);
        Ok(vec![v.relu()?])
    })
    .unwrap();
    assert_eq!(r.err().expect("a graph break").op, "view");
}

#[test]
fn run_op_runs_every_kind_of_node() {
    let x = x23();
    let mask = x.gt(&Tensor::scalar(0.0f32)).unwrap();
    // masked_fill with a fill tensor (no eager API records it)
    let fill = Tensor::scalar(7i64);
    let y = run_op(
        &Op::MaskedFill { value: None },
        &[x.clone(), mask.clone(), fill],
    )
    .unwrap();
    assert_eq!(y[0].dtype(), DType::F32);
    assert_eq!(y[0].to_f64_vec(), [7.0, -2.0, 7.0, 7.0, -0.5, 7.0]);
    let z = run_op(
        &Op::MaskedFill {
            value: Some(ScalarValue::Float(Float(7.0))),
        },
        &[x.clone(), mask],
    )
    .unwrap();
    assert_eq!(z[0].to_bytes(), y[0].to_bytes());
    // multi-output ops give every result
    let x4 = x.reshape(&[1, 1, 2, 3]).unwrap();
    let p = kiln_ir::op::pool::Pool2dParams {
        kernel: [2, 2],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let r = run_op(&Op::MaxPool2d(p), std::slice::from_ref(&x4)).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[1].dtype(), DType::I64);
    assert_eq!(
        run_op(&Op::AdaptiveMaxPool2d([1, 1]), &[x4]).unwrap().len(),
        2
    );
    // arguments are checked by the op's inference, not by a panic
    assert!(run_op(&Op::Binary(BinaryOp::Add), std::slice::from_ref(&x)).is_err());
    assert!(run_op(&Op::View(vec![4, 2]), std::slice::from_ref(&x)).is_err());
    let s = run_op(
        &Op::BinaryScalar {
            op: BinaryOp::Sub,
            value: ScalarValue::Int(1),
            reversed: true,
        },
        &[x],
    )
    .unwrap();
    assert_eq!(s[0].to_f64_vec(), [0.0, 3.0, -2.0, 0.5, 1.5, -3.0]);
}

#[test]
fn tracing_off_records_nothing_and_costs_a_flag() {
    assert!(!trace::is_tracing());
    assert!(!trace::is_recording());
    let y = x23().relu().unwrap();
    assert!(!trace::is_tracing());
    assert_eq!(y.dims(), &[2, 3]);
}
