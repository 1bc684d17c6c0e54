//! What LSTM and GRU launch, asserted structurally. Eagerly (the
//! profiler's extern events): every time step's input projection is ONE
//! GEMM over the whole `(T, B, IN)` sequence, then one `(B, H)` GEMM per
//! step. Compiled (explain's kernel list, with a nonzero initial state so
//! no hidden product folds away): those T + 1 GEMMs, one fused kernel per
//! step's gate math (an LSTM's storing both h_t and c_t), and the `cat`s
//! that assemble the outputs.

use kiln::compile::{compile_fn, CompileOptions};
use kiln::nn::{Module, RnnOptions, GRU, LSTM};
use kiln::profiler::{self, Category};
use kiln::Tensor;

const T: usize = 5;
const B: usize = 3;
const IN: usize = 8;
const HID: usize = 16;

fn opts() -> RnnOptions {
    RnnOptions {
        batch_first: true,
        ..Default::default()
    }
}

/// The input and the initial state (`h0`, and `c0` for an LSTM).
fn inputs(lstm: bool) -> Vec<Tensor> {
    let mut v = vec![
        kiln::bench::randn(&[B, T, IN], 7),
        kiln::bench::randn(&[1, B, HID], 8),
    ];
    if lstm {
        v.push(kiln::bench::randn(&[1, B, HID], 9));
    }
    v
}

fn forward(m: &dyn Module, t: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    let ins: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
    m.forward_many(&ins)
}

/// The operand shapes of the eager GEMMs one forward launches, in order.
fn eager_gemms(m: &dyn Module, t: &[Tensor]) -> Vec<Vec<Vec<usize>>> {
    let _no = kiln::autograd::no_grad();
    forward(m, t).unwrap(); // warm the kernel cache
    let (_, p) = profiler::profile(|| forward(m, t).unwrap());
    let me = profiler::current_thread_id();
    p.events()
        .iter()
        .filter(|e| e.tid == me && e.category == Category::Extern && e.name == "matmul")
        .map(|e| e.shapes.clone())
        .collect()
}

/// Explain's per-call kernels of the compiled forward (checked against eager).
fn compiled_kernels(m: &dyn Module, t: &[Tensor]) -> Vec<String> {
    let c = compile_fn("rnn", |t: &[Tensor]| forward(m, t)).with_options(CompileOptions {
        disk_cache: false,
        ..Default::default()
    });
    let _no = kiln::autograd::no_grad();
    let got = c.call(t).unwrap();
    for (g, w) in got.iter().zip(forward(m, t).unwrap()) {
        let diff = g
            .sub(&w)
            .unwrap()
            .abs()
            .unwrap()
            .amax(None, false)
            .unwrap()
            .item()
            .unwrap();
        assert!(diff < 1e-5, "compiled vs eager: {diff}");
    }
    let r = c.explain();
    let e = &r.entries[0];
    assert!(e.graph_break.is_none(), "{r}");
    e.kernels.clone()
}

/// Checks the GEMMs; returns the compiled gate kernels (neither GEMM nor cat).
fn check_gemms(name: &str, m: &dyn Module, t: &[Tensor]) -> Vec<String> {
    let gemms = eager_gemms(m, t);
    println!("{name} eager GEMMs (operand shapes): {gemms:?}");
    assert_eq!(gemms.len(), T + 1, "{name}: {gemms:?}");
    let whole = gemms.iter().filter(|s| s[0] == [T, B, IN]).count();
    assert_eq!(
        whole, 1,
        "{name}: one input projection over the sequence: {gemms:?}"
    );
    let kernels = compiled_kernels(m, t);
    println!("{name} compiled kernels: {kernels:?}");
    let linear = kernels.iter().filter(|k| k.starts_with("linear")).count();
    assert_eq!(
        linear,
        T + 1,
        "{name}: input projection + one hidden GEMM per step: {kernels:?}"
    );
    kernels
        .into_iter()
        .filter(|k| !k.starts_with("linear") && k != "cat")
        .collect()
}

#[test]
fn gru_projects_inputs_once_and_fuses_each_step() {
    kiln::manual_seed(0);
    let gru = GRU::new(IN, HID, opts()).unwrap();
    let gates = check_gemms("gru", &gru, &inputs(false));
    assert_eq!(gates.len(), T, "gru: one gate kernel per step: {gates:?}");
    assert!(gates.iter().all(|g| g.starts_with("fused[")), "{gates:?}");
}

#[test]
fn lstm_projects_inputs_once_and_fuses_each_step() {
    kiln::manual_seed(0);
    let lstm = LSTM::new(IN, HID, opts()).unwrap();
    let gates = check_gemms("lstm", &lstm, &inputs(true));
    // one kernel per step storing both h_t and c_t (c_t is stored where it
    // is computed, not recomputed by later steps), all of one size
    assert_eq!(gates.len(), T, "lstm: one gate kernel per step: {gates:?}");
    assert!(
        gates
            .iter()
            .all(|g| g.starts_with("fused[") && g.ends_with("stores 2")),
        "{gates:?}"
    );
    assert!(gates.iter().all(|g| *g == gates[0]), "{gates:?}");
    assert_eq!(gates[0].matches("tanh").count(), 2, "{gates:?}");
}

#[test]
fn lstm_step_kernel_stores_c_and_h_from_one_body() {
    kiln::manual_seed(0);
    let lstm = LSTM::new(IN, HID, opts()).unwrap();
    let t = inputs(true);
    let c = compile_fn("lstm", |t: &[Tensor]| forward(&lstm, t)).with_options(CompileOptions {
        disk_cache: false,
        ..Default::default()
    });
    let _no = kiln::autograd::no_grad();
    c.call(&t).unwrap();
    // a warm call replays the recorded launches
    let (out, ks) = kiln::runtime::record_kernels(|| c.call(&t));
    out.unwrap();
    let two: Vec<_> = ks.iter().filter(|k| k.outputs() == 2).collect();
    let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(two.len(), T, "one two-output kernel per step: {names:?}");
    assert!(two.iter().all(|k| k.to_text() == two[0].to_text()));
    insta::assert_snapshot!(two[0].to_text());
}
