//! ONNX import against the backend test data shipped in the `onnx` wheel
//! (copied into tests/fixtures/onnx by scripts/onnx-fixtures.py): every
//! model of the `simple`, `pytorch-converted` and `pytorch-operator` folders
//! runs eagerly and through `compile()` on each of its test data sets. A case
//! passes when every output matches the reference (|a-b| <= 1e-5 + 1e-3|b|);
//! the only allowed failure is a named unsupported op, attribute or dtype.
//! A mismatch, or any other error, fails the test.

use kiln::onnx::proto::{
    attribute_type, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto,
};
use kiln::Tensor;
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

fn read_pb(p: &Path) -> Tensor {
    let b = std::fs::read(p).unwrap();
    kiln::onnx::tensor::from_proto(&TensorProto::decode(b.as_slice()).unwrap()).unwrap()
}

fn numbered(dir: &Path, prefix: &str) -> Vec<Tensor> {
    let mut out = vec![];
    while dir.join(format!("{prefix}_{}.pb", out.len())).exists() {
        out.push(read_pb(&dir.join(format!("{prefix}_{}.pb", out.len()))));
    }
    out
}

/// None when `got` matches `want`, else what differs.
fn mismatch(got: &[Tensor], want: &[Tensor]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} outputs, {} expected", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if g.dims() != w.dims() {
            return Some(format!(
                "output {k}: shape {:?}, expected {:?}",
                g.dims(),
                w.dims()
            ));
        }
        if g.dtype() != w.dtype() {
            return Some(format!(
                "output {k}: dtype {}, expected {}",
                g.dtype(),
                w.dtype()
            ));
        }
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            let ok =
                a == &b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 + 1e-3 * b.abs();
            if !ok {
                return Some(format!("output {k} element {i}: {a}, expected {b}"));
            }
        }
    }
    None
}

/// A named refusal (op, attribute, dtype): the one allowed failure.
fn is_unsupported(e: &str) -> bool {
    e.contains("not supported")
}

#[derive(Default)]
struct Tally {
    pass: usize,
    total: usize,
    unsupported: BTreeMap<String, Vec<String>>,
    broken: Vec<String>,
}

/// The op (or op and attribute) an unsupported error names.
fn reason(e: &str) -> String {
    let what = e.rsplit(": ").next().unwrap_or(e);
    // `node `n` (Conv, opset 6): ...` names the op; other refusals (a dtype, an opset) say what
    match e
        .find(", opset ")
        .and_then(|k| e[..k].rfind('(').map(|s| &e[s + 1..k]))
    {
        Some(op) => format!("{op}: {what}"),
        None => what.to_string(),
    }
}

fn run_suite(suite: &str, compiled: bool) -> Tally {
    let mut t = Tally::default();
    let dir = fixtures().join(suite);
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        t.total += 1;
        let model = match kiln::onnx::load(case.join("model.onnx")) {
            Ok(m) => m,
            Err(e) if is_unsupported(&e.to_string()) => {
                t.unsupported
                    .entry(reason(&e.to_string()))
                    .or_default()
                    .push(name);
                continue;
            }
            Err(e) => {
                t.broken.push(format!("{name}: load: {e}"));
                continue;
            }
        };
        let mut sets: Vec<PathBuf> = std::fs::read_dir(&case)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        sets.sort();
        let fast = kiln::compile::compile_fn("onnx", |xs| model.forward(xs));
        let mut outcome = Ok(());
        for set in &sets {
            let (ins, want) = (numbered(set, "input"), numbered(set, "output"));
            let _ng = kiln::autograd::no_grad();
            let got = if compiled {
                fast.call(&ins)
            } else {
                model.forward(&ins)
            };
            outcome = match got {
                Ok(g) => match mismatch(&g, &want) {
                    None => Ok(()),
                    Some(m) => Err((
                        false,
                        format!(
                            "{name}/{}: MISMATCH {m}",
                            set.file_name().unwrap().to_string_lossy()
                        ),
                    )),
                },
                Err(e) if is_unsupported(&e.to_string()) => Err((true, e.to_string())),
                Err(e) => Err((false, format!("{name}: run: {e}"))),
            };
            if outcome.is_err() {
                break;
            }
        }
        match outcome {
            Ok(()) => t.pass += 1,
            Err((true, e)) => t.unsupported.entry(reason(&e)).or_default().push(name),
            Err((false, e)) => t.broken.push(e),
        }
    }
    t
}

/// Runs a suite eagerly and compiled; `floor` is the pass count reached when
/// the suite was added, so a regression fails.
fn check_suite(suite: &str, floor: usize) {
    for compiled in [false, true] {
        let t = run_suite(suite, compiled);
        let mode = if compiled { "compiled" } else { "eager" };
        println!("onnx {suite}: {}/{} ({mode})", t.pass, t.total);
        for (why, cases) in &t.unsupported {
            println!("  unsupported {why}: {}", cases.join(", "));
        }
        assert!(
            t.broken.is_empty(),
            "onnx {suite} ({mode}): failures that are not a named unsupported op:\n{}",
            t.broken.join("\n")
        );
        assert_eq!(
            t.pass + t.unsupported.values().map(|v| v.len()).sum::<usize>(),
            t.total
        );
        assert!(
            t.pass >= floor,
            "onnx {suite} ({mode}): {} passes, fewer than the {floor} it had",
            t.pass
        );
    }
}

#[test]
fn onnx_simple() {
    check_suite("simple", 15);
}

#[test]
fn onnx_pytorch_converted() {
    check_suite("pytorch-converted", 80);
}

#[test]
fn onnx_pytorch_operator() {
    check_suite("pytorch-operator", 34);
}

fn one_node_model(op: &str, attribute: Vec<AttributeProto>, opset: i64) -> Vec<u8> {
    node_model(op, attribute, opset, &["x"], 1)
}

/// A model of one node reading `inputs`, every value of ONNX dtype `elem_type` and shape [3].
fn node_model(
    op: &str,
    attribute: Vec<AttributeProto>,
    opset: i64,
    inputs: &[&str],
    elem_type: i32,
) -> Vec<u8> {
    use kiln::onnx::proto::{
        tensor_shape_proto, type_proto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let vi = |name: &str| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type,
                shape: Some(TensorShapeProto {
                    dim: vec![tensor_shape_proto::Dimension {
                        value: Some(tensor_shape_proto::dimension::Value::DimValue(3)),
                        denotation: String::new(),
                    }],
                }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: vec!["y".into()],
                name: "the_node".into(),
                op_type: op.into(),
                attribute,
                ..Default::default()
            }],
            input: inputs.iter().map(|s| vi(s)).collect(),
            output: vec![vi("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn unsupported_op_and_attribute_name_node_op_and_opset() {
    let e = kiln::onnx::from_bytes(&one_node_model("NonMaxSuppression", vec![], 14))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("node `the_node` (NonMaxSuppression, opset 14): op is not supported"),
        "{e}"
    );
    let odd = AttributeProto {
        name: "frobnicate".into(),
        r#type: attribute_type::INT,
        i: 2,
        ..Default::default()
    };
    let m = kiln::onnx::from_bytes(&one_node_model("Relu", vec![odd], 14)).unwrap();
    let e = m
        .forward(&[Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], &[3]).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node `the_node` (Relu, opset 14): attribute `frobnicate` is not supported"),
        "{e}"
    );
    let short = m
        .forward(&[Tensor::zeros(&[2], kiln::DType::F32)])
        .unwrap_err()
        .to_string();
    assert!(short.contains("input `x`: dim 0 must be 3"), "{short}");
    let junk = kiln::onnx::from_bytes(b"\xff\xff\xff")
        .err()
        .unwrap()
        .to_string();
    assert!(junk.contains("not an ONNX model"), "{junk}");
}

/// `Mod` (the node suite has it only at opset 28): with `fmod=0` the
/// remainder takes the divisor's sign (`x - y*floor(x/y)`), with `fmod=1`
/// the dividend's (`x - y*trunc(x/y)`), for integers and floats.
#[test]
fn mod_signs_follow_fmod() {
    let (a, b) = ([-7.0f64, 7.0, -7.5], [3.0f64, -3.0, -2.0]);
    for (elem_type, dtype) in [(7, kiln::DType::I64), (1, kiln::DType::F32)] {
        for fmod in [0, 1] {
            let attr = AttributeProto {
                name: "fmod".into(),
                r#type: attribute_type::INT,
                i: fmod,
                ..Default::default()
            };
            let m = node_model("Mod", vec![attr], 13, &["x", "y"], elem_type);
            let m = kiln::onnx::from_bytes(&m).unwrap();
            let ints = |v: &[f64]| {
                v.iter()
                    .map(|x| {
                        if dtype == kiln::DType::I64 {
                            x.trunc()
                        } else {
                            *x
                        }
                    })
                    .collect::<Vec<_>>()
            };
            let (x, y) = (ints(&a), ints(&b));
            let t = |v: &[f64]| {
                Tensor::from_vec(v.to_vec(), &[3])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let got = m.forward(&[t(&x), t(&y)]).unwrap()[0].to_f64_vec();
            let want: Vec<f64> = x
                .iter()
                .zip(&y)
                .map(|(x, y)| {
                    x - y * if fmod == 0 {
                        (x / y).floor()
                    } else {
                        (x / y).trunc()
                    }
                })
                .collect();
            assert_eq!(got, want, "Mod fmod={fmod} on {dtype}");
        }
    }
}

/// The ONNX node test cases for the ops kiln supports (scripts/onnx-node-fixtures.py).
#[test]
fn onnx_node() {
    check_suite("node", 763);
}
