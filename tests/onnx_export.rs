//! ONNX export of the digits CNN and MLP with a dynamic batch: each file
//! passes `onnx.checker` and onnxruntime agrees with kiln's eager output to
//! 1e-5 at two batch sizes (tests/onnx_check.py, run with the Python of
//! `$KILN_ONNX_PYTHON` or `.venv-onnx/`, which `.ci/run` installs; skipped
//! with a message when neither has onnx and onnxruntime). Without Python,
//! the exported file is imported back into kiln and checked against eager.

mod onnx_support;
use kiln::export::DynamicDim;
use kiln::nn::{Module, ModuleExt, Sequential};
use kiln::onnx::proto::ModelProto;
use kiln::train::ModelKind;
use kiln::Tensor;
use onnx_support::{dir, onnx_check, write_pb};
use prost::Message;

fn model(kind: ModelKind) -> Sequential {
    kiln::manual_seed(5);
    let m = kind.build().unwrap();
    let _ng = kiln::autograd::no_grad();
    for (name, t) in m.named_buffers() {
        if name.ends_with("running_mean") {
            t.copy_(&(&kiln::random::randn(t.dims(), None) * 0.1))
                .unwrap();
        } else if name.ends_with("running_var") {
            t.copy_(&(&kiln::random::rand(t.dims(), None) + 0.5))
                .unwrap();
        }
    }
    m.eval();
    m
}

fn input(kind: ModelKind, batch: usize) -> Tensor {
    match kind {
        ModelKind::Cnn => kiln::random::randn(&[batch, 1, 8, 8], None),
        ModelKind::Mlp => kiln::random::randn(&[batch, 64], None),
    }
}

fn check(kind: ModelKind) {
    let m = model(kind);
    let d = dir("onnx-export");
    let path = d.join(format!("{}.onnx", kind.name()));
    kiln::onnx::export_dynamic(
        &m,
        &[input(kind, 2)],
        &[DynamicDim::new(0, 0, "batch")],
        &path,
        17,
    )
    .unwrap();
    let proto = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    let g = proto.graph.as_ref().unwrap();
    let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
    println!("onnx export {}: {}", kind.name(), ops.join(" "));
    // composites stay whole; weights are raw-data initializers
    match kind {
        ModelKind::Cnn => assert_eq!(
            ops,
            [
                "Conv",
                "BatchNormalization",
                "Relu",
                "Conv",
                "BatchNormalization",
                "Relu",
                "GlobalAveragePool",
                "Reshape",
                "Gemm"
            ]
        ),
        ModelKind::Mlp => assert_eq!(ops, ["Reshape", "Gemm", "Relu", "Gemm"]),
    }
    assert!(g
        .initializer
        .iter()
        .all(|t| !t.raw_data.is_empty() || t.dims.contains(&0)));
    // imported back into kiln: the same ops, so the same numbers
    let back = kiln::onnx::load(&path).unwrap();
    let _ng = kiln::autograd::no_grad();
    let mut pairs = vec![];
    for batch in [3, 5] {
        let x = input(kind, batch);
        let want = m.forward(&x).unwrap();
        let got = back.forward(std::slice::from_ref(&x)).unwrap();
        assert_eq!(
            got[0].to_vec::<f32>().unwrap(),
            want.to_vec::<f32>().unwrap(),
            "onnx round trip at batch {batch}"
        );
        let (xp, yp) = (
            d.join(format!("{}_x{batch}.pb", kind.name())),
            d.join(format!("{}_y{batch}.pb", kind.name())),
        );
        write_pb(&xp, &x);
        write_pb(&yp, &want);
        pairs.push(format!("{}:{}", xp.display(), yp.display()));
    }
    let Some((passed, text)) = onnx_check(&path, &pairs) else {
        println!("onnx export {}: SKIPPED onnx.checker/onnxruntime (no Python with onnx and onnxruntime: set KILN_ONNX_PYTHON or run .ci/run, which installs .venv-onnx)", kind.name());
        return;
    };
    assert!(
        passed,
        "onnx.checker/onnxruntime rejected {}: {text}",
        path.display()
    );
}

#[test]
fn cnn_exports_checks_and_runs_in_onnxruntime() {
    check(ModelKind::Cnn);
}

#[test]
fn mlp_exports_checks_and_runs_in_onnxruntime() {
    check(ModelKind::Mlp);
}

#[test]
fn unsupported_kiln_op_is_named() {
    let f = |xs: &[Tensor]| Ok(vec![xs[0].var(&[1], 1.0, false)?]);
    let e = kiln::export::export_fn(
        "f",
        f,
        &[],
        &[Tensor::zeros(&[2, 3], kiln::DType::F32)],
        &[],
    )
    .unwrap();
    let err = kiln::onnx::from_exported(&e, dir("onnx-export").join("var.onnx"), 17)
        .unwrap_err()
        .to_string();
    assert!(err.contains("kiln op `var` has no ONNX export"), "{err}");
}
