//! The windowed reductions behind scans, sorts and scatters
//! (`frontend/src/ops/{scan,sort,scatter}.rs`): eagerly and without a
//! gradient each is fused kernels only (a scan ONE, a sort's permutation
//! two: ranks, then their inverse), their values match a host computation
//! on shapes the fixtures do not cover, and bad arguments are errors that
//! name the op and the shapes.

use kiln::functional as F;
use kiln::nn::PaddingMode;
use kiln::{DType, ScatterReduce, Tensor};

/// `f`'s result and how many kernels it launched.
fn launches<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let (r, k) = kiln_runtime::record_kernels(f);
    (r, k.len())
}

/// A [3, 7] f32 tensor of distinct, unordered values.
fn x37() -> Tensor {
    let v: Vec<f32> = (0..21).map(|i| ((i * 13) % 21) as f32 - 10.0).collect();
    Tensor::from_vec(v, &[3, 7]).unwrap()
}

#[test]
fn a_scan_is_one_kernel_and_matches_a_running_sum() {
    let x = x37();
    let (y, n) = launches(|| x.cumsum(1, None).unwrap());
    assert_eq!(n, 1, "cumsum launched {n} kernels");
    let v = x.to_vec::<f32>().unwrap();
    let mut want = vec![];
    for r in 0..3 {
        let mut acc = 0.0;
        for c in 0..7 {
            acc += v[r * 7 + c];
            want.push(acc);
        }
    }
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
}

#[test]
fn argsort_is_two_kernels_and_sorts() {
    let x = x37();
    let (idx, n) = launches(|| x.argsort(1, true).unwrap());
    assert_eq!(n, 2, "argsort launched {n} kernels");
    let (v, i) = (x.to_vec::<f32>().unwrap(), idx.to_vec::<i64>().unwrap());
    for r in 0..3 {
        let mut want: Vec<i64> = (0..7).collect();
        want.sort_by(|&a, &b| v[r * 7 + b as usize].total_cmp(&v[r * 7 + a as usize]));
        assert_eq!(&i[r * 7..r * 7 + 7], want.as_slice(), "row {r}");
    }
}

#[test]
fn scatter_reduce_amax_matches_a_host_loop() {
    let x = Tensor::from_vec(vec![0.5f32; 4], &[4]).unwrap();
    let index = Tensor::from_vec(vec![3i64, 0, 3, 1, 0], &[5]).unwrap();
    let src = Tensor::from_vec(vec![2.0f32, -1.0, 7.0, 0.25, 3.0], &[5]).unwrap();
    let y = x
        .scatter_reduce(0, &index, &src, ScatterReduce::Amax, false)
        .unwrap();
    // position 2 is never written: it keeps the input
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 0.25, 0.5, 7.0]);
}

#[test]
fn integer_scans_accumulate_in_i64() {
    let x = Tensor::from_vec(vec![true, true, false, true], &[4]).unwrap();
    let y = x.cumsum(0, None).unwrap();
    assert_eq!(y.dtype(), DType::I64);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![1, 2, 2, 3]);
    let (m, i) = Tensor::from_vec(vec![2i64, 5, 5, 1], &[4])
        .unwrap()
        .cummax(0)
        .unwrap();
    assert_eq!(m.to_vec::<i64>().unwrap(), vec![2, 5, 5, 5]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 1, 2, 2]);
}

#[test]
fn bad_arguments_name_the_op_and_shapes() {
    let x = x37();
    let msg = |r: kiln::Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = msg(x.topk(8, 1, true).map(|p| p.0));
    assert!(e.contains("topk") && e.contains("[3,7]"), "{e}");
    let e = msg(x.kthvalue(0, 1, false).map(|p| p.0));
    assert!(e.contains("kthvalue") && e.contains("k (0)"), "{e}");
    let e = msg(F::pad(&x, &[7, 0], PaddingMode::Reflect, 0.0));
    assert!(e.contains("pad") && e.contains("[3,7]"), "{e}");
    let bad = Tensor::from_vec(vec![5i64], &[1, 1]).unwrap();
    let e = msg(x.scatter(0, &bad, &x));
    assert!(e.starts_with("scatter:") && e.contains("index 5"), "{e}");
    let e = msg(x.logcumsumexp(2));
    assert!(e.contains("logcumsumexp") && e.contains("dim 2"), "{e}");
    let e = msg(x.unfold(1, 8, 1));
    assert!(e.contains("unfold") && e.contains("[3,7]"), "{e}");
}
