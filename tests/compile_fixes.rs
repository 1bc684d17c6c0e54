//! compile() fixes from the model-zoo port (issue 16): `compile_fn`
//! differentiates through the parameters a closure captures, compiled
//! training with several results that require grad, state a forward
//! stashes refused with an error, and tensor gradient hooks (eager, and
//! what compile does with them). Each is checked against eager.

use kiln::compile::{compile, compile_fn};
use kiln::ir::BinaryOp;
use kiln::nn::{Activation, Entry, Linear, Module, ModuleExt, Sequential};
use kiln::{functional, Result, Tensor};
use std::sync::{Arc, Mutex};

fn grads(m: &dyn Module) -> Vec<Option<Vec<f32>>> {
    m.parameters()
        .iter()
        .map(|p| p.grad().map(|g| g.to_vec::<f32>().unwrap()))
        .collect()
}

/// The largest |a - b| / max(|b|, 1) over every gradient; panics on a missing one.
fn max_rel_diff(got: &[Option<Vec<f32>>], want: &[Option<Vec<f32>>]) -> f32 {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = match (g, w) {
            (Some(g), Some(w)) => (g, w),
            _ => panic!(
                "param {i}: gradient {} compiled, {} eager",
                g.is_some(),
                w.is_some()
            ),
        };
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    worst
}

/// Eight Linear layers (16 parameters) with ReLUs between.
fn deep(seed: u64) -> Sequential {
    kiln::manual_seed(seed);
    let mut m = Sequential::new();
    for i in 0..8 {
        m = m.add(Linear::new(6, 6, true).unwrap());
        if i < 7 {
            m = m.add(Activation::relu());
        }
    }
    m
}

fn sq_sum(y: &Tensor) -> Tensor {
    y.mul(y).unwrap().sum(None, false).unwrap()
}

#[test]
fn compile_fn_differentiates_through_captured_parameters() {
    let m = deep(1);
    kiln::manual_seed(2);
    let x = kiln::random::randn(&[4, 6], None); // does not require grad
    sq_sum(&m.forward(&x).unwrap()).backward().unwrap();
    let eager = grads(&m);
    m.zero_grad();
    let f = compile_fn("closure", |xs| Ok(vec![m.forward(&xs[0])?]));
    for call in 0..2 {
        m.zero_grad();
        let y = f.call(std::slice::from_ref(&x)).unwrap().remove(0);
        assert!(y.requires_grad(), "call {call}: the result has no grad_fn");
        assert_eq!(y.grad_fn().unwrap().name(), "CompiledBackward");
        sq_sum(&y).backward().unwrap();
        let got = grads(&m);
        let n = got.iter().filter(|g| g.is_some()).count();
        let diff = max_rel_diff(&got, &eager);
        println!(
            "compile_fn call {call}: {n}/{} parameters get a gradient, max rel diff vs eager {diff:.2e}",
            got.len()
        );
        assert!(diff < 1e-5, "call {call}: {diff}");
    }
    let report = f.explain();
    assert_eq!(report.entries.len(), 1, "{report}");
    assert!(
        report.entries[0].backward.is_some(),
        "not a training entry: {report}"
    );
    // without grad mode, the same closure compiles an inference entry
    let _ng = kiln::autograd::no_grad();
    let y = f.call(std::slice::from_ref(&x)).unwrap().remove(0);
    assert!(!y.requires_grad());
}

/// A one-head attention: returns the logits and the attention
/// probabilities, both differentiable.
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    head: Linear,
}

impl Attention {
    fn new(seed: u64) -> Attention {
        kiln::manual_seed(seed);
        Attention {
            q: Linear::new(8, 8, false).unwrap(),
            k: Linear::new(8, 8, false).unwrap(),
            v: Linear::new(8, 8, true).unwrap(),
            head: Linear::new(8, 3, true).unwrap(),
        }
    }

    fn logits_and_probs(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let (q, k, v) = (self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?);
        let scores = functional::matmul(&q, &k.transpose(-2, -1)?)?;
        let probs = scores
            .binary_scalar(BinaryOp::Mul, 0.25, false)?
            .softmax(-1)?;
        let out = functional::matmul(&probs, &v)?;
        Ok(vec![self.head.forward(&out)?, probs])
    }
}

impl Module for Attention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.logits_and_probs(x)?.remove(0))
    }

    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(x)] => self.logits_and_probs(x),
            _ => kiln::ir::bail!("Attention", "takes one input, got {}", inputs.len()),
        }
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("q", &self.q));
        f(Entry::Child("k", &self.k));
        f(Entry::Child("v", &self.v));
        f(Entry::Child("head", &self.head));
    }

    fn describe(&self) -> String {
        "Attention".into()
    }
}

/// The loss reads both results: cross-entropy-like on the logits, and an
/// attention-entropy penalty on the probabilities.
fn two_output_loss(outs: &[Tensor], use_probs: bool) -> Tensor {
    let mut loss = sq_sum(&outs[0]);
    if use_probs {
        let p = &outs[1];
        let ent = p.mul(&p.log().unwrap()).unwrap().sum(None, false).unwrap();
        loss = loss.add(&ent).unwrap();
    }
    loss
}

#[test]
fn compiled_training_with_two_differentiable_outputs() {
    kiln::manual_seed(3);
    let x0 = kiln::random::randn(&[2, 5, 8], None);
    for use_probs in [true, false] {
        let m = Attention::new(4);
        let x = x0.detach().requires_grad_(true);
        two_output_loss(&m.forward_many(&[Some(&x)]).unwrap(), use_probs)
            .backward()
            .unwrap();
        let (eager, eager_x) = (grads(&m), x.grad().unwrap().to_vec::<f32>().unwrap());
        let c = compile_fn("attention", |xs| m.logits_and_probs(&xs[0]));
        for call in 0..2 {
            m.zero_grad();
            x.set_grad(None);
            let outs = c.call(std::slice::from_ref(&x)).unwrap();
            assert!(outs.iter().all(Tensor::requires_grad));
            for o in &outs {
                assert_eq!(o.grad_fn().unwrap().name(), "CompiledOutputBackward");
            }
            two_output_loss(&outs, use_probs).backward().unwrap();
            let diff = max_rel_diff(&grads(&m), &eager);
            let got_x = x.grad().unwrap().to_vec::<f32>().unwrap();
            let diff_x = max_rel_diff(&[Some(got_x)], &[Some(eager_x.clone())]);
            println!(
                "two outputs (loss reads probs: {use_probs}) call {call}: max rel diff vs eager {diff:.2e} params, {diff_x:.2e} input"
            );
            assert!(diff < 1e-4 && diff_x < 1e-4, "{diff} {diff_x}");
        }
        let report = c.explain();
        let e = &report.entries[0];
        assert!(e.graph_break.is_none() && e.backward.is_some(), "{report}");
        println!(
            "two outputs compiled: {} forward kernels, {} backward kernels, no graph break",
            e.kernels.len(),
            e.backward.as_ref().unwrap().kernels.len()
        );
    }
}

/// A forward that keeps its attention probabilities in a field.
struct Stashing {
    inner: Attention,
    probs: Mutex<Option<Tensor>>,
}

impl Module for Stashing {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut outs = self.inner.logits_and_probs(x)?;
        *self.probs.lock().unwrap() = Some(outs.remove(1));
        Ok(outs.remove(0))
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("inner", &self.inner));
    }

    fn describe(&self) -> String {
        "Stashing".into()
    }
}

#[test]
fn state_a_forward_writes_is_refused_not_left_stale() {
    kiln::manual_seed(5);
    let x = kiln::random::randn(&[2, 5, 8], None);
    let m = Stashing {
        inner: Attention::new(6),
        probs: Mutex::new(None),
    };
    // an inference entry, and a training one
    for grad in [false, true] {
        let _g = kiln::autograd::set_grad_enabled(grad);
        let c = compile(&m);
        let err = c
            .forward(&x)
            .err()
            .expect("a stashing forward must not compile");
        let msg = err.to_string();
        println!("grad {grad}: {msg}");
        assert!(
            msg.contains("self.probs") && msg.contains("Return it as a result"),
            "{msg}"
        );
        assert!(msg.contains("softmax"), "{msg}");
        // every call is refused, not only the first
        assert!(c.forward(&x).is_err());
    }
    // a closure writing a captured cell is refused the same way
    let cell: Mutex<Option<Tensor>> = Mutex::new(None);
    let f = compile_fn("stash", |xs| {
        let y = xs[0].exp()?;
        *cell.lock().unwrap() = Some(y.clone());
        Ok(vec![y.sum(None, false)?])
    });
    let msg = f
        .call(std::slice::from_ref(&x))
        .err()
        .expect("refused")
        .to_string();
    assert!(msg.contains("`stash` keeps a tensor"), "{msg}");
    // returning it instead compiles, and follows the input on cached calls
    let g = compile_fn("returned", |xs| {
        let y = xs[0].exp()?;
        Ok(vec![y.sum(None, false)?, y])
    });
    for scale in [1.0f32, 2.0] {
        let xs = x.binary_scalar(BinaryOp::Mul, scale, false).unwrap();
        let outs = g.call(std::slice::from_ref(&xs)).unwrap();
        let want = xs.exp().unwrap().to_vec::<f32>().unwrap();
        let got = outs[1].to_vec::<f32>().unwrap();
        let diff = max_rel_diff(&[Some(got)], &[Some(want)]);
        assert!(
            diff < 1e-5,
            "scale {scale}: the returned value is stale ({diff})"
        );
    }
}

#[test]
fn gradient_hooks_observe_and_replace_eagerly() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])
        .unwrap()
        .requires_grad_(true);
    let seen: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
    let s = seen.clone();
    // a leaf used twice: its hook sees the summed gradient, once
    let h_leaf = w
        .register_hook(move |g| {
            s.lock().unwrap().push(g.to_vec::<f32>()?);
            Ok(None)
        })
        .unwrap();
    let y = w.mul(&w).unwrap(); // dy/dw = 2w
                                // a non-leaf hook that replaces: triple what flows into y
    let h_mid = y
        .register_hook(|g| Ok(Some(g.binary_scalar(BinaryOp::Mul, 3.0, false)?)))
        .unwrap();
    y.sum(None, false)
        .unwrap()
        .add(&w.sum(None, false).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f32> = vec![7.0, 13.0, 19.0]; // 3 * 2w + 1
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), want);
    assert_eq!(seen.lock().unwrap().clone(), vec![want.clone()]);
    // a leaf hook that replaces: clip the gradient before it reaches .grad
    drop((h_leaf, h_mid));
    w.set_grad(None);
    let _clip = w
        .register_hook(|g| Ok(Some(g.clamp(Some(-1.0), Some(1.0))?)))
        .unwrap();
    w.mul(&w)
        .unwrap()
        .sum(None, false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        w.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 1.0, 1.0]
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "a removed hook ran");
    // bad input: a tensor that does not require grad; a hook changing the shape
    let c = Tensor::ones(&[2], kiln::DType::F32);
    let e = c.register_hook(|_| Ok(None)).err().unwrap().to_string();
    assert!(
        e.contains("register_hook") && e.contains("does not require grad"),
        "{e}"
    );
    let v = Tensor::ones(&[2], kiln::DType::F32).requires_grad_(true);
    let _bad = v
        .register_hook(|_| Ok(Some(Tensor::ones(&[3], kiln::DType::F32))))
        .unwrap();
    let e = v
        .sum(None, false)
        .unwrap()
        .backward()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("shape [3]") && e.contains("shape [2]"), "{e}");
}

#[test]
fn gradient_hooks_under_compile() {
    let m = deep(7);
    kiln::manual_seed(8);
    let x = kiln::random::randn(&[4, 6], None);
    let halve = |g: &Tensor| Ok(Some(g.binary_scalar(BinaryOp::Mul, 0.5, false)?));
    // eager with a hook halving the first weight's gradient
    let w0 = m.parameters()[0].clone();
    let h = w0.register_hook(halve).unwrap();
    sq_sum(&m.forward(&x).unwrap()).backward().unwrap();
    let eager = grads(&m);
    // a parameter's hook runs when the compiled backward hands its gradient over
    let c = compile(&m);
    for _ in 0..2 {
        m.zero_grad();
        sq_sum(&c.forward(&x).unwrap()).backward().unwrap();
        let diff = max_rel_diff(&grads(&m), &eager);
        println!("compiled, hook on a parameter: max rel diff vs eager {diff:.2e}");
        assert!(diff < 1e-5, "{diff}");
    }
    assert!(c.explain().entries[0].backward.is_some());
    drop(h);
    // a hook on a value inside the compiled function: a graph break, and
    // the eager fallback runs it
    let handles: Mutex<Vec<kiln::autograd::GradHookHandle>> = Mutex::default();
    let inner = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = m.forward(&xs[0])?;
        handles.lock().unwrap().push(y.register_hook(halve)?);
        Ok(vec![y])
    };
    // (the input requires grad, so the first trace is the joint one)
    let x = x.requires_grad_(true);
    m.zero_grad();
    sq_sum(&inner(std::slice::from_ref(&x)).unwrap().remove(0))
        .backward()
        .unwrap();
    let eager = grads(&m);
    let f = compile_fn("hooked", inner);
    m.zero_grad();
    sq_sum(&f.call(std::slice::from_ref(&x)).unwrap().remove(0))
        .backward()
        .unwrap();
    let report = f.explain().to_string();
    assert!(report.contains("register_hook"), "{report}");
    assert_eq!(grads(&m), eager, "the eager fallback ran the hook");
}

/// A result computed from constants only (hoisted: computed on the first
/// call, then cached) that nothing else in the graph reads still comes back
/// on every later call: joint graphs save such values for the backward
/// (embedding_bag's membership matrix of a 2-D input did).
#[test]
fn hoisted_result_with_no_reader_survives_warm_calls() {
    let f = compile_fn("hoisted_out", |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let c = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?.exp()?;
        Ok(vec![xs[0].relu()?, c])
    });
    let x = Tensor::from_vec(vec![-1.0f32, 3.0], &[2]).unwrap();
    let want = [1f64.exp(), 2f64.exp()];
    for call in 0..3 {
        let outs = f.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(outs[0].to_f64_vec(), vec![0.0, 3.0], "call {call}");
        let got = outs[1].to_f64_vec();
        assert!(
            got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5 * w),
            "call {call}: {got:?}"
        );
    }
}
