//! The Module API a port needs: `#[derive(Module)]`, training mode for
//! every module, several inputs, weight tying, `to_dtype`, and compiling a
//! `&dyn Module`.

use kiln::compile::compile;
use kiln::nn::{Activation, BatchNorm, Linear, Module, ModuleExt, Training};
use kiln::optim::{Optimizer, SgdConfig, SGD};
use kiln::{functional as F, DType, Result, Tensor};

/// A custom module in the style of a PyTorch port: children, a parameter,
/// a buffer, a non-persistent buffer, its own flag and configuration.
#[derive(Module)]
struct Net {
    fc1: Linear,
    act: Activation,
    head: Option<Linear>,
    scale: Tensor,
    #[module(buffer)]
    steps: Tensor,
    #[module(buffer, persistent = false)]
    cache: Tensor,
    training: Training,
    #[module(skip)]
    width: usize,
}

impl Net {
    fn new(head: bool) -> Net {
        Net {
            fc1: Linear::new(4, 3, true).unwrap(),
            act: Activation::relu(),
            head: head.then(|| Linear::new(3, 2, false).unwrap()),
            scale: Tensor::ones(&[3], DType::F32).requires_grad_(true),
            steps: Tensor::zeros(&[1], DType::I64),
            cache: Tensor::zeros(&[3], DType::F32),
            training: Training::default(),
            width: 3,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.act.forward(&self.fc1.forward(x)?)?.mul(&self.scale)?;
        match &self.head {
            Some(l) => l.forward(&h),
            None => Ok(h),
        }
    }
}

fn names(v: Vec<(String, Tensor)>) -> Vec<String> {
    v.into_iter().map(|(k, _)| k).collect()
}

#[test]
fn derive_registers_fields_in_order() {
    let net = Net::new(true);
    assert_eq!(
        names(net.named_parameters()),
        ["scale", "fc1.weight", "fc1.bias", "head.weight"]
    );
    assert_eq!(
        names(net.state_dict()),
        ["scale", "steps", "fc1.weight", "fc1.bias", "head.weight"],
        "a non-persistent buffer stays out of the state_dict"
    );
    assert_eq!(names(net.named_buffers()), ["steps", "cache"]);
    assert_eq!(net.width, 3);
    assert_eq!(
        net.to_string_tree(),
        "Net(\n  (fc1): Linear(in_features=4, out_features=3, bias=True)\n  (act): ReLU()\n  \
         (head): Linear(in_features=3, out_features=2, bias=False)\n)"
    );
    let without = Net::new(false);
    assert_eq!(
        names(without.named_parameters()),
        ["scale", "fc1.weight", "fc1.bias"],
        "a None child registers nothing"
    );
    let x = kiln::random::randn(&[5, 4], None);
    assert_eq!(net.forward(&x).unwrap().dims(), &[5, 2]);
}

/// PyTorch names that are no Rust field name (transformers' `self`, `LayerNorm`).
#[derive(Module)]
struct Renamed {
    #[module(name = "self")]
    attention: Linear,
    #[module(name = "LayerNorm")]
    norm: kiln::nn::LayerNorm,
    #[module(name = "bias_k")]
    k: Tensor,
}

impl Renamed {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(&self.attention.forward(x)?)?.add(&self.k)
    }
}

#[test]
fn derive_name_attribute_registers_under_that_name() {
    let m = Renamed {
        attention: Linear::new(3, 3, true).unwrap(),
        norm: kiln::nn::LayerNorm::new(&[3], 1e-5, true),
        k: Tensor::zeros(&[3], DType::F32).requires_grad_(true),
    };
    assert_eq!(
        names(m.state_dict()),
        [
            "bias_k",
            "self.weight",
            "self.bias",
            "LayerNorm.weight",
            "LayerNorm.bias"
        ]
    );
    let sd: Vec<(String, Tensor)> = m.state_dict();
    m.load_state_dict(&sd, true).unwrap();
    assert_eq!(
        m.forward(&Tensor::ones(&[2, 3], DType::F32))
            .unwrap()
            .dims(),
        &[2, 3]
    );
}

/// No flag of its own: it follows its children.
#[derive(Module)]
struct Wrapper {
    inner: Net,
}

impl Wrapper {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.forward(x)
    }
}

#[test]
fn every_module_reports_eval_mode() {
    let w = Wrapper {
        inner: Net::new(true),
    };
    assert!(w.is_training() && w.inner.is_training());
    w.eval();
    assert!(!w.inner.is_training(), "the derived flag is set by eval()");
    assert!(
        !w.is_training(),
        "a flagless container follows its children"
    );
    w.train();
    assert!(w.is_training() && w.inner.is_training());
}

/// Two inputs, the second optional: `forward_many(&[Some(x), mask])`.
#[derive(Module)]
#[module(forward_many)]
struct Masked {
    proj: Linear,
}

impl Masked {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.proj.forward(x)
    }
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (Some(Some(x)), mask) = (inputs.first(), inputs.get(1).copied().flatten()) else {
            return Err(kiln::Error::op("Masked", "needs x"));
        };
        let y = self.proj.forward(x)?;
        let y = match mask {
            Some(m) => y.mul(m)?,
            None => y,
        };
        Ok(vec![y.clone(), y.sum(None, false)?])
    }
}

#[test]
fn several_inputs_and_outputs_eager_and_compiled() {
    let m = Masked {
        proj: Linear::new(4, 3, true).unwrap(),
    };
    let x = kiln::random::randn(&[2, 4], None);
    let mask = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 0.0, 1.0, 1.0], &[2, 3]).unwrap();
    let eager = m.forward_many(&[Some(&x), Some(&mask)]).unwrap();
    assert_eq!(eager.len(), 2);
    assert_eq!(
        eager[0].to_vec::<f32>().unwrap()[1],
        0.0,
        "the mask applied"
    );
    let unmasked = m.forward_many(&[Some(&x), None]).unwrap();
    assert_eq!(
        unmasked[0].to_vec::<f32>().unwrap(),
        m.forward(&x).unwrap().to_vec::<f32>().unwrap()
    );
    let c = compile(&m);
    for _ in 0..2 {
        let got = c.call(&[x.clone(), mask.clone()]).unwrap();
        for (g, e) in got.iter().zip(&eager) {
            assert_eq!(g.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
        }
    }
    // a one-input module refuses two, naming itself
    let l = Linear::new(4, 3, true).unwrap();
    let err = l
        .forward_many(&[Some(&x), Some(&x)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("forward_many") && err.contains("Linear(in_features=4"),
        "{err}"
    );
}

#[test]
fn compile_takes_a_boxed_dyn_module() {
    let boxed: Box<dyn Module> = Box::new(Net::new(true));
    let x = kiln::random::randn(&[3, 4], None);
    let eager = boxed.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let c = compile(boxed.as_ref());
    assert_eq!(c.forward(&x).unwrap().to_vec::<f32>().unwrap(), eager);
}

/// An encoder and a decoder sharing one embedding matrix (GPT-2's lm_head).
#[derive(Module)]
struct Tied {
    wte: Linear,
    lm_head: Linear,
}

impl Tied {
    fn new() -> Tied {
        let wte = Linear::new(3, 5, false).unwrap();
        let mut lm_head = Linear::new(5, 3, false).unwrap();
        lm_head.weight = wte.weight.clone();
        Tied { wte, lm_head }
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // x [n, 3] -> [n, 5] -> back through the same weight [n, 3]
        F::linear(&self.wte.forward(x)?, &self.lm_head.weight.t()?, None)
    }
}

#[test]
fn tied_weights_are_one_parameter() {
    let m = Tied::new();
    assert_eq!(names(m.named_parameters()), ["wte.weight"]);
    assert_eq!(
        names(m.state_dict()),
        ["wte.weight", "lm_head.weight"],
        "state_dict keeps both keys, as PyTorch's does"
    );
    // one SGD step moves the shared tensor once: w - lr * (total gradient)
    let x = kiln::random::randn(&[4, 3], None);
    let w0 = m.wte.weight.to_vec::<f32>().unwrap();
    m.forward(&x)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    let g = m.wte.weight.grad().unwrap().to_vec::<f32>().unwrap();
    let cfg = SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    };
    let mut opt = SGD::with_params(m.parameters(), cfg).unwrap();
    opt.step().unwrap();
    let w1 = m.lm_head.weight.to_vec::<f32>().unwrap();
    for ((a, b), g) in w0.iter().zip(&w1).zip(&g) {
        assert!((a - 0.1 * g - b).abs() < 1e-6, "{a} - 0.1*{g} != {b}");
    }
    // loading a state_dict keeps the tie
    let other = Tied::new();
    other.load_state_dict(&m.state_dict(), true).unwrap();
    assert!(other.wte.weight.is_same(&other.lm_head.weight));
    assert_eq!(other.lm_head.weight.to_vec::<f32>().unwrap(), w1);
}

#[test]
fn to_dtype_converts_float_tensors_and_keeps_ties() {
    let mut m = Tied::new();
    m.to_dtype(DType::BF16).unwrap();
    assert_eq!(m.wte.weight.dtype(), DType::BF16);
    assert!(m.wte.weight.requires_grad());
    assert!(m.wte.weight.is_same(&m.lm_head.weight), "still tied");
    let mut bn = BatchNorm::new_2d(3);
    bn.to_dtype(DType::F16).unwrap();
    for (k, t) in bn.state_dict() {
        let want = if k == "num_batches_tracked" {
            DType::I64
        } else {
            DType::F16
        };
        assert_eq!(t.dtype(), want, "{k}");
    }
    let err = bn.to_dtype(DType::I32).unwrap_err().to_string();
    assert!(err.contains("to_dtype") && err.contains("I32"), "{err}");
}

#[test]
fn summary_and_activation_stats_of_a_derived_model() {
    let net = Net::new(true);
    let x = kiln::random::randn(&[2, 4], None);
    let s = kiln::summary::summary(&net, &x).unwrap();
    let rows: Vec<(String, Vec<usize>, usize)> = s
        .rows
        .iter()
        .map(|r| (r.name.clone(), r.output.clone(), r.params))
        .collect();
    assert_eq!(
        rows,
        [
            ("fc1".to_string(), vec![2, 3], 15),
            ("act".to_string(), vec![2, 3], 0),
            ("head".to_string(), vec![2, 2], 6),
        ]
    );
    assert_eq!(s.total_params, 3 + 15 + 6);
    assert!(net.is_training(), "summary restores the mode");
    let stats = kiln::summary::activation_stats(&net, &x).unwrap();
    let relu = &stats[1];
    assert_eq!(relu.layer, "ReLU()");
    let out = net.act.forward(&net.fc1.forward(&x).unwrap()).unwrap();
    let v: Vec<f64> = out
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64;
    assert!((relu.mean - mean).abs() < 1e-6 && (relu.std - var.sqrt()).abs() < 1e-6);
}

#[test]
fn forward_hooks_fire_once_and_can_replace_outputs() {
    use kiln::nn::hooks;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let net = Net::new(true);
    let x = kiln::random::randn(&[2, 4], None);
    let pre = Arc::new(AtomicUsize::new(0));
    let p = pre.clone();
    let h1 = hooks::register_forward_pre_hook(&net.fc1, move |m, x| {
        assert!(m.describe().starts_with("Linear"));
        assert_eq!(x.dims(), &[2, 4]);
        p.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    // zero the head's output: the model's output changes
    let h2 = hooks::register_forward_hook(net.head.as_ref().unwrap(), |_m, _x, out| {
        Ok(Some(out.mul(&Tensor::zeros(out.dims(), DType::F32))?))
    });
    let y = net.forward(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0; 4]);
    // the standard layer reached through call() and forward() fires once
    net.fc1.call(&x).unwrap();
    assert_eq!(pre.load(Ordering::SeqCst), 2);
    // a hook on the whole model fires from call()
    let whole = Arc::new(AtomicUsize::new(0));
    let w = whole.clone();
    let h3 = hooks::register_forward_hook(&net, move |_m, _x, _out| {
        w.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    });
    net.call(&x).unwrap();
    assert_eq!(
        whole.load(Ordering::SeqCst),
        1,
        "not again for its first field"
    );
    drop((h1, h2, h3));
    assert_ne!(
        net.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 4],
        "removed"
    );
}

/// `x.pow(2)`, `x / 2`, `x * 2`, `x + 1`, `x - 1` with Python numbers: the
/// same values and gradients as the tensor-operand ops; an integer tensor
/// divided by a number is PyTorch's true division (a float result, inf for 0).
#[test]
fn scalar_ops_match_their_tensor_forms() {
    let v = vec![-1.5f32, 0.25, 2.0, 3.0];
    let two = Tensor::full(&[], 2.0, DType::F32);
    type Pair = (
        fn(&Tensor) -> Result<Tensor>,
        fn(&Tensor, &Tensor) -> Result<Tensor>,
    );
    let cases: [(&str, Pair); 5] = [
        ("pow", (|x| x.pow_scalar(2.0), |x, t| x.pow(t))),
        ("div", (|x| x.div_scalar(2.0), |x, t| x.div(t))),
        ("mul", (|x| x.mul_scalar(2.0), |x, t| x.mul(t))),
        ("add", (|x| x.add_scalar(2.0), |x, t| x.add(t))),
        ("sub", (|x| x.sub_scalar(2.0), |x, t| x.sub(t))),
    ];
    for (name, (scalar, tensor)) in cases {
        let a = Tensor::from_vec(v.clone(), &[4])
            .unwrap()
            .requires_grad_(true);
        let b = Tensor::from_vec(v.clone(), &[4])
            .unwrap()
            .requires_grad_(true);
        let (ya, yb) = (scalar(&a).unwrap(), tensor(&b, &two).unwrap());
        assert_eq!(
            ya.to_vec::<f32>().unwrap(),
            yb.to_vec::<f32>().unwrap(),
            "{name}"
        );
        ya.sum(None, false).unwrap().backward().unwrap();
        yb.sum(None, false).unwrap().backward().unwrap();
        let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
        assert_eq!(
            ga.to_vec::<f32>().unwrap(),
            gb.to_vec::<f32>().unwrap(),
            "{name} grad"
        );
    }
    let i = Tensor::from_vec(vec![4i64, 6], &[2]).unwrap();
    let q = i.div_scalar(0i64).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(q.to_vec::<f32>().unwrap(), vec![f32::INFINITY; 2]);
    assert_eq!(
        i.div_scalar(4i64).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 1.5]
    );
}
