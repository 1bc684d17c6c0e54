use super::*;
use crate::nn::{Activation, Flatten, Linear, ModuleExt, Sequential};
use crate::DType;

fn mlp() -> Sequential {
    crate::random::manual_seed(3);
    Sequential::new()
        .add(Flatten::default())
        .add(Linear::new(12, 20, true).unwrap())
        .add(Activation::relu())
        .add(Linear::new(20, 5, false).unwrap())
}

fn input() -> Tensor {
    let v: Vec<f32> = (0..4 * 12)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
        .collect();
    Tensor::from_vec(v, &[4, 3, 4]).unwrap()
}

#[test]
fn linear_relu_is_fused_and_every_kernel_agrees() {
    let m = mlp();
    let q = quantize_dynamic(&m, &[QuantType::Linear], QScheme::PerChannel).unwrap();
    assert_eq!(q.quantized_layers(), 2);
    let names: Vec<String> = {
        let mut v = vec![];
        q.visit(&mut |e| {
            if let Entry::Child(_, c) = e {
                v.push(c.describe())
            }
        });
        v
    };
    assert!(
        names[1].starts_with("DynamicQuantizedLinearReLU(in_features=12"),
        "{names:?}"
    );
    assert_eq!(names[2], "ReLU() [fused into `1`]");
    let x = input();
    let y = q.forward(&x).unwrap();
    // the float model is close (8-bit error), and the kernels agree exactly
    let f = m.forward(&x).unwrap().to_f64_vec();
    let g = y.to_f64_vec();
    assert!(
        f.iter().zip(&g).all(|(a, b)| (a - b).abs() < 0.05),
        "{f:?} vs {g:?}"
    );
    let h = x.reshape(&[4, 12]).unwrap();
    let ql = QuantizedLinear::from_float(
        &Linear::new(12, 7, true).unwrap().weight,
        None,
        QScheme::PerTensor,
    )
    .unwrap();
    let scalar = ql
        .forward_with(&h, Isa::Scalar)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let best = ql
        .forward_with(&h, Isa::detect())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(scalar, best);
}

#[test]
fn state_dict_round_trips_through_a_file() {
    let m = mlp();
    let q = quantize_dynamic(&m, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    let sd = q.state_dict();
    let keys: Vec<&str> = sd.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "1.weight",
            "1.weight_scale",
            "1.weight_zero_point",
            "1.bias",
            "3.weight",
            "3.weight_scale",
            "3.weight_zero_point"
        ]
    );
    assert_eq!(sd[0].1.dtype(), DType::I8);
    let dir = std::env::temp_dir().join(format!("kiln-quant-sd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("q.safetensors");
    crate::serialize::save(&path, &sd).unwrap();
    // a differently initialised skeleton, quantized, then loaded
    crate::random::manual_seed(99);
    let other = Sequential::new()
        .add(Flatten::default())
        .add(Linear::new(12, 20, true).unwrap())
        .add(Activation::relu())
        .add(Linear::new(20, 5, false).unwrap());
    let q2 = quantize_dynamic(&other, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    let x = input();
    let before = q2.forward(&x).unwrap().to_vec::<f32>().unwrap();
    q2.load_state_dict(&crate::serialize::load(&path).unwrap(), true)
        .unwrap();
    let after = q2.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let want = q.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(before, want);
    assert_eq!(after, want, "the packed weights follow a load_state_dict");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_an_error_naming_the_op() {
    let m = mlp();
    let q = quantize_dynamic(&m, &[QuantType::Linear], QScheme::PerTensor).unwrap();
    let e = q
        .forward(&Tensor::ones(&[2, 13], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("quantized_linear") && e.contains("[2,13]"),
        "{e}"
    );
    let nan = Tensor::from_vec(vec![f32::NAN; 12], &[1, 12]).unwrap();
    let e = q.forward(&nan).unwrap_err().to_string();
    assert!(e.contains("non-finite"), "{e}");
    let e = q
        .forward(&Tensor::ones(&[1, 12], DType::F64))
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32"), "{e}");
    let e = quantize_dynamic(&m, &[], QScheme::PerTensor)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no layer type"), "{e}");
    // an LSTM with proj_size has no dynamically quantized form
    let opts = crate::nn::RnnOptions {
        proj_size: 2,
        ..Default::default()
    };
    let proj = crate::nn::LSTM::new(3, 4, opts).unwrap();
    let e = quantize_dynamic(&proj, &[QuantType::Lstm], QScheme::PerTensor)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("LSTM(3, 4, proj_size=2)"), "{e}");
}

#[test]
fn quantized_lstm_is_close_to_float_and_keeps_linears_float_when_asked() {
    crate::random::manual_seed(5);
    let opts = crate::nn::RnnOptions {
        num_layers: 2,
        bidirectional: true,
        ..Default::default()
    };
    let lstm = crate::nn::LSTM::new(6, 8, opts).unwrap();
    let seq = Sequential::new()
        .add(Linear::new(6, 6, true).unwrap())
        .add(lstm);
    let q = quantize_dynamic(&seq, &[QuantType::Lstm], QScheme::PerChannel).unwrap();
    assert_eq!(q.quantized_layers(), 1, "the LSTM only");
    let x = crate::random::normal(&[5, 2, 6], 0.0, 1.0, DType::F32, None).unwrap();
    let want = seq.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let got = q.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), 5 * 2 * 16);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst > 0.0 && worst < 0.05, "int8 LSTM off by {worst}");
    let keys: Vec<String> = q.state_dict().into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.contains(&"1.ih_l1_reverse.weight_scale".to_string()),
        "{keys:?}"
    );
}
