//! A quantized model under `compile()`: each quantized Linear is one graph
//! node (`quantized_linear`), one extern kernel that quantizes its input,
//! runs the int8 GEMM, dequantizes and applies the following pointwise ops
//! per output tile. Compiled results are bit-identical to eager ones.

use kiln::compile::{compile, CompileOptions, Compiled, Stage};
use kiln::functional as F;
use kiln::nn::{Activation, Linear, Module, ModuleExt, RnnOptions, Sequential, Training, LSTM};
use kiln::quantization::{quantize_dynamic, QScheme, QuantType, QuantizedLinear};
use kiln::runtime::externs::qgemm;
use kiln::{DType, Result, Tensor};

fn randn(dims: &[usize], seed: u64) -> Tensor {
    kiln::bench::randn(dims, seed)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn no_disk_cache(c: Compiled<'_>) -> Compiled<'_> {
    c.with_options(CompileOptions {
        disk_cache: false,
        ..Default::default()
    })
}

/// Linear-ReLU (fused in the kernel), Linear-GELU (a compiled epilogue),
/// then a plain Linear; wide enough that a batch of 150 rows is 3 tiles.
fn mlp() -> Sequential {
    Sequential::new()
        .add(Linear::new(96, 128, true).unwrap())
        .add(Activation::relu())
        .add(Linear::new(128, 80, true).unwrap())
        .add(Activation::gelu(false))
        .add(Linear::new(80, 10, false).unwrap())
}

#[test]
fn compiled_quantized_mlp_is_bit_identical_and_one_kernel_per_linear() {
    kiln::manual_seed(3);
    let model = mlp();
    model.eval();
    let _ng = kiln::autograd::no_grad();
    for scheme in [QScheme::PerTensor, QScheme::PerChannel] {
        let q = quantize_dynamic(&model, &[QuantType::Linear], scheme).unwrap();
        let c = no_disk_cache(compile(&q));
        for (rows, seed) in [(150, 1), (3, 2), (150, 3)] {
            let x = randn(&[rows, 96], seed);
            let want = q.forward(&x).unwrap();
            let got = c.forward(&x).unwrap();
            assert_eq!(bits(&got), bits(&want), "{scheme:?}, {rows} rows");
        }
        let r = c.explain();
        for e in &r.entries {
            assert!(e.graph_break.is_none(), "{r}");
            let ql = e
                .kernels
                .iter()
                .filter(|k| k.starts_with("quantized_linear"));
            assert_eq!(ql.count(), 3, "one kernel per quantized Linear: {r}");
            assert_eq!(e.kernels.len(), 3, "nothing but the 3 kernels: {r}");
        }
    }
}

#[test]
fn explain_snapshot_of_a_quantized_mlp() {
    kiln::manual_seed(4);
    let model = mlp();
    model.eval();
    let _ng = kiln::autograd::no_grad();
    let q = quantize_dynamic(&model, &[QuantType::Linear], QScheme::PerChannel).unwrap();
    let c = no_disk_cache(compile(&q));
    let x = randn(&[4, 96], 5);
    let mut s = String::new();
    for st in [Stage::Graph, Stage::Fused] {
        s += &format!("== {} ==\n{}", st.name(), c.dump(st, &[x.clone()]).unwrap());
    }
    let r = c.explain();
    let e = &r.entries[0];
    s += &format!(
        "== explain ==\ngraph break: {:?}\nkernels: {:?}\nunfused: {:?}\n",
        e.graph_break, e.kernels, e.unfused
    );
    insta::assert_snapshot!("quantized_mlp_compiled", s);
}

#[derive(Module)]
struct Net {
    fc: Linear,
    head: Linear,
    training: Training,
}

impl Net {
    /// Custom code between the layers: a scale, a residual-free tanh, a shift.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc.forward(x)?.mul_scalar(0.5)?.tanh()?;
        self.head.forward(&h)?.add_scalar(1.0)
    }
}

#[test]
fn compiled_quantized_custom_module_is_bit_identical() {
    kiln::manual_seed(8);
    let net = Net {
        fc: Linear::new(40, 70, true).unwrap(),
        head: Linear::new(70, 6, true).unwrap(),
        training: Training::default(),
    };
    net.eval();
    let _ng = kiln::autograd::no_grad();
    let q = quantize_dynamic(&net, &[QuantType::Linear], QScheme::PerChannel).unwrap();
    let c = compile(&q);
    let x = randn(&[130, 40], 9);
    assert_eq!(bits(&c.forward(&x).unwrap()), bits(&q.forward(&x).unwrap()));
    let r = c.explain();
    let e = &r.entries[0];
    assert!(e.graph_break.is_none(), "{r}");
    let names: Vec<&str> = e.kernels.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "quantized_linear+epilogue[mul_scalar+tanh]",
            "quantized_linear+epilogue[add_scalar]"
        ],
        "{r}"
    );
}

#[test]
fn compiled_quantized_lstm_has_no_graph_break_and_matches_eager() {
    kiln::manual_seed(11);
    let opts = RnnOptions {
        batch_first: true,
        ..RnnOptions::default()
    };
    let lstm = LSTM::new(8, 16, opts).unwrap();
    lstm.eval();
    let _ng = kiln::autograd::no_grad();
    let q = quantize_dynamic(&lstm, &[QuantType::Lstm], QScheme::PerTensor).unwrap();
    let c = compile(&q);
    let x = randn(&[3, 5, 8], 12);
    assert_eq!(bits(&c.forward(&x).unwrap()), bits(&q.forward(&x).unwrap()));
    let r = c.explain();
    assert!(r.entries[0].graph_break.is_none(), "{r}");
    let ql = r.entries[0]
        .kernels
        .iter()
        .filter(|k| k.starts_with("quantized_linear"))
        .count();
    // one input product for the sequence, one hidden product per step
    // after the first (h0 = 0 is a constant: hoisted)
    assert!(ql >= 5, "quantized products: {r}");
}

#[test]
fn requantizing_changed_float_weights_invalidates_the_packed_weight() {
    kiln::manual_seed(13);
    let model = Sequential::new().add(Linear::new(32, 24, true).unwrap());
    model.eval();
    let _ng = kiln::autograd::no_grad();
    let q = quantize_dynamic(&model, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    let c = compile(&q);
    let x = randn(&[5, 32], 14);
    let first = c.forward(&x).unwrap();
    let packs = qgemm::pack_count();
    let again = c.forward(&x).unwrap();
    assert_eq!(bits(&again), bits(&first));
    assert_eq!(
        qgemm::pack_count(),
        packs,
        "an unchanged weight is not repacked"
    );
    // change the float weights, quantize them again and load the result
    // into the live quantized model (its tensors change in place)
    let sd = model.state_dict();
    let changed: Vec<(String, Tensor)> = sd
        .iter()
        .map(|(k, t)| (k.clone(), t.mul_scalar(-2.0).unwrap()))
        .collect();
    model.load_state_dict(&changed, true).unwrap();
    let fresh = quantize_dynamic(&model, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    q.load_state_dict(&fresh.state_dict(), true).unwrap();
    let after = c.forward(&x).unwrap();
    let want = fresh.forward(&x).unwrap();
    assert_eq!(
        bits(&after),
        bits(&want),
        "compiled output uses the new weights"
    );
    assert_ne!(bits(&after), bits(&first));
    assert!(
        qgemm::pack_count() > packs,
        "the changed weight was repacked"
    );
}

#[test]
fn bad_input_names_the_op_and_shapes() {
    kiln::manual_seed(15);
    let l = Linear::new(8, 4, true).unwrap();
    let q = QuantizedLinear::from_float(&l.weight, l.bias.as_ref(), QScheme::PerTensor).unwrap();
    let _ng = kiln::autograd::no_grad();
    let wrong_k = randn(&[2, 7], 16);
    let e = q.forward(&wrong_k).unwrap_err().to_string();
    assert!(
        e.contains("quantized_linear") && e.contains("[2,7]") && e.contains("[4,8]"),
        "{e}"
    );
    let f64_in = randn(&[2, 8], 17).to_dtype(DType::F64).unwrap();
    let e = q.forward(&f64_in).unwrap_err().to_string();
    assert!(e.contains("quantized_linear") && e.contains("f64"), "{e}");
    // compiled: the same errors, from the trace or the guard's recompile
    let c = compile(&q);
    c.forward(&randn(&[2, 8], 18)).unwrap();
    let e = c.forward(&wrong_k).unwrap_err().to_string();
    assert!(e.contains("quantized_linear") && e.contains("[2,7]"), "{e}");
    let e = c.forward(&f64_in).unwrap_err().to_string();
    assert!(e.contains("quantized_linear") && e.contains("f64"), "{e}");
    // the functional op checks its weight and scales too
    let x = randn(&[2, 8], 19);
    let wf = l.weight.detach();
    let e = F::quantized_linear(&x, &wf, &q.weight_scale, None, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("quantized_linear") && e.contains("weight must be i8"),
        "{e}"
    );
    let bad_scale = Tensor::zeros(&[3], DType::F32);
    let e = F::quantized_linear(&x, &q.weight, &bad_scale, None, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight_scale") && e.contains("[3]"), "{e}");
}

/// The int8 kernels are CPU only: a quantized Linear given a CUDA input is
/// a clear error naming the op and the device, eager and compiled, never a
/// wrong result. (Without a GPU the device is the emulator.)
#[test]
fn a_cuda_input_is_not_supported_error() {
    if std::env::var("KILN_CUDA").as_deref() != Ok("driver") {
        if std::process::Command::new("c++")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("quant_compile: no c++ compiler for the CUDA emulator, skipped");
            return;
        }
        kiln::cuda::use_emulator();
    }
    let dev = kiln::Device::cuda(0).unwrap_or_else(|e| panic!("{e}"));
    kiln::manual_seed(20);
    let model = Sequential::new().add(Linear::new(8, 4, true).unwrap());
    model.eval();
    let _ng = kiln::autograd::no_grad();
    let q = quantize_dynamic(&model, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    let x = randn(&[2, 8], 21).to_device(dev).unwrap();
    let e = q.forward(&x).unwrap_err().to_string();
    assert!(
        e.contains("quantized_linear") && e.contains("not supported on cuda"),
        "{e}"
    );
    let e = compile(&q).forward(&x).unwrap_err().to_string();
    assert!(
        e.contains("quantized_linear") && e.contains("not supported on cuda"),
        "{e}"
    );
}
