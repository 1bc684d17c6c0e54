use crate::{DType, Tensor};

fn ramp(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.4).collect();
    Tensor::from_vec(v, dims).unwrap()
}

/// One kernel writes both results, each from the other's old value;
/// f16 outputs are widened around the kernel and narrowed back.
#[test]
fn materialize_many_updates_in_place() {
    use super::{Fuser, Lazy};
    use kiln_ir::BinaryOp;
    use kiln_passes::decompose::Builder;
    for dt in [DType::F32, DType::F64, DType::F16] {
        let a = ramp(&[2, 5]).to_dtype(dt).unwrap();
        let bv: Vec<f32> = (0..10).map(|i| 0.3 * i as f32 - 1.1).collect();
        let b = Tensor::from_vec(bv, &[2, 5]).unwrap().to_dtype(dt).unwrap();
        let (want_a, want_b) = (a.add(&b).unwrap(), a.sub(&b).unwrap());
        let (la, lb) = (Lazy::tensor(&a), Lazy::tensor(&b));
        let sum = Fuser.binary(BinaryOp::Add, &la, &lb).unwrap();
        let diff = Fuser.binary(BinaryOp::Sub, &la, &lb).unwrap();
        let ((), ks) = kiln_runtime::record_kernels(|| {
            Lazy::materialize_many_into(&[(&sum, &a), (&diff, &b)]).unwrap()
        });
        assert_eq!(ks.len(), 1, "{dt}");
        assert_eq!(ks[0].outputs(), 2);
        assert_eq!(a.to_f64_vec(), want_a.to_f64_vec(), "{dt}");
        assert_eq!(b.to_f64_vec(), want_b.to_f64_vec(), "{dt}");
    }
}

/// The one-pass statistics are kept in f32 for f16 inputs; results stay f16.
#[test]
fn half_inputs_keep_their_dtype() {
    let x = ramp(&[3, 40]);
    let h = x.to_dtype(DType::F16).unwrap();
    let w = x
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let cases: [(&str, fn(&Tensor) -> Tensor); 3] = [
        ("softmax", |t| t.softmax(-1).unwrap()),
        ("log_softmax", |t| t.log_softmax(-1).unwrap()),
        ("layer_norm", |t| {
            crate::functional::layer_norm(t, &[40], None, None, 1e-5).unwrap()
        }),
    ];
    for (name, f) in cases {
        let y = f(&h);
        assert_eq!(y.dtype(), DType::F16, "{name}");
        let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let want = f(&w).to_vec::<f32>().unwrap();
        for (g, r) in got.iter().zip(&want) {
            assert!(
                (g - r).abs() <= 2e-3 * (1.0 + r.abs()),
                "{name}: {g} vs {r}"
            );
        }
    }
}
