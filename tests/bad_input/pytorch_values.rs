//! Edge inputs where PyTorch returns a defined value rather than raising:
//! kiln must return that exact value, eagerly and compiled.

use super::support::t;
use kiln::compile::compile_fn;
use kiln::ir::BinaryOp;

/// `torch.floor_divide` of these float pairs, as torch 2.15 prints them
/// (`torch.floor_divide(a, b).tolist()`): a zero divisor gives IEEE `a / b`,
/// a zero quotient keeps the sign of `a / b`.
const A: [f32; 13] = [
    1.0,
    -1.0,
    0.0,
    -0.0,
    f32::INFINITY,
    -0.5,
    0.5,
    -0.0,
    3.0,
    f32::NAN,
    -0.0,
    0.0,
    -0.0,
];
const B: [f32; 13] = [
    0.0, 0.0, 0.0, 0.0, 0.0, 2.0, -2.0, 2.0, -0.0, 0.0, 2.0, -2.0, -2.0,
];
const TORCH: [f32; 13] = [
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::NAN,
    f32::INFINITY,
    -1.0,
    -1.0,
    -0.0,
    f32::NEG_INFINITY,
    f32::NAN,
    -0.0,
    -0.0,
    0.0,
];

/// Same value, NaN equal to NaN, and the sign of a zero compared.
fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits())
}

#[test]
fn float_floor_divide_by_zero_gives_torch_values() {
    let a = t(A.to_vec(), &[A.len()]);
    let b = t(B.to_vec(), &[B.len()]);
    let eager = a.binary(BinaryOp::FloorDiv, &b).unwrap();
    let eager = eager.to_vec::<f32>().unwrap();
    assert!(same(&eager, &TORCH), "eager {eager:?}\n want {TORCH:?}");
    let f = compile_fn("floor_div", |x| {
        Ok(vec![x[0].binary(BinaryOp::FloorDiv, &x[1])?])
    });
    for _ in 0..2 {
        let c = f.call(&[a.clone(), b.clone()]).unwrap()[0]
            .to_vec::<f32>()
            .unwrap();
        assert!(same(&c, &TORCH), "compiled {c:?}\n want {TORCH:?}");
    }
    // f64 takes the same path
    let e64 = a
        .to_dtype(kiln::DType::F64)
        .unwrap()
        .binary(BinaryOp::FloorDiv, &b.to_dtype(kiln::DType::F64).unwrap())
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let e64: Vec<f32> = e64.iter().map(|&v| v as f32).collect();
    assert!(same(&e64, &TORCH), "f64 {e64:?}");
}
