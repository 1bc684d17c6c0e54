//! The `layers` suite of the PyTorch fixtures (tests/fixtures/README.md,
//! "Layer cases"): MultiheadAttention, Transformer encoder/decoder layers,
//! PReLU, InstanceNorm2d, Upsample, PixelShuffle, Conv3d, Conv2d with reflect
//! padding and EmbeddingBag, each built from PyTorch's constructor arguments
//! with its `state_dict` loaded under PyTorch's key names. Forward, buffers
//! and the gradient of every parameter and input must match, eagerly
//! (`layers eager: P/T`) and through `kiln::compile` (`layers compiled: P/T`).
//! The recurrent classes are run by tests/layers_recurrent.rs.

mod fixture_support;

use fixture_support::layers::{is_recurrent, run_case};
use fixture_support::{load_suite, Fixtures};
use std::io::Write;

fn run(compiled: bool) {
    let fx = Fixtures::load();
    let cases = load_suite(&fx, "layers");
    assert!(!cases.is_empty(), "no layers cases in tests/fixtures");
    let (recurrent, ours): (Vec<_>, Vec<_>) = cases.iter().partition(|c| is_recurrent(c));
    let label = if compiled { "compiled" } else { "eager" };
    let mut failed = vec![];
    for c in &ours {
        if let Err(e) = run_case(&fx, c, compiled) {
            failed.push(format!("layers {label} {}: {e}", c.case));
        }
    }
    // Written to stderr directly (not eprintln!) so the summary shows when the test passes.
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "layers {label}: {}/{}",
        ours.len() - failed.len(),
        ours.len()
    );
    let _ = writeln!(
        err,
        "layers recurrent: {} cases handled in tests/layers_recurrent.rs",
        recurrent.len()
    );
    for f in &failed {
        let _ = writeln!(err, "{f}");
    }
    assert!(
        failed.is_empty(),
        "{} layers cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn layers_eager() {
    run(false);
}

#[test]
fn layers_compiled() {
    run(true);
}
