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

/// Exports `f` of `inputs` (static shapes), then checks the file in
/// onnx.checker and onnxruntime against kiln's eager result for those
/// inputs and for a second draw of them; returns the ONNX op types.
fn check_fn(
    name: &str,
    f: impl Fn(&[Tensor]) -> kiln::Result<Vec<Tensor>>,
    weights: &[(String, Tensor)],
    draws: [Vec<Tensor>; 2],
) -> Vec<String> {
    let d = dir("onnx-export");
    let path = d.join(format!("{name}.onnx"));
    kiln::onnx::export_fn(name, &f, weights, &draws[0], &[], &path, 17).unwrap();
    let proto = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    let ops: Vec<String> = proto
        .graph
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.clone())
        .collect();
    println!("onnx export {name}: {}", ops.join(" "));
    let _ng = kiln::autograd::no_grad();
    let mut pairs = vec![];
    for (i, xs) in draws.iter().enumerate() {
        let want = f(xs).unwrap();
        let mut ins = vec![];
        for (j, x) in xs.iter().enumerate() {
            let p = d.join(format!("{name}_x{i}_{j}.pb"));
            write_pb(&p, x);
            ins.push(p.display().to_string());
        }
        let yp = d.join(format!("{name}_y{i}.pb"));
        write_pb(&yp, &want[0]);
        pairs.push(format!("{}:{}", ins.join(","), yp.display()));
    }
    let Some((passed, text)) = onnx_check(&path, &pairs) else {
        println!("onnx export {name}: SKIPPED onnx.checker/onnxruntime (no Python with onnx and onnxruntime: set KILN_ONNX_PYTHON or run .ci/run, which installs .venv-onnx)");
        return ops;
    };
    assert!(
        passed,
        "onnx.checker/onnxruntime rejected {}: {text}",
        path.display()
    );
    ops
}

fn randn(dims: &[usize]) -> Tensor {
    kiln::random::randn(dims, None)
}

#[test]
fn sdpa_exports_as_matmul_softmax_matmul() {
    use kiln::functional::{self as F, SdpaOpts};
    kiln::manual_seed(21);
    let causal = SdpaOpts {
        is_causal: true,
        ..Default::default()
    };
    let f = move |xs: &[Tensor]| {
        Ok(vec![F::scaled_dot_product_attention(
            &xs[0], &xs[1], &xs[2], None, causal,
        )?])
    };
    let draw = || {
        vec![
            randn(&[2, 4, 10, 8]),
            randn(&[2, 4, 12, 8]),
            randn(&[2, 4, 12, 6]),
        ]
    };
    let ops = check_fn("sdpa_causal", f, &[], [draw(), draw()]);
    for op in ["MatMul", "Mul", "Where", "Softmax"] {
        assert!(ops.iter().any(|o| o == op), "{op} in {ops:?}");
    }
    // a bool mask (row 0 hidden: zeros, as kiln gives) with GQA, 4 query heads on 2
    let gqa = SdpaOpts {
        enable_gqa: true,
        scale: Some(0.3),
        ..Default::default()
    };
    let f = move |xs: &[Tensor]| {
        Ok(vec![F::scaled_dot_product_attention(
            &xs[0],
            &xs[1],
            &xs[2],
            Some(&xs[3]),
            gqa,
        )?])
    };
    let bool_mask = || {
        let m: Vec<bool> = (0..6 * 9).map(|i| i >= 9 && (i * 7) % 3 != 0).collect();
        Tensor::from_vec(m, &[6, 9]).unwrap()
    };
    let draw = || {
        vec![
            randn(&[2, 4, 6, 8]),
            randn(&[2, 2, 9, 8]),
            randn(&[2, 2, 9, 8]),
            bool_mask(),
        ]
    };
    let ops = check_fn("sdpa_bool_mask_gqa", f, &[], [draw(), draw()]);
    assert!(
        ops.iter().any(|o| o == "Expand"),
        "GQA repeats heads: {ops:?}"
    );
    // a float mask added to the scores
    let plain = SdpaOpts::default();
    let f = move |xs: &[Tensor]| {
        Ok(vec![F::scaled_dot_product_attention(
            &xs[0],
            &xs[1],
            &xs[2],
            Some(&xs[3]),
            plain,
        )?])
    };
    let draw = || {
        vec![
            randn(&[2, 3, 5, 4]),
            randn(&[2, 3, 7, 4]),
            randn(&[2, 3, 7, 4]),
            randn(&[2, 1, 5, 7]),
        ]
    };
    let ops = check_fn("sdpa_float_mask", f, &[], [draw(), draw()]);
    assert!(ops.iter().any(|o| o == "Add"), "{ops:?}");
}

#[test]
fn attention_modules_export_and_run_in_onnxruntime() {
    use kiln::nn::{
        MultiheadAttention, MultiheadAttentionOptions, TransformerEncoderLayer,
        TransformerLayerOptions,
    };
    kiln::manual_seed(22);
    let o = MultiheadAttentionOptions {
        batch_first: true,
        ..Default::default()
    };
    let mha = MultiheadAttention::with(16, 4, o).unwrap();
    mha.eval();
    let f = |xs: &[Tensor]| Ok(vec![mha.forward(&xs[0])?]);
    check_fn(
        "multihead_attention",
        f,
        &mha.named_parameters(),
        [vec![randn(&[2, 7, 16])], vec![randn(&[2, 7, 16])]],
    );
    let o = TransformerLayerOptions {
        dim_feedforward: 32,
        dropout: 0.0,
        batch_first: true,
        ..Default::default()
    };
    let layer = TransformerEncoderLayer::new(16, 4, o).unwrap();
    layer.eval();
    let f = |xs: &[Tensor]| Ok(vec![layer.forward(&xs[0])?]);
    let ops = check_fn(
        "transformer_encoder_layer",
        f,
        &layer.named_parameters(),
        [vec![randn(&[2, 5, 16])], vec![randn(&[2, 5, 16])]],
    );
    assert!(ops.iter().any(|o| o == "Softmax"), "{ops:?}");
}
