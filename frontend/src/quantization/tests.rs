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
    let e = quantize_dynamic(
        &m,
        &[QuantType::Linear, QuantType::Lstm],
        QScheme::PerTensor,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("LSTM"), "{e}");
}
