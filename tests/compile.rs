//! compile() end to end: capture, guards and recompiles, graph breaks,
//! kernel counts, explain(), the disk cache.

use kiln::compile::{compile, compile_fn, Compiled};
use kiln::nn::{self, Module, ModuleExt};
use kiln::{DType, Result, Tensor};

/// Tests here count kernel compiles, which are process-wide: run them one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(dims: &[usize], seed: u64) -> Tensor {
    kiln::bench::randn(dims, seed)
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.dims(), b.dims());
    for (i, (p, q)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "element {i}: {p} vs {q}"
        );
    }
}

fn w1(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let y = t[0].mul(&t[1])?.add(&t[2])?.gelu(false)?;
    Ok(vec![&(&y * 0.5) + &t[0]])
}

/// Kernel launches (JIT kernels) of one call.
fn launches(c: &Compiled, args: &[Tensor]) -> Vec<String> {
    let (out, ks) = kiln::runtime::record_kernels(|| c.call(args));
    out.unwrap();
    ks.into_iter().map(|k| k.name).collect()
}

#[test]
fn w1_compiles_to_one_kernel_and_matches_eager() {
    let _s = serial();
    let args = [randn(&[4096], 1), randn(&[4096], 2), randn(&[4096], 3)];
    let c = compile_fn("w1", w1);
    let first = c.call(&args).unwrap();
    let want = w1(&args).unwrap();
    assert_close(&first[0], &want[0], 1e-6);
    assert_eq!(launches(&c, &args), ["fused[mul+add+gelu+mul+add]"]);
    let r = c.explain();
    assert_eq!(r.entries.len(), 1);
    assert_eq!(r.entries[0].launches(), 1, "{r}");
}

#[test]
fn a_new_batch_size_replans_without_new_machine_code() {
    let _s = serial();
    let c = compile_fn("w1", w1);
    let mk = |n: usize| [randn(&[n, 8], 1), randn(&[n, 8], 2), randn(&[n, 8], 3)];
    c.call(&mk(4)).unwrap();
    let before = kiln::runtime::cache_stats().compiles;
    let out = c.call(&mk(16)).unwrap();
    assert_eq!(
        kiln::runtime::cache_stats().compiles,
        before,
        "no new kernels"
    );
    assert_close(&out[0], &w1(&mk(16)).unwrap()[0], 1e-6);
    let r = c.explain();
    assert_eq!(r.recompiles.len(), 1);
    assert_eq!(
        r.recompiles[0].to_string(),
        "input 0 dim 0: expected size 4, got 16 (batch dim: re-planned, kernels reused)"
    );
}

#[test]
fn past_the_recompile_limit_calls_run_eagerly_with_the_reason() {
    let _s = serial();
    let c = compile_fn("w1", w1).with_options(kiln::compile::CompileOptions {
        recompile_limit: 2,
        ..Default::default()
    });
    for k in 1..=4 {
        let args = [randn(&[2, k], 1), randn(&[2, k], 2), randn(&[2, k], 3)];
        let out = c.call(&args).unwrap();
        assert_close(&out[0], &w1(&args).unwrap()[0], 1e-6);
    }
    let r = c.explain();
    let why = r.gave_up.expect("gave up");
    assert!(why.contains("recompile limit (2)"), "{why}");
    assert!(why.contains("input 0 dim 1"), "{why}");
}

#[test]
fn reading_a_value_while_tracing_is_a_graph_break_listed_by_explain() {
    let _s = serial();
    let c = compile_fn("branchy", |t: &[Tensor]| {
        let s = t[0].sum(None, false)?;
        let y = if s.item()? > 0.0 {
            t[0].relu()?
        } else {
            t[0].neg()?
        };
        Ok(vec![y])
    });
    let x = randn(&[16], 4);
    let out = c.call(std::slice::from_ref(&x)).unwrap();
    let s: f64 = x.to_f64_vec().iter().sum();
    let want = if s > 0.0 {
        x.relu().unwrap()
    } else {
        x.neg().unwrap()
    };
    assert_close(&out[0], &want, 0.0);
    let r = c.explain();
    let b = r.entries[0].graph_break.clone().expect("a graph break");
    assert!(b.contains("item"), "{b}");
    assert!(r.to_string().contains("runs eagerly"), "{r}");
}

#[test]
fn a_module_compiles_with_its_parameters_as_inputs() {
    let _s = serial();
    kiln::manual_seed(3);
    let m = nn::Sequential::new()
        .add(nn::Linear::new(8, 16, true).unwrap())
        .add(nn::Activation::relu())
        .add(nn::Linear::new(16, 4, true).unwrap());
    m.eval();
    let c = compile(&m);
    let x = randn(&[5, 8], 7);
    let _ng = kiln::autograd::no_grad();
    let y = c.forward(&x).unwrap();
    assert_close(&y, &m.forward(&x).unwrap(), 1e-5);
    let g = c
        .dump(kiln::compile::Stage::Graph, std::slice::from_ref(&x))
        .unwrap();
    assert!(g.contains("\"0.weight\": f32[16,8]"), "{g}");
    // parameters are read on every call: an update shows in the next result
    let p = &m.parameters()[0];
    p.copy_(&(&p.clone() * 2.0)).unwrap();
    assert_close(&c.forward(&x).unwrap(), &m.forward(&x).unwrap(), 1e-5);
}

#[test]
fn with_grad_needed_the_output_carries_the_compiled_backward() {
    let _s = serial();
    let m = nn::Linear::new(3, 2, true).unwrap();
    let c = compile(&m);
    let x = randn(&[4, 3], 1);
    let y = c.forward(&x).unwrap();
    let node = y.grad_fn().expect("the result keeps a graph");
    assert_eq!(node.name(), "CompiledBackward");
    y.sum(None, false).unwrap().backward().unwrap();
    assert!(m.parameters().iter().all(|p| p.grad().is_some()));
    let r = c.explain();
    assert_eq!(r.entries.len(), 1, "{r}");
}

#[test]
fn a_second_compile_reads_the_plan_from_the_disk_cache() {
    let _s = serial();
    let args = [randn(&[64], 1), randn(&[64], 2), randn(&[64], 3)];
    compile_fn("w1", w1).call(&args).unwrap();
    let c = compile_fn("w1", w1);
    c.call(&args).unwrap();
    let r = c.explain();
    assert!(r.entries[0].times.from_disk_cache, "{r}");
}

#[test]
fn batch_norm_training_updates_a_copy_not_its_source() {
    let _s = serial();
    use kiln::functional as F;
    let x = randn(&[4, 3, 2, 2], 1);
    let f = |t: &[Tensor]| -> Result<Vec<Tensor>> {
        let (rm, rv) = (t[1].copy()?, t[2].copy()?);
        let y = F::batch_norm(&t[0], Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5)?;
        Ok(vec![y, rm, rv])
    };
    let stats = || {
        [
            Tensor::zeros(&[3], DType::F32),
            Tensor::full(&[3], 1.0, DType::F32),
        ]
    };
    let [rm, rv] = stats();
    let want = f(&[x.clone(), rm.clone(), rv.clone()]).unwrap();
    let c = compile_fn("bn", f);
    let [rm, rv] = stats();
    let got = c.call(&[x.clone(), rm.clone(), rv.clone()]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, w, 1e-6);
    }
    // the inputs are untouched, as eagerly; the returned copies hold the update
    assert_eq!(rm.to_f64_vec(), [0.0; 3]);
    assert_eq!(rv.to_f64_vec(), [1.0; 3]);
    assert!(c
        .dump(kiln::compile::Stage::Graph, &[x, rm, rv])
        .unwrap()
        .contains("cat("));
}

#[test]
fn shadow_mode_names_the_kernel_a_wrong_rewrite_broke() {
    let _s = serial();
    let f = |t: &[Tensor]| -> Result<Vec<Tensor>> {
        let s = t[0].add(&t[1])?.sum(None, false)?;
        let y = t[0].mul(&t[1])?.exp()?;
        Ok(vec![s, y])
    };
    let args = [randn(&[32], 1), randn(&[32], 2)];
    // the right rules: shadow mode is silent
    let good = compile_fn("f", f).with_shadow_check(1e-5);
    good.call(&args).unwrap();
    good.call(&args).unwrap();
    // a planted wrong rule: x * y => x
    let wrong = kiln_passes::rewrite::rules::rw("wrong-mul", "(mul ?x ?y)", "?x");
    let bad = compile_fn("f", f)
        .with_options(kiln::compile::CompileOptions {
            extra_rules: vec![wrong],
            ..Default::default()
        })
        .with_shadow_check(1e-5);
    let e = bad.call(&args).unwrap_err().to_string();
    assert!(e.contains("output 1 differs from eager"), "{e}");
    assert!(e.contains("first diverging kernel: #1 computing %"), "{e}");
    assert!(
        e.contains("= exp(") && e.contains("(traced %"),
        "names the kernel and its op: {e}"
    );
    assert!(e.contains("kernel exp("), "shows the kernel's IR: {e}");
}
