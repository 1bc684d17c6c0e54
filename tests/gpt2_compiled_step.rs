//! A compiled GPT-2 training step does the work of one step, not of a
//! compile: after the first steps, a step traces nothing, compiles no
//! machine code and launches a bounded number of kernels (issue #14: the
//! compiled GPT2 bench step ran 9x slower than eager with no recompile
//! reported). Counters, not clocks: no timing asserts here.

use kiln::bench::gpt2;
use kiln::bench::train::{step, FlatLogits};
use kiln::models::gpt2::Gpt2LMHeadModel;
use kiln::nn::ModuleExt;
use kiln::optim::{AdamConfig, AdamW};
use kiln::random::{randint, Generator};
use kiln::Tensor;

/// A 2-layer GPT-2 (the bench's architecture, smaller) on 2 x 32 tokens,
/// trained as the GPT2 bench row trains it: compiled model, eager
/// cross-entropy, fused AdamW.
#[test]
fn warm_compiled_gpt2_steps_trace_and_compile_nothing_and_launch_a_bounded_number() {
    let cfg = kiln::models::catalog::gpt2_tiny_config();
    kiln::manual_seed(1);
    let model = FlatLogits {
        lm: Gpt2LMHeadModel::new(&cfg).unwrap(),
    };
    model.train();
    let adam = AdamConfig {
        lr: 1e-3,
        weight_decay: 0.01,
        fused: true,
        ..AdamConfig::default()
    };
    let mut opt = AdamW::with_params(model.parameters(), adam).unwrap();
    let n_params = model.parameters().len();
    let ids = randint(0, 256, &[2, 32], Some(&mut Generator::new(3))).unwrap();
    let next = randint(0, 256, &[64], Some(&mut Generator::new(4))).unwrap();
    let c = kiln::compile::compile(&model);
    let fwd = |x: &Tensor| c.forward(x);
    // the first step traces and compiles, the second records the launch lists
    for _ in 0..3 {
        step(&fwd, &mut opt, &ids, &next).unwrap();
    }
    let report = c.explain();
    assert_eq!(report.entries.len(), 1, "{report}");
    assert!(report.recompiles.is_empty(), "{report}");
    let entry = &report.entries[0];
    assert!(entry.graph_break.is_none(), "{report}");
    let backward = entry.backward.as_ref().expect("a training entry");
    // the backward's values made from constants stay cached between calls,
    // so warm backward calls get to record a launch list (a fresh cache
    // per call kept a backward holding such values from ever recording it).
    // FIXME: it then runs node by node,
    // "two inputs share a storage" (two saved views of one tensor); this
    // becomes `Some(Ok(_))` when the recorder binds such inputs.
    assert!(
        backward.launch_list.is_some(),
        "warm backward calls never recorded: {report}"
    );
    // a narrow's backward (q, k, v out of c_attn) is a cat, not a gather of
    // the whole gradient one element at a time
    assert!(
        !backward.kernels.iter().any(|k| k.contains("index_select")),
        "{report}"
    );
    // per step: each compiled kernel once, plus the eager loss, its
    // backward and one fused AdamW kernel per parameter (with slack for
    // eager kernels split in several launches)
    let bound = 2 * (entry.kernels.len() + backward.kernels.len()) + 4 * n_params + 64;
    let mut launched = vec![];
    for _ in 0..2 {
        let (traces, stats) = (
            kiln::compile::trace::traces_run(),
            kiln::runtime::cache_stats(),
        );
        let (r, kernels) = kiln::runtime::record_kernels(|| step(&fwd, &mut opt, &ids, &next));
        r.unwrap();
        let after = kiln::runtime::cache_stats();
        assert_eq!(
            kiln::compile::trace::traces_run(),
            traces,
            "a warm step traced"
        );
        assert_eq!(
            after.compiles, stats.compiles,
            "a warm step compiled machine code"
        );
        assert!(
            kernels.len() <= bound,
            "a warm step launched {} kernels (bound {bound})",
            kernels.len()
        );
        // KernelIR is built at most once per launch (never per element)
        assert!(after.specialised - stats.specialised <= kernels.len());
        launched.push(kernels.len());
    }
    assert_eq!(
        launched[0], launched[1],
        "warm steps launch the same kernels"
    );
    assert_eq!(c.explain().entries.len(), 1);
}

/// `KILN_GPT2_PROFILE=1 cargo test --test gpt2_compiled_step profile -- --ignored --nocapture`:
/// the bench's GPT2 step, eager and compiled, under the profiler (a table
/// of the top ops of 2 warm steps each).
#[test]
#[ignore]
fn profile_bench_gpt2_step() {
    let w = gpt2();
    for compiled in [false, true] {
        let (model, mut opt) = (w.build)(compiled).unwrap();
        model.train();
        let c = kiln::compile::compile(model.as_ref());
        let fwd = |x: &Tensor| match compiled {
            true => c.forward(x),
            false => model.forward(x),
        };
        for _ in 0..2 {
            step(&fwd, &mut *opt, &w.x, &w.y).unwrap();
        }
        let t = std::time::Instant::now();
        let (r, p) = kiln::profiler::profile(|| {
            for _ in 0..2 {
                step(&fwd, &mut *opt, &w.x, &w.y).unwrap();
            }
        });
        let () = r;
        println!(
            "=== compiled {compiled}: 2 steps {:.1} ms\n{}",
            t.elapsed().as_secs_f64() * 1e3,
            p.table_top(false, 40)
        );
        if compiled {
            println!("{}", c.explain());
        }
    }
}
