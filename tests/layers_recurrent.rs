//! The recurrent cases of the `layers` fixture suite (nn.LSTM: 1/2 layers,
//! batch_first, bidirectional, with and without (h0, c0), proj_size,
//! unbatched; GRU; RNN tanh and relu; LSTMCell, GRUCell, RNNCell) through
//! kiln's modules: outputs and the gradient of every parameter and input
//! against PyTorch, eager and under `kiln::compile` (compiled forward and
//! backward, compared with eager too). Prints `layers recurrent eager: P/T`
//! and `layers recurrent compiled: P/T`; fails on any mismatch.

#[allow(dead_code)]
mod fixture_support;

use fixture_support::layers_recurrent::{self as lr, same_run};
use kiln::nn::{GRUCell, LSTMCell, Module, RnnOptions, GRU, LSTM, RNN};
use kiln::{DType, Tensor};

fn suite(compiled: bool) {
    let fx = lr::load();
    let cases = lr::cases(&fx);
    assert_eq!(cases.len(), 16, "the recurrent layers cases");
    let mut failures = vec![];
    for c in &cases {
        let result = lr::run_case(&fx, c, compiled).and_then(|run| {
            if !compiled {
                return Ok(());
            }
            let eager = lr::run_case(&fx, c, false)?;
            same_run(&eager, &run, 1e-6).map_err(|e| format!("compiled vs eager: {e}"))
        });
        if let Err(e) = result {
            failures.push(format!("{}: {e}", c.case));
        }
    }
    let mode = if compiled { "compiled" } else { "eager" };
    println!(
        "layers recurrent {mode}: {}/{}",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn layers_recurrent_eager() {
    suite(false);
}

#[test]
fn layers_recurrent_compiled() {
    suite(true);
}

fn err(r: kiln::Result<Vec<Tensor>>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {} outputs", v.len()),
        Err(e) => e.to_string(),
    }
}

/// Bad shapes and arguments are errors naming the layer and the shapes.
#[test]
fn recurrent_bad_input_is_an_error() {
    let lstm = LSTM::new(3, 4, RnnOptions::default()).unwrap();
    let x = Tensor::zeros(&[5, 2, 3], DType::F32);
    let wrong_features = Tensor::zeros(&[5, 2, 6], DType::F32);
    let e = err(lstm.forward_many(&[Some(&wrong_features)]));
    assert!(
        e.contains("LSTM") && e.contains("input_size=3") && e.contains("[5,2,6]"),
        "{e}"
    );
    let h0 = Tensor::zeros(&[1, 3, 4], DType::F32);
    let e = err(lstm.forward_many(&[Some(&x), Some(&h0), Some(&h0)]));
    assert!(
        e.contains("h_0") && e.contains("[1,3,4]") && e.contains("[1,2,4]"),
        "{e}"
    );
    let h0 = Tensor::zeros(&[1, 2, 4], DType::F32);
    let e = err(lstm.forward_many(&[Some(&x), Some(&h0), None]));
    assert!(e.contains("both or neither"), "{e}");
    let e = err(lstm.forward_many(&[Some(&Tensor::zeros(&[1, 5, 2, 3], DType::F32))]));
    assert!(e.contains("LSTM") && e.contains("3-D"), "{e}");
    let e = err(lstm.forward_many(&[Some(&Tensor::zeros(&[0, 2, 3], DType::F32))]));
    assert!(e.contains("empty"), "{e}");
    let e = err(lstm.forward_many(&[None]));
    assert!(e.contains("input is missing"), "{e}");

    let gru = GRU::new(3, 4, RnnOptions::default()).unwrap();
    let e = err(gru.forward_many(&[Some(&x), Some(&h0), Some(&h0)]));
    assert!(e.contains("GRU") && e.contains("1 state"), "{e}");
    let cell = LSTMCell::new(3, 4, true).unwrap();
    let e = err(cell.forward_many(&[Some(&x)]));
    assert!(e.contains("LSTMCell") && e.contains("[5,2,3]"), "{e}");
    let gcell = GRUCell::new(3, 4, true).unwrap();
    let h = Tensor::zeros(&[2, 5], DType::F32);
    let e = err(gcell.forward_many(&[Some(&x.select(0, 0).unwrap()), Some(&h)]));
    assert!(
        e.contains("GRUCell") && e.contains("[2,5]") && e.contains("[2,4]"),
        "{e}"
    );

    let proj = RnnOptions {
        proj_size: 4,
        ..RnnOptions::default()
    };
    let e = LSTM::new(3, 4, proj.clone()).err().unwrap().to_string();
    assert!(e.contains("proj_size=4"), "{e}");
    assert!(GRU::new(
        3,
        4,
        RnnOptions {
            proj_size: 2,
            ..RnnOptions::default()
        }
    )
    .is_err());
    let bad = RnnOptions {
        nonlinearity: "gelu".into(),
        ..RnnOptions::default()
    };
    assert!(RNN::new(3, 4, bad.clone())
        .err()
        .unwrap()
        .to_string()
        .contains("gelu"));
    assert!(LSTM::new(
        3,
        4,
        RnnOptions {
            nonlinearity: "relu".into(),
            ..RnnOptions::default()
        }
    )
    .is_err());
    let e = LSTM::new(
        3,
        4,
        RnnOptions {
            dropout: 1.5,
            ..RnnOptions::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("1.5"), "{e}");
}
