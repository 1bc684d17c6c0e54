//! Compiled training end to end: a compiled module's forward carries a
//! backward node running the compiled backward graph; gradients, BatchNorm
//! running stats and optimizer steps match eager.

use kiln::compile::compile;
use kiln::functional as F;
use kiln::nn::{self, Module, ModuleExt};
use kiln::{Result, Tensor};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(dims: &[usize], seed: u64) -> Tensor {
    kiln::bench::randn(dims, seed)
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.dims(), b.dims(), "{what}");
    for (i, (p, q)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "{what} element {i}: {p} vs {q}"
        );
    }
}

fn labels(n: usize) -> Tensor {
    Tensor::from_vec(
        (0..n).map(|i| (i * 7 % 10) as i64).collect::<Vec<_>>(),
        &[n],
    )
    .unwrap()
}

fn cnn() -> Result<nn::Sequential> {
    use kiln::ir::op::conv::Padding;
    use kiln::nn::ConvOptions;
    let p = |stride| ConvOptions {
        stride,
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
    Ok(nn::Sequential::new()
        .add(nn::Conv::conv2d(1, 8, 3, p(1))?)
        .add(nn::BatchNorm::new_2d(8))
        .add(nn::Activation::relu())
        .add(nn::Conv::conv2d(8, 16, 3, p(2))?)
        .add(nn::BatchNorm::new_2d(16))
        .add(nn::Activation::relu())
        .add(nn::Pool2d::AdaptiveAvg([1, 1]))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(16, 10, true)?))
}

fn mlp() -> Result<nn::Sequential> {
    Ok(nn::Sequential::new()
        .add(nn::Flatten::default())
        .add(nn::Linear::new(64, 32, true)?)
        .add(nn::Activation::relu())
        .add(nn::Linear::new(32, 10, true)?))
}

/// Two copies of a model (eager and compiled) take the same steps; loss,
/// every gradient and every buffer must agree after each.
fn same_as_eager(make: fn() -> Result<nn::Sequential>, x: &Tensor) {
    kiln::manual_seed(5);
    let eager = make().unwrap();
    kiln::manual_seed(5);
    let model = make().unwrap();
    let compiled = compile(&model);
    let y = labels(x.dims()[0]);
    for step in 0..3 {
        let x = &(x * (1.0 + step as f64 * 0.5));
        let le = F::cross_entropy(
            &eager.forward(x).unwrap(),
            &y,
            None,
            kiln::ClassLossOpts::default(),
        )
        .unwrap();
        let out = compiled.forward(x).unwrap();
        assert_eq!(
            out.grad_fn().map(|n| n.name().to_string()).as_deref(),
            Some("CompiledBackward")
        );
        let lc = F::cross_entropy(&out, &y, None, kiln::ClassLossOpts::default()).unwrap();
        assert_close("loss", &lc, &le, 1e-5);
        le.backward().unwrap();
        lc.backward().unwrap();
        for ((n, pe), (_, pc)) in eager
            .named_parameters()
            .iter()
            .zip(model.named_parameters())
        {
            assert_close(
                &format!("step {step} grad {n}"),
                &pc.grad().unwrap(),
                &pe.grad().unwrap(),
                1e-4,
            );
        }
        for ((n, be), (_, bc)) in eager.named_buffers().iter().zip(model.named_buffers()) {
            assert_close(&format!("step {step} buffer {n}"), &bc, be, 1e-5);
        }
        // a plain SGD step on both, so the next step sees new parameters
        let _ng = kiln::autograd::no_grad();
        for (pe, pc) in eager.parameters().iter().zip(model.parameters()) {
            pe.copy_(&pe.add_scaled(&pe.grad().unwrap(), 0.1, true).unwrap())
                .unwrap();
            pc.copy_(&pc.add_scaled(&pc.grad().unwrap(), 0.1, true).unwrap())
                .unwrap();
            pe.set_grad(None);
            pc.set_grad(None);
        }
    }
    let r = compiled.explain();
    assert_eq!(r.entries.len(), 1, "{r}");
    assert!(r.entries[0].graph_break.is_none(), "{r}");
}

#[test]
fn mlp_training_matches_eager() {
    let _s = serial();
    same_as_eager(mlp, &randn(&[16, 1, 8, 8], 1));
}

#[test]
fn cnn_training_with_batchnorm_matches_eager() {
    let _s = serial();
    same_as_eager(cnn, &randn(&[16, 1, 8, 8], 2));
}

/// A compiled function's gradients w.r.t. its arguments, on the call after
/// the one that traced (other values), against eager autograd.
fn grads_match_eager(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + Copy,
    args: &[Tensor],
) {
    let fresh = |scale: f64| -> Vec<Tensor> {
        args.iter()
            .map(|a| {
                if a.dtype().is_float() {
                    (a * scale).requires_grad_(true)
                } else {
                    a.clone()
                }
            })
            .collect()
    };
    let compiled = kiln::compile::compile_fn("f", f);
    let first = fresh(0.5);
    let out = compiled.call(&first).unwrap();
    assert_eq!(
        out[0].grad_fn().map(|n| n.name().to_string()).as_deref(),
        Some("CompiledBackward")
    );
    out[0].backward().unwrap();
    let (eager_args, compiled_args) = (fresh(1.0), fresh(1.0));
    f(&eager_args).unwrap()[0].backward().unwrap();
    compiled.call(&compiled_args).unwrap()[0]
        .backward()
        .unwrap();
    for (k, (e, c)) in eager_args.iter().zip(&compiled_args).enumerate() {
        if e.requires_grad() {
            assert_close(
                &format!("grad {k}"),
                &c.grad().unwrap(),
                &e.grad().unwrap(),
                1e-5,
            );
        }
    }
    let r = compiled.explain();
    assert_eq!(r.entries.len(), 1, "{r}");
    assert!(r.entries[0].graph_break.is_none(), "{r}");
}

/// The backward rules of linear (its saved `weight.t()`), of slices (written
/// into zeros) and of cross_entropy's class gather are traced as graph ops,
/// not refused as host work or unrecorded views.
#[test]
fn compiled_backward_of_linear_slices_and_class_gather() {
    let _s = serial();
    let x = randn(&[6, 5], 3);
    let w = randn(&[8, 5], 4);
    let b = randn(&[8], 5);
    let t = Tensor::from_vec(vec![0i64, 2, 1, 2, 0, 1], &[6]).unwrap();
    grads_match_eager(
        |xs| {
            let y = F::linear(&xs[0], &xs[1], Some(&xs[2]))?;
            let logits = y.narrow(1, 1, 3)?; // a slice: embed() backward
            let stepped = y.slice(1, Some(0), Some(8), 3)?.sum(None, false)?;
            let row = y.select(0, 2)?.sum(None, false)?;
            let ce = F::cross_entropy(&logits, &xs[3], None, kiln::ClassLossOpts::default())?;
            Ok(vec![ce.add(&stepped)?.add(&row)?])
        },
        &[x, w, b, t],
    );
}

/// `eval()` on a container (whose own `is_training()` is always true) must
/// miss the entry traced in train mode: BatchNorm switches to running stats.
#[test]
fn eval_after_train_misses_the_train_entry() {
    let _s = serial();
    let model = nn::Sequential::new()
        .add(nn::BatchNorm::new_2d(3))
        .add(nn::Activation::relu());
    let compiled = compile(&model);
    let x = randn(&[4, 3, 5, 5], 6);
    let _ng = kiln::autograd::no_grad();
    compiled.forward(&x).unwrap();
    model.eval();
    let got = compiled.forward(&x).unwrap();
    let want = model.forward(&x).unwrap();
    assert_close("eval output", &got, &want, 1e-5);
    assert_eq!(compiled.explain().entries.len(), 2);
}

#[test]
fn kiln_dump_train_prints_the_backward_half() {
    let _s = serial();
    let b = kiln::bench::dump_train("cnn", "backward").unwrap();
    assert!(b.contains("graph forward.backward("), "{b}");
    assert!(
        b.contains("conv2d_weight_grad") && b.contains("kernel 0"),
        "{b}"
    );
    // the digits MLP's Dropout mask is a random graph input, read by backward too
    let j = kiln::bench::dump_train("mlp", "backward").unwrap();
    assert!(j.contains("rand") && j.contains("tangent0"), "{j}");
    assert!(kiln::bench::dump_train("W1", "graph").is_err());
}

#[test]
fn eager_layers_before_and_after_a_compiled_module_get_their_gradients() {
    let _s = serial();
    let build = || -> (nn::Linear, nn::Sequential, nn::Linear) {
        kiln::manual_seed(9);
        (
            nn::Linear::new(6, 64, true).unwrap(),
            mlp().unwrap(),
            nn::Linear::new(10, 3, true).unwrap(),
        )
    };
    let (a0, m0, b0) = build();
    let (a1, m1, b1) = build();
    let compiled = compile(&m1);
    let x = randn(&[5, 6], 4);
    let eager = b0
        .forward(&m0.forward(&a0.forward(&x).unwrap()).unwrap())
        .unwrap();
    let mid = compiled.forward(&a1.forward(&x).unwrap()).unwrap();
    assert_eq!(mid.grad_fn().unwrap().name(), "CompiledBackward");
    let mixed = b1.forward(&mid).unwrap();
    eager.sum(None, false).unwrap().backward().unwrap();
    mixed.sum(None, false).unwrap().backward().unwrap();
    let same_grads = |what: &str, eager: Vec<Tensor>, mixed: Vec<Tensor>| {
        for (e, c) in eager.iter().zip(&mixed) {
            assert_close(what, &c.grad().unwrap(), &e.grad().unwrap(), 1e-5);
        }
    };
    same_grads("eager layer before", a0.parameters(), a1.parameters());
    same_grads("compiled module", m0.parameters(), m1.parameters());
    same_grads("eager layer after", b0.parameters(), b1.parameters());
}

#[test]
fn dropout_masks_are_drawn_per_call_as_eager_draws_them() {
    let _s = serial();
    let build = || {
        kiln::manual_seed(3);
        nn::Sequential::new()
            .add(nn::Linear::new(12, 32, true).unwrap())
            .add(nn::Activation::relu())
            .add(nn::Dropout::new(0.5).unwrap())
            .add(nn::Linear::new(32, 4, true).unwrap())
    };
    let (eager, model) = (build(), build());
    let compiled = compile(&model);
    let x = randn(&[8, 12], 5);
    let mut outs = vec![];
    for step in 0..3u64 {
        kiln::manual_seed(100 + step);
        let e = eager.forward(&x).unwrap();
        kiln::manual_seed(100 + step);
        let c = compiled.forward(&x).unwrap();
        assert_eq!(c.grad_fn().unwrap().name(), "CompiledBackward");
        assert_close(&format!("step {step} output"), &c, &e, 1e-5);
        e.sum(None, false).unwrap().backward().unwrap();
        c.sum(None, false).unwrap().backward().unwrap();
        for ((n, pe), (_, pc)) in eager
            .named_parameters()
            .iter()
            .zip(model.named_parameters())
        {
            assert_close(
                &format!("step {step} grad {n}"),
                &pc.grad().unwrap(),
                &pe.grad().unwrap(),
                1e-5,
            );
        }
        outs.push(c.to_f64_vec());
    }
    // a new mask every call (the seed differs), from one compiled entry
    assert_ne!(outs[0], outs[1]);
    let r = compiled.explain();
    assert_eq!(r.entries.len(), 1, "{r}");
    assert!(r.entries[0].graph_break.is_none(), "{r}");
}
