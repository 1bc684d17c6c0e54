//! A table of hostile inputs, one class of defect each: every one must be an
//! `Err` of the right kind whose message names the op (or file) and the
//! offending shape, dtype, key or index — with PyTorch's own words where
//! PyTorch defines them ("Target -1 is out of bounds.", "ZeroDivisionError",
//! "refer to a single memory location"). Prints `bad inputs: P/T`.

use kiln::functional as F;
use kiln::ir::BinaryOp;
use kiln::{ClassLossOpts, DType, Error, Tensor};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// A shape too big to count or to allocate.
    Alloc,
    /// Shapes or dims that do not fit the op.
    Shape,
    /// An index, target or padding_idx outside its range.
    Index,
    /// A value the op cannot take (integer division by zero).
    Value,
    /// An in-place write whose destination aliases itself or its source.
    Overlap,
    /// A dtype the op does not accept.
    Dtype,
    /// A broken or mismatched file (an `Error::Io` naming the file).
    File,
    /// A failing sample in a DataLoader.
    Data,
}

struct Case {
    class: Class,
    /// The op (for `Error::Op`) or the file name (for `Error::Io`) the error must name.
    names: &'static str,
    /// Substrings the message must contain.
    needles: Vec<String>,
    run: Box<dyn Fn() -> kiln::Result<()>>,
}

macro_rules! case {
    ($class:ident, $names:expr, [$($n:expr),*], $body:expr) => {
        Case {
            class: Class::$class,
            names: $names,
            needles: vec![$($n.to_string()),*],
            run: Box::new(move || $body),
        }
    };
}

#[path = "bad_input/aliasing.rs"]
mod aliasing;
#[path = "bad_input/files.rs"]
mod files;
#[path = "bad_input/indices.rs"]
mod indices;
#[path = "bad_input/loader.rs"]
mod loader;
#[path = "bad_input/memory.rs"]
mod memory;
#[path = "bad_input/pytorch_values.rs"]
mod pytorch_values;
#[path = "bad_input/shapes.rs"]
mod shapes;
#[path = "bad_input/support.rs"]
mod support;

use support::{t, ti, x23};

fn cases() -> Vec<Case> {
    [
        memory::cases(),
        shapes::cases(),
        indices::cases(),
        aliasing::cases(),
        files::cases(),
        loader::cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[test]
fn bad_inputs_are_clear_errors() {
    let cases = cases();
    let total = cases.len();
    let mut failures = vec![];
    for (i, c) in cases.iter().enumerate() {
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (c.run)()));
        let verdict = match got {
            Err(p) => Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
            Ok(Ok(())) => Err("succeeded".to_string()),
            Ok(Err(e)) => {
                let msg = e.to_string();
                let named = match (&e, c.class) {
                    (Error::Io { path, .. }, Class::File) => path.ends_with(c.names),
                    (Error::Op { op, .. }, k) if k != Class::File => op == c.names,
                    _ => false,
                };
                let missing: Vec<&String> = c
                    .needles
                    .iter()
                    .filter(|n| !msg.contains(n.as_str()))
                    .collect();
                if !named {
                    Err(format!(
                        "wrong kind or name (want {:?} `{}`): {msg}",
                        c.class, c.names
                    ))
                } else if !missing.is_empty() {
                    Err(format!("missing {missing:?}: {msg}"))
                } else {
                    Ok(())
                }
            }
        };
        if let Err(why) = verdict {
            failures.push(format!("  #{i} {:?} {}: {why}", c.class, c.names));
        }
    }
    let passed = total - failures.len();
    println!("bad inputs: {passed}/{total}");
    assert!(total >= 80, "the table has {total} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The near misses of the table are accepted: PyTorch allows them too.
#[test]
fn near_misses_are_accepted() {
    let a = t(vec![0.0, 1.0, 2.0, 3.0], &[4]);
    a.copy_(&a).unwrap(); // the very same elements
    let m = x23();
    m.select(1, 0)
        .unwrap()
        .copy_(&m.select(1, 1).unwrap())
        .unwrap(); // interleaved columns
    assert_eq!(m.to_f64_vec(), vec![1.0, 1.0, 2.0, 4.0, 4.0, 5.0]);
    let l = F::cross_entropy(
        &x23(),
        &ti(vec![-1, 0], &[2]),
        None,
        ClassLossOpts {
            ignore_index: -1,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(l.item().unwrap().is_finite());
    kiln::nn::Embedding::new(10, 4, Some(-10)).unwrap();
    assert_eq!(
        ti(vec![-7], &[1])
            .binary(BinaryOp::FloorDiv, &ti(vec![2], &[1]))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![-4]
    );
    // float division by 0 is not an error, as in PyTorch
    assert!(t(vec![1.0], &[1])
        .binary(BinaryOp::FloorDiv, &t(vec![0.0], &[1]))
        .is_ok());
    assert!(
        Tensor::try_zeros(&[1 << 32, 1 << 32, 0], DType::F32)
            .unwrap()
            .numel()
            == 0
    );
}
