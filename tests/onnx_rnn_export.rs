//! LSTM and GRU exported as the ONNX `LSTM`/`GRU` ops with a dynamic batch
//! and sequence length: the real/lstm classifier (fixture weights) and
//! standalone layers (2 layers, bidirectional, batch-first or not, with and
//! without initial states and biases). Each file must hold one LSTM/GRU node
//! per layer and no unrolled step (no Sigmoid, Tanh, MatMul or Gemm of the
//! gate math), declare both dims as `dim_param`s, import back into kiln and
//! agree with kiln's eager outputs at 1e-5, and pass `onnx.checker` and
//! onnxruntime at 1e-5 on every output (tests/onnx_check.py; skipped with a
//! message when no Python has onnx and onnxruntime), at two batch sizes and
//! two sequence lengths other than the example's.
//!
//! Prints `onnx rnn NAME: OPS, kiln import ok` per model.

#[allow(dead_code)]
mod real_models;

mod onnx_support;
use kiln::export::DynamicDim;
use kiln::models::lstm::{LstmClassifier, LstmClassifierConfig};
use kiln::nn::{Module, ModuleExt, RnnOptions, GRU, LSTM};
use kiln::onnx::proto::{tensor_shape_proto::dimension::Value as D, type_proto, ModelProto};
use kiln::Tensor;
use onnx_support::{dir, onnx_check, write_pb};
use prost::Message;
use std::path::Path;

/// (batch, seq) of the two checked calls; the example is (2, 5).
const CASES: [(usize, usize); 2] = [(3, 4), (5, 9)];

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The op histogram of the file, checked to hold `rnn_nodes` nodes of
/// `rnn_op` and nothing of an unrolled step.
fn check_graph(name: &str, path: &Path, rnn_op: &str, rnn_nodes: usize) -> String {
    let proto = ModelProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    let g = proto.graph.as_ref().unwrap();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for n in &g.node {
        *counts.entry(n.op_type.as_str()).or_default() += 1;
    }
    let hist: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    assert_eq!(counts.get(rnn_op), Some(&rnn_nodes), "{name}: {hist:?}");
    for step_op in ["Sigmoid", "Tanh", "MatMul", "Split"] {
        assert!(
            !counts.contains_key(step_op),
            "{name}: unrolled {step_op} in {hist:?}"
        );
    }
    // the first input's batch and sequence dims are dim_params
    let Some(type_proto::Value::TensorType(t)) = g.input[0].r#type.as_ref().unwrap().value.as_ref()
    else {
        panic!("{name}: input type")
    };
    let params: Vec<String> = t
        .shape
        .as_ref()
        .unwrap()
        .dim
        .iter()
        .filter_map(|d| match &d.value {
            Some(D::DimParam(p)) => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(params.len(), 2, "{name}: input dims {:?}", t.shape);
    hist.join(", ")
}

/// Exports `f` traced on `make(2, 5)` with `dynamic`, then checks the file
/// (see the module docs) at [`CASES`].
fn check(
    name: &str,
    f: &dyn Fn(&[Tensor]) -> kiln::Result<Vec<Tensor>>,
    params: &[(String, Tensor)],
    make: &dyn Fn(usize, usize) -> Vec<Tensor>,
    dynamic: &[DynamicDim],
    rnn: (&str, usize),
) {
    let _ng = kiln::autograd::no_grad();
    kiln::manual_seed(3);
    let d = dir("onnx-rnn");
    let path = d.join(format!("{name}.onnx"));
    kiln::onnx::export_fn(name, f, params, &make(2, 5), dynamic, &path, 17).unwrap();
    let ops = check_graph(name, &path, rnn.0, rnn.1);
    let back = kiln::onnx::load(&path).unwrap();
    let mut pairs = vec![];
    for (k, &(b, t)) in CASES.iter().enumerate() {
        let xs = make(b, t);
        let want = f(&xs).unwrap();
        let got = back.forward(&xs).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: outputs");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = max_abs_diff(g, w);
            assert!(
                g.dims() == w.dims() && err <= 1e-5,
                "{name}: output {i} imported into kiln at batch {b} seq {t}: {:?} vs {:?}, off by {err}",
                g.dims(),
                w.dims()
            );
        }
        let file = |what: &str, i: usize, t: &Tensor| {
            let p = d.join(format!("{name}_{what}{k}_{i}.pb"));
            write_pb(&p, t);
            p.display().to_string()
        };
        let ins: Vec<String> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| file("x", i, x))
            .collect();
        let outs: Vec<String> = want
            .iter()
            .enumerate()
            .map(|(i, y)| file("y", i, y))
            .collect();
        pairs.push(format!("{}:{}", ins.join(","), outs.join(",")));
    }
    println!("onnx rnn {name}: {ops}, kiln import ok at (batch, seq) {CASES:?}");
    let Some((passed, text)) = onnx_check(&path, &pairs) else {
        println!("onnx rnn {name}: SKIPPED onnx.checker/onnxruntime (no Python with onnx and onnxruntime: set KILN_ONNX_PYTHON or run .ci/run)");
        return;
    };
    assert!(passed, "{name}: onnx.checker/onnxruntime: {text}");
}

/// (batch, seq) dims of the input and, with states, dim 1 of each state as the batch.
fn dims(batch_first: bool, states: usize) -> Vec<DynamicDim> {
    let (b, t) = if batch_first { (0, 1) } else { (1, 0) };
    let mut v = vec![DynamicDim::new(0, b, "batch"), DynamicDim::new(0, t, "seq")];
    v.extend((1..=states).map(|i| DynamicDim::new(i, 1, "batch")));
    v
}

/// Random inputs (input, then `states` initial states of `[layers*dirs, batch, hidden]`).
fn inputs(
    batch_first: bool,
    feat: usize,
    states: usize,
    sdims: (usize, usize),
) -> impl Fn(usize, usize) -> Vec<Tensor> {
    move |b, t| {
        let x = if batch_first {
            [b, t, feat]
        } else {
            [t, b, feat]
        };
        let mut v = vec![kiln::random::randn(&x, None)];
        v.extend((0..states).map(|_| kiln::random::randn(&[sdims.0, b, sdims.1], None)));
        v
    }
}

#[test]
fn real_lstm_classifier() {
    let m = LstmClassifier::new(&LstmClassifierConfig::default()).unwrap();
    let t = real_models::load_from("real", "lstm");
    m.load_state_dict(&real_models::group(&t, "state"), true)
        .unwrap();
    m.eval();
    let f = |xs: &[Tensor]| Ok(vec![m.forward(&xs[0])?]);
    let mut params = m.named_parameters();
    params.extend(m.named_buffers());
    check(
        "real_lstm",
        &f,
        &params,
        &inputs(true, 16, 0, (0, 0)),
        &dims(true, 0),
        ("LSTM", 2),
    );
}

fn lstm_case(name: &str, opts: RnnOptions, states: bool) {
    let (layers, dirs, bf) = (
        opts.num_layers,
        1 + opts.bidirectional as usize,
        opts.batch_first,
    );
    kiln::manual_seed(1);
    let m = LSTM::new(6, 5, opts).unwrap();
    let n = if states { 2 } else { 0 };
    let f = |xs: &[Tensor]| {
        let args: Vec<Option<&Tensor>> = xs.iter().map(Some).collect();
        m.forward_many(&args)
    };
    let make = inputs(bf, 6, n, (layers * dirs, 5));
    check(
        name,
        &f,
        &m.named_parameters(),
        &make,
        &dims(bf, n),
        ("LSTM", layers),
    );
}

fn gru_case(name: &str, opts: RnnOptions, states: bool) {
    let (layers, dirs, bf) = (
        opts.num_layers,
        1 + opts.bidirectional as usize,
        opts.batch_first,
    );
    kiln::manual_seed(2);
    let m = GRU::new(6, 5, opts).unwrap();
    let n = states as usize;
    let f = |xs: &[Tensor]| {
        let args: Vec<Option<&Tensor>> = xs.iter().map(Some).collect();
        m.forward_many(&args)
    };
    let make = inputs(bf, 6, n, (layers * dirs, 5));
    check(
        name,
        &f,
        &m.named_parameters(),
        &make,
        &dims(bf, n),
        ("GRU", layers),
    );
}

fn opts(layers: usize, bidirectional: bool, batch_first: bool, bias: bool) -> RnnOptions {
    RnnOptions {
        num_layers: layers,
        bidirectional,
        batch_first,
        bias,
        ..RnnOptions::default()
    }
}

#[test]
fn lstm_bidirectional_batch_first_with_states() {
    lstm_case("lstm_bi_bf_states", opts(2, true, true, true), true);
}

#[test]
fn lstm_two_layers_time_major() {
    lstm_case("lstm_tm", opts(2, false, false, true), false);
}

#[test]
fn lstm_bidirectional_time_major_no_bias() {
    lstm_case("lstm_bi_tm_nobias", opts(1, true, false, false), false);
}

#[test]
fn gru_bidirectional_time_major_with_state() {
    gru_case("gru_bi_tm_state", opts(2, true, false, true), true);
}

#[test]
fn gru_batch_first() {
    gru_case("gru_bf", opts(2, false, true, true), false);
}

/// The unrolled `.kiln` export is untouched: an LSTM's `.kiln` graph still
/// holds its steps (the scope is only for ONNX).
#[test]
fn kiln_export_keeps_the_steps() {
    let m = LSTM::new(6, 5, RnnOptions::default()).unwrap();
    let x = kiln::random::randn(&[3, 2, 6], None);
    let e = kiln::export::export(&m, &[x.clone()], &[DynamicDim::new(0, 1, "batch")]).unwrap();
    assert!(e.graph_text().contains("sigmoid"), "{}", e.graph_text());
    let _ng = kiln::autograd::no_grad();
    let x5 = kiln::random::randn(&[3, 5, 6], None);
    let got = e.forward(&[x5.clone()]).unwrap();
    assert_eq!(got[0].to_f64_vec(), m.forward(&x5).unwrap().to_f64_vec());
}
