//! `quantize_dynamic` on module trees whose forward is the user's own code
//! (`#[derive(Module)]` structs, not `Sequential`s): their Linear and LSTM
//! children are swapped in place, as PyTorch swaps the attribute, for as
//! long as the quantized model lives. The result computes exactly what the
//! quantized layers compute by hand, its `state_dict` has the quantized
//! keys, and dropping it gives the float model back bit for bit.

use kiln::nn::{Activation, Linear, Module, ModuleExt, RnnOptions, Training, LSTM};
use kiln::quantization::{quantize_dynamic, QScheme, QuantType, QuantizedLinear, QuantizedLstm};
use kiln::{DType, Result, Tensor};

#[derive(Module)]
struct Block {
    fc: Linear,
    act: Activation,
    training: Training,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.act.forward(&self.fc.forward(x)?)
    }
}

#[derive(Module)]
struct Net {
    block: Block,
    head: Linear,
    training: Training,
}

impl Net {
    fn new() -> Net {
        Net {
            block: Block {
                fc: Linear::new(12, 16, true).unwrap(),
                act: Activation::relu(),
                training: Training::default(),
            },
            head: Linear::new(16, 5, false).unwrap(),
            training: Training::default(),
        }
    }

    /// A residual-free custom forward: not a chain a Sequential could hold.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.block.forward(x)?;
        self.head.forward(&h.mul_scalar(0.5)?)
    }
}

fn input() -> Tensor {
    kiln::random::normal(&[4, 12], 0.0, 1.0, DType::F32, None).unwrap()
}

#[test]
fn custom_struct_linears_are_swapped_in_place() {
    kiln::manual_seed(7);
    let net = Net::new();
    let x = input();
    let float = net.forward(&x).unwrap().to_vec::<f32>().unwrap();
    for scheme in [QScheme::PerTensor, QScheme::PerChannel] {
        let q = quantize_dynamic(&net, &[QuantType::Linear], scheme).unwrap();
        assert_eq!(q.quantized_layers(), 2);
        // by hand: the same quantized layers around the model's own code
        let fc =
            QuantizedLinear::from_float(&net.block.fc.weight, net.block.fc.bias.as_ref(), scheme)
                .unwrap();
        let head = QuantizedLinear::from_float(&net.head.weight, None, scheme).unwrap();
        let h = fc
            .forward(&x)
            .unwrap()
            .relu()
            .unwrap()
            .mul_scalar(0.5)
            .unwrap();
        let want = head.forward(&h).unwrap().to_vec::<f32>().unwrap();
        let got = q.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want, "{scheme:?}: quantized custom module");
        let worst = got
            .iter()
            .zip(&float)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst > 0.0 && worst < 0.05,
            "int8 off the float model by {worst}"
        );
        // PyTorch's keys, int8 weights
        let sd = q.state_dict();
        let keys: Vec<&str> = sd.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "block.fc.weight",
                "block.fc.weight_scale",
                "block.fc.weight_zero_point",
                "block.fc.bias",
                "head.weight",
                "head.weight_scale",
                "head.weight_zero_point"
            ]
        );
        assert_eq!(sd[0].1.dtype(), DType::I8);
        assert!(q.describe().starts_with("Net"), "{}", q.describe());
        drop(q);
        // the swap ends with the quantized model
        let back = net.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(back, float, "{scheme:?}: float model after the drop");
    }
}

#[derive(Module)]
struct Tagger {
    lstm: LSTM,
    head: Linear,
    training: Training,
}

impl Tagger {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.lstm.forward(x)?)
    }
}

#[test]
fn custom_struct_lstm_is_swapped_when_asked() {
    kiln::manual_seed(8);
    let opts = RnnOptions {
        batch_first: true,
        ..RnnOptions::default()
    };
    let m = Tagger {
        lstm: LSTM::new(6, 8, opts).unwrap(),
        head: Linear::new(8, 3, true).unwrap(),
        training: Training::default(),
    };
    let x = kiln::random::normal(&[2, 5, 6], 0.0, 1.0, DType::F32, None).unwrap();
    let float = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let q = quantize_dynamic(&m, &[QuantType::Lstm], QScheme::PerTensor).unwrap();
    assert_eq!(q.quantized_layers(), 1, "the LSTM only");
    let ql = QuantizedLstm::from_float(&m.lstm, QScheme::PerTensor).unwrap();
    let want = m
        .head
        .forward(&ql.forward(&x).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(q.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    let keys: Vec<String> = q.state_dict().into_iter().map(|(k, _)| k).collect();
    assert!(keys.contains(&"head.weight".to_string()), "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("lstm.") && k.ends_with("weight_scale")),
        "{keys:?}"
    );
    drop(q);
    assert_eq!(m.forward(&x).unwrap().to_vec::<f32>().unwrap(), float);
}
