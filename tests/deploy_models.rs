//! Every real and zoo model through both deployment formats, with its
//! fixture weights (tests/fixtures/real, tests/fixtures/zoo) and a dynamic
//! batch:
//!
//! - `.kiln`: export -> save -> load, bit-identical to eager at two batch
//!   sizes other than the example's;
//! - ONNX: the file imports back into kiln and agrees with eager at 1e-5,
//!   passes `onnx.checker` and runs in onnxruntime against kiln's eager
//!   output at 1e-5, at two batch sizes (tests/onnx_check.py, skipped with a
//!   message when no Python has onnx and onnxruntime, as in
//!   tests/onnx_export.rs).
//!
//! Prints `deploy NAME: kiln ok, onnx ok (OPS)` per model.

#[allow(dead_code)]
mod real_models;

mod onnx_support;
use kiln::export::{self, DynamicDim, ExportedModel};
use kiln::models::bert::BertForSequenceClassification;
use kiln::models::catalog;
use kiln::models::efficientnet::{
    efficientnet_b0, efficientnet_conf, EfficientNet, EfficientNetOptions,
};
use kiln::models::gpt2::Gpt2LMHeadModel;
use kiln::models::lstm::{LstmClassifier, LstmClassifierConfig};
use kiln::models::mobilenetv3::{mobilenet_v3_large, mobilenet_v3_small, MobileNetV3Options};
use kiln::models::resnet::{resnet18, resnet34, resnet50};
use kiln::models::unet::{UNet, UNetConfig};
use kiln::models::vit::VisionTransformer;
use kiln::nn::{BatchNormOptions, Module, ModuleExt};
use kiln::onnx::proto::ModelProto;
use kiln::Tensor;
use onnx_support::{dir, onnx_check, write_pb};
use prost::Message;

/// Makes one model input at a batch size (the batch is dim 0 of every input).
type MakeInputs = fn(usize) -> Vec<Tensor>;

fn images(c: usize, hw: usize) -> impl Fn(usize) -> Vec<Tensor> {
    move |b| vec![kiln::random::randn(&[b, c, hw, hw], None)]
}

/// Loads the fixture's `state/*` strictly and puts the model in eval mode.
/// A parameter that is all zeros (torchvision's ViT head starts so) gets
/// random values, or the output would be zeros and the check vacuous.
fn with_fixture<M: Module>(m: M, subdir: &str, fixture: &str) -> M {
    let t = real_models::load_from(subdir, fixture);
    m.load_state_dict(&real_models::group(&t, "state"), true)
        .unwrap();
    kiln::manual_seed(6);
    let _ng = kiln::autograd::no_grad();
    for (_, p) in m.named_parameters() {
        if p.to_f64_vec().iter().all(|v| *v == 0.0) {
            p.copy_(&(&kiln::random::randn(p.dims(), None) * 0.1))
                .unwrap();
        }
    }
    m.eval();
    m
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Both formats for `model` (its first output), traced at batch 2 and
/// checked at batch 3 and 5.
fn deploy<M: Module>(name: &str, model: &M, inputs: &dyn Fn(usize) -> Vec<Tensor>) {
    deploy_at(name, model, inputs, 2, &[3, 5]);
}

/// [`deploy`] traced at batch `example_batch` and checked at `batches`.
fn deploy_at<M: Module>(
    name: &str,
    model: &M,
    inputs: &dyn Fn(usize) -> Vec<Tensor>,
    example_batch: usize,
    batches: &[usize],
) {
    kiln::manual_seed(11);
    let _ng = kiln::autograd::no_grad();
    let example = inputs(example_batch);
    let dynamic: Vec<DynamicDim> = (0..example.len())
        .map(|i| DynamicDim::new(i, 0, "batch"))
        .collect();
    let mut names = model.named_parameters();
    names.extend(model.named_buffers());
    let forward = |xs: &[Tensor]| -> kiln::Result<Vec<Tensor>> {
        let args: Vec<Option<&Tensor>> = xs.iter().map(Some).collect();
        let ys = model.forward_many(&args)?;
        Ok(ys.into_iter().take(1).collect())
    };
    let e = export::export_fn("forward", forward, &names, &example, &dynamic).unwrap();
    let d = dir("deploy-models");
    let path = d.join(format!("{name}.kiln"));
    e.save(&path).unwrap();
    let loaded = export::load(&path).unwrap();
    let cases: Vec<(Vec<Tensor>, Tensor)> = batches
        .iter()
        .map(|&b| {
            let xs = inputs(b);
            let want = forward(&xs).unwrap().remove(0);
            (xs, want)
        })
        .collect();
    for (xs, want) in &cases {
        let got = loaded.forward(xs).unwrap();
        assert_eq!(got[0].dims(), want.dims(), "{name}: .kiln output shape");
        assert_eq!(
            got[0].to_f64_vec(),
            want.to_f64_vec(),
            "{name}: .kiln model != eager at batch {}",
            xs[0].dims()[0]
        );
    }
    let ops = onnx(name, &e, &cases);
    println!(
        "deploy {name}: {} kiln ok at batch {batches:?}, onnx ok ({ops})",
        loaded.signature()
    );
}

/// ONNX export of `e`; the file imported back into kiln, then checked by
/// onnx.checker and onnxruntime. Returns the ONNX op histogram.
fn onnx(name: &str, e: &ExportedModel, cases: &[(Vec<Tensor>, Tensor)]) -> String {
    let d = dir("deploy-models");
    let path = d.join(format!("{name}.onnx"));
    kiln::onnx::from_exported(e, &path, 17).unwrap();
    let proto = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    let g = proto.graph.as_ref().unwrap();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for n in &g.node {
        *counts.entry(n.op_type.as_str()).or_default() += 1;
    }
    let hist: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let back = kiln::onnx::load(&path).unwrap();
    let mut pairs = vec![];
    for (k, (xs, want)) in cases.iter().enumerate() {
        let got = back.forward(xs).unwrap();
        let err = max_abs_diff(&got[0], want);
        assert!(
            got[0].dims() == want.dims() && err <= 1e-5,
            "{name}: onnx file imported into kiln off by {err}"
        );
        let ins: Vec<String> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let p = d.join(format!("{name}_x{k}_{i}.pb"));
                write_pb(&p, x);
                p.display().to_string()
            })
            .collect();
        let yp = d.join(format!("{name}_y{k}.pb"));
        write_pb(&yp, want);
        pairs.push(format!("{}:{}", ins.join(","), yp.display()));
    }
    let Some((passed, text)) = onnx_check(&path, &pairs) else {
        println!("deploy {name}: SKIPPED onnx.checker/onnxruntime (no Python with onnx and onnxruntime: set KILN_ONNX_PYTHON or run .ci/run, which installs .venv-onnx)");
        return hist.join(", ");
    };
    assert!(
        passed,
        "{name}: onnx.checker/onnxruntime rejected {}: {text}",
        path.display()
    );
    hist.join(", ")
}

#[test]
fn lstm_classifier() {
    let m = LstmClassifier::new(&LstmClassifierConfig::default()).unwrap();
    let m = with_fixture(m, "real", "lstm");
    let make: MakeInputs = |b| vec![kiln::random::randn(&[b, 7, 16], None)];
    deploy("lstm", &m, &make);
}

#[test]
fn unet_tiny() {
    let m = with_fixture(
        UNet::new(&UNetConfig::default()).unwrap(),
        "real",
        "unet_tiny",
    );
    deploy("unet_tiny", &m, &images(3, 16));
}

#[test]
fn vit_tiny() {
    let cfg = catalog::vit_tiny_config();
    let m = with_fixture(VisionTransformer::new(&cfg).unwrap(), "real", "vit_tiny");
    deploy("vit_tiny", &m, &images(3, 32));
}

#[test]
fn gpt2_tiny() {
    let cfg = catalog::gpt2_tiny_config();
    let m = with_fixture(Gpt2LMHeadModel::new(&cfg).unwrap(), "real", "gpt2_tiny");
    deploy(
        "gpt2_tiny",
        &m,
        &catalog::build("gpt2_tiny").unwrap().example,
    );
}

#[test]
fn bert_tiny() {
    let cfg = catalog::bert_tiny_config();
    let m = BertForSequenceClassification::new(&cfg).unwrap();
    let m = with_fixture(m, "real", "bert_tiny");
    deploy(
        "bert_tiny",
        &m,
        &catalog::build("bert_tiny").unwrap().example,
    );
}

#[test]
fn mobilenet_v3_small_fixture() {
    let o = MobileNetV3Options {
        width_mult: 0.5,
        num_classes: 10,
        ..MobileNetV3Options::default()
    };
    let m = with_fixture(mobilenet_v3_small(&o).unwrap(), "zoo", "mobilenet_v3_small");
    let x = &real_models::load_from("zoo", "mobilenet_v3_small")["input/x"];
    deploy("mobilenet_v3_small", &m, &images(3, x.dims()[2]));
}

#[test]
fn efficientnet_fixture() {
    let setting = efficientnet_conf(0.5, 0.5);
    let m = EfficientNet::new(&setting, 0.2, 0.2, 10, BatchNormOptions::default(), None).unwrap();
    let m = with_fixture(m, "zoo", "efficientnet");
    let x = &real_models::load_from("zoo", "efficientnet")["input/x"];
    deploy("efficientnet", &m, &images(3, x.dims()[2]));
}

/// A randomly initialised model with non-trivial BatchNorm running stats
/// (there is no torchvision fixture of the full-size ResNets).
fn random_stats<M: Module>(m: M) -> M {
    kiln::manual_seed(4);
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

#[test]
fn resnet18_zoo() {
    kiln::manual_seed(2);
    let m = random_stats(resnet18(10).unwrap());
    deploy("resnet18", &m, &images(3, 32));
}

#[test]
fn resnet50_zoo() {
    kiln::manual_seed(2);
    let m = random_stats(resnet50(10).unwrap());
    deploy("resnet50", &m, &images(3, 32));
}

#[test]
fn mobilenet_v3_large_zoo() {
    kiln::manual_seed(2);
    let o = MobileNetV3Options {
        num_classes: 10,
        ..MobileNetV3Options::default()
    };
    let m = random_stats(mobilenet_v3_large(&o).unwrap());
    deploy("mobilenet_v3_large", &m, &images(3, 32));
}

/// Full-size torchvision resnet34 (1000 classes) at 224x224, traced at
/// batch 1 and checked at batch 1 and 2.
#[test]
fn resnet34_full_size() {
    kiln::manual_seed(2);
    let m = random_stats(resnet34(1000).unwrap());
    deploy_at("resnet34", &m, &images(3, 224), 1, &[1, 2]);
}

/// Full-size torchvision efficientnet_b0 (1000 classes) at 224x224, traced
/// at batch 1 and checked at batch 1 and 2.
#[test]
fn efficientnet_b0_full_size() {
    kiln::manual_seed(2);
    let m = random_stats(efficientnet_b0(&EfficientNetOptions::default()).unwrap());
    deploy_at("efficientnet_b0", &m, &images(3, 224), 1, &[1, 2]);
}
