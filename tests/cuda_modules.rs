//! Modules on a CUDA device: `ModuleExt::to_device` moves an MLP and the
//! small CNN of the benchmarks, and on the device they must compute what
//! they compute on the CPU — eval and train forward, one training step
//! (SGD with momentum, AdamW) with its gradients left on the device, and
//! `compile(&model)` against eager on the device.
//!
//! Without a GPU the device is the emulator (the generated CUDA C compiled
//! by `c++` against the shim header); with `KILN_CUDA=driver`
//! (scripts/gpu-check.sh on the GPU machine) it is the real device.

use kiln::bench::{randn, train::small_cnn};
use kiln::nn::{Activation, Entry, Linear, Module, ModuleExt, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, SgdConfig, SGD};
use kiln::random::{randint, Generator};
use kiln::{functional as F, ClassLossOpts, DType, Device, Tensor};
use std::io::Write;

/// Both sides run the same kernels except where the device's pointwise code
/// rounds differently from the CPU's; that stays far below this.
const TOL: f64 = 1e-5;

/// The device under test, or None (with a note) where the emulator has no `c++`.
fn device() -> Option<Device> {
    if std::env::var("KILN_CUDA").as_deref() != Ok("driver") {
        if std::process::Command::new("c++")
            .arg("--version")
            .output()
            .is_err()
        {
            let _ = writeln!(std::io::stderr(), "cuda_modules: no c++ compiler, skipped");
            return None;
        }
        kiln::cuda::use_emulator();
    }
    Some(Device::cuda(0).unwrap_or_else(|e| panic!("{e}")))
}

/// Linear(64,32)-ReLU-Linear(32,10), as in tests/nn_modules.rs.
fn mlp() -> kiln::Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(64, 32, true)?)
        .add(Activation::relu())
        .add(Linear::new(32, 10, true)?))
}

/// Asserts `got` (any device) matches `want` elementwise within [`TOL`]
/// (absolute below 1, relative above).
fn close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let worst = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0f64, f64::max);
    assert!(worst <= TOL, "{what}: differs by {worst:e} (> {TOL:e})");
}

/// What a model is checked with: its input, labels and optimizer.
struct Case {
    name: &'static str,
    build: fn() -> kiln::Result<Sequential>,
    x: Tensor,
    y: Tensor,
    opt: fn(&Sequential) -> Box<dyn Optimizer>,
}

fn cases() -> Vec<Case> {
    let labels = |n, seed| randint(0, 10, &[n], Some(&mut Generator::new(seed))).unwrap();
    vec![
        Case {
            name: "mlp",
            build: mlp,
            x: randn(&[16, 64], 1),
            y: labels(16, 2),
            opt: |m| {
                let cfg = AdamConfig {
                    lr: 1e-2,
                    weight_decay: 0.01,
                    ..AdamConfig::default()
                };
                Box::new(AdamW::with_params(m.parameters(), cfg).unwrap())
            },
        },
        Case {
            name: "cnn",
            build: small_cnn,
            x: randn(&[8, 1, 8, 8], 3),
            y: labels(8, 4),
            opt: |m| {
                let cfg = SgdConfig {
                    lr: 0.1,
                    momentum: 0.9,
                    ..SgdConfig::default()
                };
                Box::new(SGD::with_params(m.parameters(), cfg).unwrap())
            },
        },
    ]
}

/// The case's model with the weights of `init`, moved to `dev`. (Loading a
/// state dict, not re-seeding: the tests of this file run in parallel and
/// share the global generator.)
fn model_on(c: &Case, init: &[(String, Tensor)], dev: Device) -> Sequential {
    let mut m = (c.build)().unwrap();
    m.load_state_dict(init, true).unwrap();
    m.to_device(dev)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    m
}

/// The initial weights (and buffers) of a case, on the CPU.
fn init(c: &Case) -> Vec<(String, Tensor)> {
    (c.build)().unwrap().state_dict()
}

/// What one model does on one device: eval and train outputs, the loss, the
/// gradients, and the state (parameters and buffers) after two optimizer steps.
struct Run {
    eval: Tensor,
    train: Tensor,
    loss: Tensor,
    grads: Vec<(String, Tensor)>,
    state: Vec<(String, Tensor)>,
}

fn run(c: &Case, init: &[(String, Tensor)], dev: Device) -> Run {
    let m = model_on(c, init, dev);
    let (x, y) = (c.x.to_device(dev).unwrap(), c.y.to_device(dev).unwrap());
    m.eval();
    let eval = {
        let _ng = kiln::autograd::no_grad();
        m.forward(&x).unwrap()
    };
    m.train();
    let mut opt = (c.opt)(&m);
    let mut train = None;
    let (mut loss, mut grads) = (None, vec![]);
    // two steps, so the second uses the optimizer state the first made on the device
    for _ in 0..2 {
        opt.zero_grad();
        let out = m.forward(&x).unwrap();
        let l = F::cross_entropy(&out, &y, None, ClassLossOpts::default()).unwrap();
        l.backward().unwrap();
        if train.is_none() {
            train = Some(out);
            loss = Some(l);
            grads = m
                .named_parameters()
                .into_iter()
                .map(|(k, p)| {
                    (
                        k.clone(),
                        p.grad().unwrap_or_else(|| panic!("{k}: no grad")),
                    )
                })
                .collect();
        }
        opt.step().unwrap();
    }
    Run {
        eval,
        train: train.unwrap(),
        loss: loss.unwrap(),
        grads,
        state: m.state_dict(),
    }
}

#[test]
fn to_device_moves_every_tensor_and_keeps_leaves() {
    let Some(dev) = device() else { return };
    for c in cases() {
        let init = init(&c);
        let m = model_on(&c, &init, dev);
        for (k, p) in m.named_parameters() {
            assert_eq!(p.device(), dev, "{} {k}", c.name);
            assert!(
                p.is_leaf() && p.requires_grad(),
                "{} {k}: a trainable leaf",
                c.name
            );
        }
        for (k, b) in m.named_buffers() {
            assert_eq!(b.device(), dev, "{} {k}", c.name);
            assert!(!b.requires_grad(), "{} {k}", c.name);
        }
        // the same values, and the CPU tensors left as they were
        for ((k, a), (_, b)) in m.state_dict().iter().zip(&init) {
            assert_eq!(b.device(), Device::Cpu, "{} {k}", c.name);
            close(&format!("{} {k}", c.name), a, b);
        }
    }
}

/// A user module that reports its weight to `visit` but not to `visit_mut`.
struct Opaque {
    w: Tensor,
}

impl Module for Opaque {
    fn forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        x.mul(&self.w)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Param("w", &self.w))
    }
    fn describe(&self) -> String {
        "Opaque()".into()
    }
}

#[test]
fn to_device_moves_grads_and_names_what_it_cannot_reach() {
    let Some(dev) = device() else { return };
    let mut l = Linear::new(3, 2, true).unwrap();
    l.weight.set_grad(Some(Tensor::ones(&[2, 3], DType::F32)));
    l.to_device(dev).unwrap();
    let g = l.weight.grad().expect("the grad moves with its parameter");
    assert_eq!(g.device(), dev);
    assert_eq!(g.to_f64_vec(), vec![1.0; 6]);
    assert!(l.bias.as_ref().unwrap().grad().is_none());

    let mut m = Sequential::new().add(Opaque {
        w: Tensor::ones(&[2], DType::F32).requires_grad_(true),
    });
    let e = m.to_device(dev).unwrap_err().to_string();
    assert!(
        e.contains("0.w (on cpu) stayed behind when moving to cuda:0")
            && e.contains("Module::visit_mut"),
        "{e}"
    );
}

#[test]
fn modules_on_the_device_match_the_cpu() {
    let Some(dev) = device() else { return };
    for c in cases() {
        let init = init(&c);
        // the CPU run's kernels, compiled for the emulator in one batch
        let (want, kernels) = kiln::runtime::record_kernels(|| run(&c, &init, Device::Cpu));
        kiln::cuda::gpu(0).unwrap().prepare(&kernels).unwrap();
        let got = run(&c, &init, dev);
        let n = c.name;
        for (what, g, w) in [
            ("eval forward", &got.eval, &want.eval),
            ("train forward", &got.train, &want.train),
            ("loss", &got.loss, &want.loss),
        ] {
            assert_eq!(g.device(), dev, "{n} {what}");
            close(&format!("{n} {what}"), g, w);
        }
        for ((k, g), (_, w)) in got.grads.iter().zip(&want.grads) {
            assert_eq!(g.device(), dev, "{n} grad of {k} lives on the device");
            close(&format!("{n} grad of {k}"), g, w);
        }
        for ((k, g), (_, w)) in got.state.iter().zip(&want.state) {
            assert_eq!(g.device(), dev, "{n} {k} after the steps");
            close(&format!("{n} {k} after two steps"), g, w);
        }
        let _ = writeln!(
            std::io::stderr(),
            "cuda modules {n}: forward, grads and {} state tensors after two steps match the CPU",
            want.state.len()
        );
    }
}

#[test]
fn compiled_modules_on_the_device_match_eager() {
    let Some(dev) = device() else { return };
    for c in cases() {
        let m = model_on(&c, &init(&c), dev);
        m.eval();
        let x = c.x.to_device(dev).unwrap();
        let _ng = kiln::autograd::no_grad();
        let eager = m.forward(&x).unwrap();
        let fast = kiln::compile::compile(&m);
        let got = fast.forward(&x).unwrap();
        let report = fast.explain();
        if let Some(b) = report.entries.first().and_then(|e| e.graph_break.clone()) {
            panic!("{}: did not compile on {dev}: {b}", c.name);
        }
        assert_eq!(got.device(), dev, "{}: compiled output", c.name);
        close(&format!("{} compiled vs eager", c.name), &got, &eager);
        // a second call runs the cached executable
        close(
            &format!("{} compiled (cached) vs eager", c.name),
            &fast.forward(&x).unwrap(),
            &eager,
        );
    }
}

/// `f()` and the names of the kernels it launched on this thread (the
/// profiler is global: other tests launch kernels on their threads).
fn launched<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    use kiln::profiler::{self, Category};
    let (r, p) = profiler::profile(f);
    let names = p
        .events()
        .iter()
        .filter(|e| e.category == Category::Kernel && e.tid == profiler::current_thread_id())
        .map(|e| e.name.to_string())
        .collect();
    (r, names)
}

/// A compiled Conv + BatchNorm (eval, so folded into the conv) + ReLU on the
/// device is ONE kernel launch: the conv template with the ReLU fused in.
#[test]
fn compiled_conv_bn_relu_is_one_launch_on_the_device() {
    use kiln::nn::{BatchNorm, Conv, ConvOptions};
    let Some(dev) = device() else { return };
    let build = || -> kiln::Result<Sequential> {
        let p = ConvOptions {
            padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
            ..ConvOptions::default()
        };
        Ok(Sequential::new()
            .add(Conv::conv2d(3, 8, 3, p)?)
            .add(BatchNorm::new_2d(8))
            .add(Activation::relu()))
    };
    // BatchNorm with statistics and an affine part that are not the identity
    let mut init = build().unwrap().state_dict();
    for (i, (name, t)) in init.iter_mut().enumerate() {
        let r = randn(t.dims(), 20 + i as u64);
        *t = match name.rsplit('.').next() {
            Some("running_var") => r
                .abs()
                .unwrap()
                .binary_scalar(kiln::ir::BinaryOp::Add, 0.5, false)
                .unwrap(),
            Some("num_batches_tracked") => continue,
            _ => r,
        };
    }
    let mut cpu = build().unwrap();
    cpu.load_state_dict(&init, true).unwrap();
    cpu.eval();
    let x = randn(&[2, 3, 9, 9], 30);
    let _ng = kiln::autograd::no_grad();
    let want = cpu.forward(&x).unwrap();
    cpu.to_device(dev).unwrap();
    let fast = kiln::compile::compile(&cpu);
    let xd = x.to_device(dev).unwrap();
    close(
        "conv+bn+relu compiled on the device",
        &fast.forward(&xd).unwrap(),
        &want,
    );
    // the folded weights are hoisted by the first call; a warm call launches the conv only
    let (got, kernels) = launched(|| fast.forward(&xd).unwrap());
    close("conv+bn+relu compiled (warm)", &got, &want);
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert!(kernels[0].starts_with("conv2d+"), "{kernels:?}");
    // the CUDA C of that launch: the conv template with the ReLU in its store
    let t = kiln::cuda::templates_compiled()
        .into_iter()
        .find(|t| t.name == kernels[0])
        .expect("the launched template was compiled");
    insta::assert_snapshot!("conv_bn_relu_cuda", t.source);
}

/// A compiled MLP on the device launches one GEMM per Linear, each with its
/// bias (and the ReLU after the first) applied before the store.
#[test]
fn compiled_linear_relu_is_one_launch_per_layer_on_the_device() {
    let Some(dev) = device() else { return };
    let mut m = mlp().unwrap();
    m.eval();
    let x = randn(&[16, 64], 40);
    let _ng = kiln::autograd::no_grad();
    let want = m.forward(&x).unwrap();
    m.to_device(dev).unwrap();
    let fast = kiln::compile::compile(&m);
    let xd = x.to_device(dev).unwrap();
    close(
        "mlp compiled on the device",
        &fast.forward(&xd).unwrap(),
        &want,
    );
    let (got, kernels) = launched(|| fast.forward(&xd).unwrap());
    close("mlp compiled (warm)", &got, &want);
    assert_eq!(kernels.len(), 2, "{kernels:?}");
    assert!(
        kernels.iter().all(|k| k.starts_with("matmul_f32+")),
        "{kernels:?}"
    );
    assert!(kernels[0].contains("relu"), "{kernels:?}");
}
