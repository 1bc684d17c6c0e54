//! One test per verifier failure: each breaks a valid graph in one way.

use super::super::{Constant, Graph, Node, NodeId, NodeOp};
use crate::op::pool::Pool2dParams;
use crate::op::{Meta, Op};
use crate::{DType, Float, UnaryOp};
use smallvec::smallvec;

fn f32m(d: &[usize]) -> Meta {
    Meta::new(DType::F32, d)
}

/// `graph g(%0 x: f32[2,3]) { %1 = relu(%0); return %1 }`
fn valid() -> Graph {
    let mut g = Graph::new("g");
    let x = g.input("x", f32m(&[2, 3]));
    let r = g.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.output(r).unwrap();
    g.verify().unwrap();
    g
}

fn relu(operands: &[u32], meta: Meta) -> Node {
    Node {
        op: NodeOp::Op(Op::Unary(UnaryOp::Relu)),
        operands: operands.iter().map(|&i| NodeId(i)).collect(),
        metas: smallvec![meta],
    }
}

fn fails(g: &Graph, msg: &str) {
    assert_eq!(
        g.verify().unwrap_err().to_string(),
        format!("verify: graph g: {msg}")
    );
}

#[test]
fn operand_defined_after_use() {
    let mut g = valid();
    g.push_unchecked(relu(&[3], f32m(&[2, 3])));
    g.push_unchecked(relu(&[1], f32m(&[2, 3])));
    fails(&g, "%2: relu: operand 0 (%3) is not defined before use");
    let mut g = valid();
    g.push_unchecked(relu(&[2], f32m(&[2, 3])));
    fails(&g, "%2: relu: operand 0 (%2) is not defined before use");
    let mut g = valid();
    g.push_unchecked(relu(&[9], f32m(&[2, 3])));
    fails(&g, "%2: relu: operand 0 (%?9) is not defined before use");
}

#[test]
fn operand_count() {
    let mut g = valid();
    g.push_unchecked(relu(&[0, 1], f32m(&[2, 3])));
    fails(&g, "%2: relu: expected 1 operand, got 2");
    let mut g = valid();
    g.push_unchecked(Node {
        op: NodeOp::Const(Constant::scalar(1.0, DType::F32)),
        operands: smallvec![NodeId(0)],
        metas: smallvec![f32m(&[])],
    });
    fails(&g, "%2: constant: takes no operands, has 1");
}

#[test]
fn stored_meta_differs_from_inference() {
    let mut g = valid();
    g.push_unchecked(relu(&[1], f32m(&[3, 2])));
    fails(
        &g,
        "%2: relu: stored type f32[3,2] but inference gives f32[2,3]",
    );
    let mut g = valid();
    g.push_unchecked(relu(&[1], Meta::new(DType::F64, &[2, 3])));
    fails(
        &g,
        "%2: relu: stored type f64[2,3] but inference gives f32[2,3]",
    );
    let mut g = valid();
    g.nodes[1].op = NodeOp::Op(Op::Softmax { dim: 3 });
    fails(
        &g,
        "%1: softmax: dim 3 out of range for a tensor of rank 2 (expected -2..=1)",
    );
}

#[test]
fn outputs_exist_and_are_single_values() {
    let mut g = valid();
    g.set_outputs_unchecked(vec![NodeId(1), NodeId(7)]);
    fails(&g, "output NodeId(7) is not a node (2 nodes)");
    let mut g = valid();
    g.set_outputs_unchecked(vec![]);
    fails(&g, "no outputs");
    let mut g = valid();
    let t = g.op(Op::MaxPool2d(Pool2dParams::new([1, 1])), &[NodeId(0)]);
    assert!(t.is_err(), "max_pool2d needs a 3-D or 4-D input");
    let x4 = g.input("x4", f32m(&[1, 1, 2, 2]));
    let t = g
        .op(Op::MaxPool2d(Pool2dParams::new([2, 2])), &[x4])
        .unwrap();
    g.set_outputs_unchecked(vec![t]);
    fails(
        &g,
        "output %3 (max_pool2d) has several values: pick one with getitem",
    );
}

#[test]
fn tuples_only_through_getitem() {
    let mut g = Graph::new("g");
    let x = g.input("x", f32m(&[1, 1, 2, 2]));
    let t = g
        .op(Op::MaxPool2d(Pool2dParams::new([2, 2])), &[x])
        .unwrap();
    assert!(g.op(Op::Unary(UnaryOp::Relu), &[t]).is_err());
    let v = g.project(t, 0).unwrap();
    g.output(v).unwrap();
    g.verify().unwrap();
    let mut bad = g.clone();
    bad.push_unchecked(relu(&[1], f32m(&[1, 1, 1, 1])));
    fails(
        &bad,
        "%3: relu: operand 0 (%1) has several values: pick one with getitem",
    );
    let mut bad = g.clone();
    bad.nodes[2].op = NodeOp::Project(2);
    fails(
        &bad,
        "%2: getitem: index 2 out of range for max_pool2d with 2 values",
    );
    let mut bad = g.clone();
    bad.push_unchecked(Node {
        op: NodeOp::Project(0),
        operands: smallvec![NodeId(0)],
        metas: smallvec![f32m(&[1, 1, 2, 2])],
    });
    fails(&bad, "%3: getitem: operand 0 (%0) is not a tuple");
}

#[test]
fn inputs_are_input_nodes_listed_once() {
    let mut g = valid();
    g.inputs.push(NodeId(1));
    fails(&g, "input %1: relu is not an input node");
    let mut g = valid();
    g.inputs.push(NodeId(0));
    fails(&g, "input %0 is listed twice");
    let mut g = valid();
    g.inputs.clear();
    fails(&g, "%0: input: input node missing from the graph's inputs");
    let mut g = valid();
    g.inputs.push(NodeId(5));
    fails(&g, "input NodeId(5) is not a node (2 nodes)");
}

#[test]
fn constants_fit_their_type() {
    let mut g = valid();
    let c = Constant {
        meta: Meta::new(DType::I64, &[2]),
        values: vec![Float(1.5)],
    };
    g.push_unchecked(Node {
        op: NodeOp::Const(c),
        operands: smallvec![],
        metas: smallvec![Meta::new(DType::I64, &[2])],
    });
    fails(&g, "%2: constant: value 1.5 does not fit a i64[2] tensor");
    let mut g = valid();
    g.push_unchecked(Node {
        op: NodeOp::Const(Constant::scalar(1.0, DType::F32)),
        operands: smallvec![],
        metas: smallvec![f32m(&[1])],
    });
    fails(
        &g,
        "%2: constant: stored type f32[1] but inference gives f32[]",
    );
}
