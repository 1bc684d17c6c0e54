//! Out-of-range indices of the gather/scatter family raise the same clear
//! error eagerly and through `compile` (first call, which traces, and later
//! calls of the cached entry, whose index values are new): the op's name
//! and the offending index against the dim's size.

use kiln::compile::compile_fn;
use kiln::{functional as F, Result, Tensor};

type IndexOp = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// Each op with the words its error must contain for index 7 into a dim of 4.
fn ops() -> Vec<(&'static str, IndexOp)> {
    vec![
        ("gather", |x, i| {
            x.gather(1, &i.reshape(&[1, -1])?.expand(&[3, 2])?)
        }),
        ("index_select", |x, i| x.index_select(1, i)),
        ("scatter_add", |x, i| {
            let idx = i.reshape(&[1, -1])?.expand(&[3, 2])?;
            x.scatter_add(1, &idx, &x.narrow(1, 0, 2)?)
        }),
        ("scatter", |x, i| {
            let idx = i.reshape(&[1, -1])?.expand(&[3, 2])?;
            x.scatter(1, &idx, &x.narrow(1, 0, 2)?)
        }),
        ("index_add", |x, i| {
            x.index_add(1, i, &x.narrow(1, 0, 2)?, 1.0)
        }),
        ("embedding", |x, i| F::embedding(i, &x.t()?, None)),
    ]
}

fn expect_bounds_error(what: &str, op: &str, r: Result<Vec<Tensor>>) {
    let e = match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{what} {op}: an out-of-range index (7 into 4) gave no error"),
    };
    assert!(
        e.contains(op),
        "{what} {op}: error does not name the op: {e}"
    );
    assert!(
        e.contains('7') && e.contains('4'),
        "{what} {op}: error does not name index 7 and size 4: {e}"
    );
}

#[test]
fn out_of_range_indices_error_eager_and_compiled() {
    let x = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 4]).unwrap();
    let good = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let bad = Tensor::from_vec(vec![1i64, 7], &[2]).unwrap();
    for (op, f) in ops() {
        expect_bounds_error("eager", op, f(&x, &bad).map(|t| vec![t]));
        // traced with the bad index: the first compiled call must fail
        let c = compile_fn(op, move |xs: &[Tensor]| Ok(vec![f(&xs[0], &xs[1])?]));
        expect_bounds_error("compiled (1st call)", op, c.call(&[x.clone(), bad.clone()]));
        // traced with a good index, then called with a bad one: the cached
        // graph must check the new values too
        let c = compile_fn(op, move |xs: &[Tensor]| Ok(vec![f(&xs[0], &xs[1])?]));
        let want = f(&x, &good).unwrap();
        let got = c.call(&[x.clone(), good.clone()]).unwrap();
        assert_eq!(got[0].to_f64_vec(), want.to_f64_vec(), "{op}: good index");
        expect_bounds_error("compiled (cached)", op, c.call(&[x.clone(), bad.clone()]));
    }
}
