//! Builder, rewrite and parser-error tests (round trips and snapshots live in
//! `ir/tests/graph_*.rs`).

use super::*;
use crate::{BinaryOp, DType, UnaryOp};

fn f32m(d: &[usize]) -> Meta {
    Meta::new(DType::F32, d)
}

fn err(text: &str) -> String {
    Graph::parse(text).unwrap_err().to_string()
}

#[test]
fn builder_infers_and_checks() {
    let mut g = Graph::new("g");
    let a = g.input("a", f32m(&[32, 1]));
    let b = g.input("b", Meta::new(DType::I64, &[3]));
    let s = g.op(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    assert_eq!(g.meta(s).unwrap(), &f32m(&[32, 3]));
    let e = g.op(Op::Binary(BinaryOp::Add), &[a, a, a]).unwrap_err();
    assert_eq!(e.to_string(), "add: expected 2 operands, got 3");
    let e = g.op(Op::Unary(UnaryOp::Relu), &[]).unwrap_err();
    assert_eq!(e.to_string(), "relu: expected 1 operand, got 0");
    let e = g.op(Op::Linear, &[a]).unwrap_err();
    assert_eq!(e.to_string(), "linear: expected 2 to 3 operands, got 1");
    let x = g.input("x", f32m(&[2, 4]));
    let e = g.op(Op::Binary(BinaryOp::Add), &[x, b]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "add: shapes [2,4] and [3] cannot broadcast at dim 1 (4 vs 3)"
    );
    assert!(g.op(Op::Unary(UnaryOp::Relu), &[NodeId(99)]).is_err());
    assert_eq!(g.use_counts(), vec![1, 1, 0, 0]);
}

#[test]
fn rewrite_replaces_nodes() {
    // relu(relu(x)) -> relu(x): the outer relu stands for its operand
    let g = Graph::parse(
        "graph g(%0 x: f32[4]) {\n  %1 = relu(%0) : f32[4]\n  %2 = relu(%1) : f32[4]\n  return %2\n}\n",
    )
    .unwrap();
    let is_relu = |n: &Node| matches!(n.op, NodeOp::Op(Op::Unary(UnaryOp::Relu)));
    let out = g
        .rewrite(|new, n, ops| {
            let twice = is_relu(n) && is_relu(new.node(ops[0]));
            Ok(twice.then(|| ops[0]))
        })
        .unwrap();
    assert_eq!(
        out.to_text(),
        "graph g(%0 x: f32[4]) {\n  %1 = relu(%0) : f32[4]\n  return %1\n}\n"
    );
}

#[test]
fn parse_errors_name_line_and_column() {
    let head = "graph g(%0: f32[2,3]) {\n";
    assert_eq!(
        err(&format!(
            "{head}  %1 = relux(%0) : f32[2,3]\n  return %1\n}}"
        )),
        "parse: line 2, column 8: unknown op 'relux'"
    );
    assert_eq!(
        err(&format!(
            "{head}  %1 = relu(%0) : f32[2,4]\n  return %1\n}}"
        )),
        "parse: line 2, column 19: %1 (relu) is declared f32[2,4] but inference gives f32[2,3]"
    );
    assert_eq!(
        err(&format!(
            "{head}  %1 = relu(%7) : f32[2,3]\n  return %1\n}}"
        )),
        "parse: line 2, column 13: %7 is not defined"
    );
    assert_eq!(
        err(&format!(
            "{head}  %0 = relu(%0) : f32[2,3]\n  return %0\n}}"
        )),
        "parse: line 2, column 3: %0 is defined twice"
    );
    assert_eq!(
        err(&format!(
            "{head}  %1 = softmax(%0) {{dim=1, dims=2}} : f32[2,3]\n  return %1\n}}"
        )),
        "parse: line 2, column 28: softmax: unknown attribute 'dims'"
    );
    assert_eq!(
        err(&format!(
            "{head}  %1 = softmax(%0) : f32[2,3]\n  return %1\n}}"
        )),
        "parse: line 2, column 8: softmax: missing attribute 'dim'"
    );
    assert_eq!(
        err(&format!(
            "{head}  %1 = softmax(%0) {{dim=1.5}} : f32[2,3]\n  return %1\n}}"
        )),
        "parse: line 2, column 21: softmax: attribute 'dim' must be an integer, got 1.5"
    );
    assert_eq!(
        err(&format!("{head}  %1 = softmax(%0) {{dim=2}} : f32[2,3]\n  return %1\n}}")),
        "parse: line 2, column 3: %1: softmax: dim 2 out of range for a tensor of rank 2 (expected -2..=1)"
    );
    assert_eq!(
        err(&format!("{head}  %1 = relu(%0) f32[2,3]\n  return %1\n}}")),
        "parse: line 2, column 17: expected ':', found 'f32'"
    );
    assert_eq!(
        err(&format!("{head}  %1 = relu(%0) : f32[2,3]\n  return %1\n")),
        "parse: line 4, column 1: expected '}', found end of input"
    );
    assert_eq!(
        err("graph g(%0: f33[2]) {\n  return %0\n}"),
        "parse: line 1, column 13: dtype: unknown dtype 'f33'"
    );
}

#[test]
fn parse_accepts_any_numbering_and_comments() {
    let g = Graph::parse(
        "graph g(%a: f32[3]) { // c\n %z = neg(%a) : f32[3]\n %b = exp(%z) : f32[3]\n return %b, %a }",
    )
    .unwrap();
    assert_eq!(g.len(), 3);
    assert_eq!(g.outputs(), &[NodeId(2), NodeId(0)]);
}

#[test]
fn numbering_puts_inputs_first() {
    // an input added after an op still prints first: ids are renumbered
    let mut g = Graph::new("late");
    let a = g.input("a", f32m(&[2]));
    let n = g.op(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
    let b = g.input("b", f32m(&[2]));
    let s = g.op(Op::Binary(BinaryOp::Add), &[n, b]).unwrap();
    g.output(s).unwrap();
    let t = g.to_text();
    assert_eq!(
        t,
        "graph late(%0 a: f32[2], %1 b: f32[2]) {\n  %2 = neg(%0) : f32[2]\n  %3 = add(%2, %1) : f32[2]\n  return %3\n}\n"
    );
    assert_eq!(Graph::parse(&t).unwrap().to_text(), t);
}

#[test]
fn parse_op_reads_name_and_attributes() {
    let p = parse_op("permute", "{dims=[1,-1]}").unwrap();
    assert_eq!(p, Op::Permute(vec![1, -1]));
    assert_eq!(parse_op("relu", "").unwrap(), Op::Unary(UnaryOp::Relu));
    assert_eq!(
        parse_op("permute", "").unwrap_err().to_string(),
        "parse: line 1, column 1: permute: missing attribute 'dims'"
    );
    assert!(parse_op("relux", "").is_err());
    assert!(parse_op("relu", "{x=1} 2").is_err());
}
