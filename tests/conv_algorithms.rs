//! Every CPU conv algorithm through the PyTorch conv fixtures (forward and
//! gradient cases) at the manifest's tolerances, forced with
//! `kiln::backends::cpu::with_algorithm`; prints `ALGO forward: P/T (ran on
//! N cases)` and fails unless every case passes and each algorithm ran.

mod fixture_support;

use fixture_support::{backward, load_suite, ops, Fixtures};
use kiln::backends::cpu::{take_last_run, with_algorithm, ConvAlgo};

#[test]
fn every_conv_algorithm_passes_the_conv_fixtures() {
    let fx = Fixtures::load();
    let forward = load_suite(&fx, "conv");
    let grads = backward::grad_cases(&fx, "conv");
    let mut failed = vec![];
    for algo in ConvAlgo::ALL {
        let (mut pass, mut ran) = (0, 0);
        for c in forward.iter().filter(|c| !c.expect_error) {
            take_last_run();
            let r = with_algorithm(algo, || {
                let inputs = fx.inputs(c)?;
                let outs = ops::run(c, &inputs).map_err(|e| e.to_string())?;
                fixture_support::check_outputs(&fx, c, &outs, &inputs)
            });
            ran += usize::from(take_last_run() == Some(algo));
            match r {
                Ok(()) => pass += 1,
                Err(e) => failed.push(format!("{algo:?} forward {}: {e}", c.case)),
            }
        }
        let (mut gpass, mut gran) = (0, 0);
        for c in &grads {
            take_last_run();
            let r = with_algorithm(algo, || backward::run_case(&fx, c));
            gran += usize::from(take_last_run() == Some(algo));
            match r {
                Ok(()) => gpass += 1,
                Err(e) => failed.push(format!("{algo:?} backward {}: {e}", c.case)),
            }
        }
        let total = forward.iter().filter(|c| !c.expect_error).count();
        println!(
            "{} forward: {pass}/{total} (ran on {ran}), backward: {gpass}/{} (ran on {gran})",
            algo.name(),
            grads.len()
        );
        if algo != ConvAlgo::Gemm1x1 {
            assert!(ran > 0, "{algo:?} computed none of the conv fixtures");
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `x * w` (3x3, padding 1) by `algo`.
fn conv_by(algo: ConvAlgo, x: &kiln::Tensor, w: &kiln::Tensor) -> Vec<f32> {
    let p = kiln::ir::op::conv::ConvParams {
        padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
        ..Default::default()
    };
    let _no_grad = kiln::autograd::no_grad();
    let y = with_algorithm(algo, || kiln::functional::conv2d(x, w, None, &p)).unwrap();
    assert_eq!(take_last_run(), Some(algo));
    y.to_vec::<f32>().unwrap()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
}

#[test]
fn packed_weights_follow_an_in_place_change_of_the_parameter() {
    let mut g = kiln::random::Generator::new(5);
    let x = kiln::random::randn(&[2, 4, 9, 9], Some(&mut g));
    // a parameter (requires grad): its packed form is cached per version
    let w = kiln::random::randn(&[6, 4, 3, 3], Some(&mut g)).requires_grad_(true);
    let a = conv_by(ConvAlgo::WinogradF2x2, &x, &w);
    assert!(close(&a, &conv_by(ConvAlgo::Im2colGemm, &x, &w)));
    // a second call reuses the packed weights: same result
    assert_eq!(a, conv_by(ConvAlgo::WinogradF2x2, &x, &w));
    // change the weight in place (version bump): Winograd must repack
    let v0 = w.version();
    {
        let _no_grad = kiln::autograd::no_grad();
        w.copy_(&kiln::random::randn(&[6, 4, 3, 3], Some(&mut g)))
            .unwrap();
    }
    assert!(w.version() > v0);
    let b = conv_by(ConvAlgo::WinogradF2x2, &x, &w);
    assert!(!close(&a, &b), "the new weight changed nothing");
    assert!(close(&b, &conv_by(ConvAlgo::Im2colGemm, &x, &w)));
}

#[test]
fn explain_names_each_conv_algorithm() {
    let mut g = kiln::random::Generator::new(6);
    let w = kiln::random::randn(&[8, 4, 3, 3], Some(&mut g));
    let p = kiln::ir::op::conv::ConvParams {
        padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
        ..Default::default()
    };
    let f = kiln::compile::compile_fn("conv_explain", |xs: &[kiln::Tensor]| {
        Ok(vec![kiln::functional::conv2d(&xs[0], &w, None, &p)?.relu()?])
    });
    let x = kiln::random::randn(&[3, 4, 17, 13], Some(&mut g));
    f.call(&[x]).unwrap();
    let r = f.explain();
    let lines = &r.entries[0].conv_algorithms;
    println!("{r}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("conv2d [3,4,17,13] * [8,4,3,3]: "),
        "{}",
        lines[0]
    );
    // compiled graphs time their convs: the choice is remembered
    assert!(lines[0].ends_with("(timed)"), "{}", lines[0]);
    assert!(ConvAlgo::ALL.iter().any(|a| lines[0].contains(a.name())));
    assert!(r.to_string().contains("conv algorithm: conv2d"));
}

/// A compiled conv keeps the remembered algorithm on every call, the warm
/// calls that replay its tiled epilogue too (they once ran outside the
/// compiled scope, so benchmarking was off and the heuristic ran instead).
#[test]
fn a_compiled_conv_runs_its_remembered_algorithm_on_every_call() {
    use kiln::ir::op::conv::{conv_geometry, ConvParams, Padding};
    use kiln::runtime::externs::conv::select;
    let p = ConvParams {
        padding: Padding::Explicit(vec![1]),
        ..Default::default()
    };
    // a shape no other test uses, so its remembered choice is this test's;
    // 9 x 64 x 120 outputs per sample (over MIN_TILED_SAMPLE): a tiled epilogue
    let (xs, ws) = ([2, 5, 64, 120], [9, 5, 3, 3]);
    let g = conv_geometry("conv2d", &xs, &ws, None, &p).unwrap();
    let pinned = ConvAlgo::WinogradF2x2;
    assert_ne!(
        select::heuristic(&g),
        pinned,
        "the pin must differ from the heuristic"
    );
    select::remember(&select::key(&g, "f32"), pinned);
    let mut r = kiln::random::Generator::new(7);
    let w = kiln::random::randn(&ws, Some(&mut r));
    let b = kiln::random::randn(&[9], Some(&mut r));
    let f = kiln::compile::compile_fn("conv_pinned", |xs: &[kiln::Tensor]| {
        let y = kiln::functional::conv2d(&xs[0], &w, None, &p)?;
        Ok(vec![y.add(&b.reshape(&[1, 9, 1, 1])?)?.relu()?])
    });
    let x = kiln::random::randn(&xs, Some(&mut r));
    for call in 0..4 {
        take_last_run();
        f.call(&[x.clone()]).unwrap();
        assert_eq!(take_last_run(), Some(pinned), "call {call}");
    }
}

/// A compiled graph's weight computed from parameters (a scale folded in, as
/// BatchNorm folds) is hoisted, and its packed form is made once and reused
/// on later calls; an in-place change of a parameter repacks it, and the
/// output follows the new weight.
#[test]
fn a_hoisted_conv_weight_is_packed_once_per_parameter_version() {
    use kiln::runtime::externs::packed::packs_on_this_thread;
    let p = kiln::ir::op::conv::ConvParams {
        padding: kiln::ir::op::conv::Padding::Explicit(vec![1]),
        ..Default::default()
    };
    let mut r = kiln::random::Generator::new(8);
    let w = kiln::random::randn(&[6, 4, 3, 3], Some(&mut r)).requires_grad_(true);
    let s = kiln::random::randn(&[6, 1, 1, 1], Some(&mut r)).requires_grad_(true);
    let x = kiln::random::randn(&[2, 4, 10, 10], Some(&mut r));
    let f = kiln::compile::compile_fn("conv_hoisted_weight", |xs: &[kiln::Tensor]| {
        Ok(vec![kiln::functional::conv2d(
            &xs[0],
            &w.mul(&s)?,
            None,
            &p,
        )?])
    });
    let eager = || {
        let _no_grad = kiln::autograd::no_grad();
        let y = kiln::functional::conv2d(&x, &w.mul(&s).unwrap(), None, &p).unwrap();
        y.to_vec::<f32>().unwrap()
    };
    let run = || {
        let before = packs_on_this_thread();
        let y = with_algorithm(ConvAlgo::WinogradF2x2, || f.call(&[x.clone()])).unwrap();
        let y = y[0].to_vec::<f32>().unwrap();
        (y, packs_on_this_thread() - before)
    };
    let (first, _) = run();
    assert!(close(&first, &eager()));
    for call in 1..3 {
        let (y, packs) = run();
        assert_eq!(packs, 0, "call {call} packed the hoisted weight again");
        assert_eq!(y, first, "call {call}");
    }
    {
        let _no_grad = kiln::autograd::no_grad();
        s.copy_(&kiln::random::randn(&[6, 1, 1, 1], Some(&mut r)))
            .unwrap();
    }
    let (y, packs) = run();
    assert_eq!(packs, 1, "the changed weight was packed {packs} times");
    assert!(!close(&y, &first), "the new scale changed nothing");
    assert!(close(&y, &eager()));
}
