//! Every pointwise op of the op table (`ir/src/op/table.rs`), iterated from
//! the table itself: compiled inside a chain of pointwise ops it fuses into
//! one kernel (as relu does), and matches the eager result.

use kiln::ir::op::Domain;
use kiln::ir::{BinaryOp, DType, UnaryOp};
use kiln::{Scalar, Tensor};

/// Inputs in every op's domain: values inside (0, 1) (positive, inside the
/// unit interval, capped), integers for the bitwise ops, bools for the
/// logical ones.
fn input(domain: Domain, seed: usize) -> Tensor {
    let n = 24;
    match domain {
        Domain::Integer => {
            let v: Vec<i64> = (0..n)
                .map(|i| (i as i64 * 7 + seed as i64) % 13 - 6)
                .collect();
            Tensor::from_vec(v, &[4, 6]).unwrap()
        }
        Domain::Bool => {
            let v: Vec<i64> = (0..n).map(|i| ((i + seed) % 3 == 0) as i64).collect();
            Tensor::from_vec(v, &[4, 6])
                .unwrap()
                .to_dtype(DType::Bool)
                .unwrap()
        }
        _ => {
            let v: Vec<f32> = (0..n)
                .map(|i| 0.05 + 0.9 * (((i * 5 + seed * 3) % n) as f32 + 0.5) / n as f32)
                .collect();
            Tensor::from_vec(v, &[4, 6]).unwrap()
        }
    }
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// `x * 1`, then the op, then `+ 0` (as i64 for integer and bool results):
/// three pointwise ops that must come out as one kernel.
fn chain(
    xs: &[Tensor],
    op: &(dyn Fn(&[Tensor]) -> kiln::Result<Tensor> + Sync),
) -> kiln::Result<Tensor> {
    let scaled: Vec<Tensor> = xs
        .iter()
        .map(|x| {
            if x.dtype() == DType::Bool {
                Ok(x.clone())
            } else {
                x.binary_scalar(BinaryOp::Mul, Scalar::Int(1), false)
            }
        })
        .collect::<kiln::Result<_>>()?;
    let y = op(&scaled)?;
    y.binary_scalar(BinaryOp::Add, Scalar::Int(0), false)
}

fn check(name: &str, inputs: &[Tensor], op: &(dyn Fn(&[Tensor]) -> kiln::Result<Tensor> + Sync)) {
    let eager = chain(inputs, op).unwrap_or_else(|e| panic!("{name} eager: {e}"));
    let f = kiln::compile::compile_fn(name, |xs: &[Tensor]| Ok(vec![chain(xs, op)?]));
    let out = f
        .call(inputs)
        .unwrap_or_else(|e| panic!("{name} compiled: {e}"));
    let entry = &f.explain().entries[0];
    assert!(
        entry.graph_break.is_none(),
        "{name}: {:?}",
        entry.graph_break
    );
    assert_eq!(
        entry.kernels.len(),
        1,
        "{name}: kernels {:?}",
        entry.kernels
    );
    let (a, b) = (as_f64(&out[0]), as_f64(&eager));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let same = (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-6 * (1.0 + y.abs());
        assert!(same, "{name}: element {i}: compiled {x} vs eager {y}");
    }
}

#[test]
fn every_unary_op_of_the_table_fuses_into_one_kernel() {
    for u in UnaryOp::EXAMPLES {
        let x = input(u.domain(), 0);
        check(&u.to_string(), &[x], &|xs| xs[0].unary(u));
    }
}

#[test]
fn every_binary_op_of_the_table_fuses_into_one_kernel() {
    for b in BinaryOp::ALL {
        let x = input(b.domain(), 0);
        let y = input(b.domain(), 1);
        check(b.name(), &[x, y], &|xs| xs[0].binary(b, &xs[1]));
    }
}
