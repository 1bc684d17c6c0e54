//! A Linear's `w^T` is copied row-major for the GEMM; a parameter's copy is
//! kept once a version of it is used twice (inference) and dropped when the
//! parameter changes, and training (each version used once) keeps none.
//! Batched inputs sharing one weight are one GEMM over all their rows.

use kiln::random::{randn, Generator};
use kiln::runtime::externs::packed::packs_on_this_thread;
use kiln::Tensor;

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
}

/// `x @ w^T + b` with `w^T` made contiguous first, so no kept copy is involved.
fn reference(x: &Tensor, w: &Tensor, b: &Tensor) -> Vec<f32> {
    let _no_grad = kiln::autograd::no_grad();
    let wt = w.detach().t().unwrap().contiguous().unwrap();
    kiln::functional::matmul(x, &wt)
        .unwrap()
        .add(b)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

/// Output and packs made by one `linear` call under `no_grad`.
fn infer(x: &Tensor, w: &Tensor, b: &Tensor) -> (Vec<f32>, u64) {
    let _no_grad = kiln::autograd::no_grad();
    let before = packs_on_this_thread();
    let y = kiln::functional::linear(x, w, Some(b)).unwrap();
    (y.to_vec::<f32>().unwrap(), packs_on_this_thread() - before)
}

#[test]
fn an_inference_weight_is_copied_on_its_second_use_and_follows_its_version() {
    let mut r = Generator::new(3);
    // 512 * 256 elements: big enough for the row-major copy
    let w = randn(&[256, 512], Some(&mut r)).requires_grad_(true);
    let b = randn(&[256], Some(&mut r)).requires_grad_(true);
    let x = randn(&[32, 512], Some(&mut r));
    let (first, packs) = infer(&x, &w, &b);
    assert_eq!(packs, 0, "the first use of a version copied it");
    assert!(close(&first, &reference(&x, &w, &b)));
    let (second, packs) = infer(&x, &w, &b);
    assert_eq!(packs, 1, "the second use of a version kept no copy");
    for call in 2..4 {
        let (y, packs) = infer(&x, &w, &b);
        assert_eq!(packs, 0, "call {call} copied the weight again");
        assert_eq!(y, second, "call {call}");
    }
    assert_eq!(second, first, "the kept copy and the per-call one differ");
    {
        let _no_grad = kiln::autograd::no_grad();
        w.copy_(&randn(&[256, 512], Some(&mut r))).unwrap();
    }
    let (y, packs) = infer(&x, &w, &b);
    assert_eq!(packs, 0, "the changed weight's first use was copied");
    assert!(!close(&y, &first), "the stale copy was used");
    assert!(close(&y, &reference(&x, &w, &b)));
    let (again, packs) = infer(&x, &w, &b);
    assert_eq!((packs, &again), (1, &y));
}

#[test]
fn training_steps_keep_no_copy() {
    let mut r = Generator::new(4);
    let w = randn(&[256, 512], Some(&mut r)).requires_grad_(true);
    let b = randn(&[256], Some(&mut r)).requires_grad_(true);
    let x = randn(&[32, 512], Some(&mut r));
    let before = packs_on_this_thread();
    for step in 0..3 {
        let y = kiln::functional::linear(&x, &w, Some(&b)).unwrap();
        assert!(
            close(&y.to_vec::<f32>().unwrap(), &reference(&x, &w, &b)),
            "step {step}"
        );
        y.sum(None, false).unwrap().backward().unwrap();
        let _no_grad = kiln::autograd::no_grad();
        let g = w.grad().unwrap();
        w.copy_(&w.sub(&g.mul_scalar(1e-3).unwrap()).unwrap())
            .unwrap();
        w.set_grad(None);
    }
    assert_eq!(
        packs_on_this_thread() - before,
        0,
        "training kept weight copies"
    );
}

#[test]
fn a_compiled_linear_keeps_the_copy_too() {
    let mut r = Generator::new(5);
    let w = randn(&[384, 256], Some(&mut r)).requires_grad_(true);
    let b = randn(&[384], Some(&mut r)).requires_grad_(true);
    let x = randn(&[16, 256], Some(&mut r));
    let f = kiln::compile::compile_fn("linear_kept_copy", |xs: &[Tensor]| {
        Ok(vec![kiln::functional::linear(&xs[0], &w, Some(&b))?.relu()?])
    });
    let want: Vec<f32> = reference(&x, &w, &b).iter().map(|v| v.max(0.0)).collect();
    let _no_grad = kiln::autograd::no_grad();
    let mut packs = vec![];
    for _ in 0..4 {
        let before = packs_on_this_thread();
        let y = f.call(&[x.clone()]).unwrap()[0].to_vec::<f32>().unwrap();
        packs.push(packs_on_this_thread() - before);
        assert!(close(&y, &want));
    }
    assert_eq!(
        packs.iter().sum::<u64>(),
        1,
        "copies made per call: {packs:?}"
    );
}

/// `[B, S, K] @ w^T` as one GEMM of `B*S` rows, and left operands whose
/// rows are not evenly strided (a transposed batch) still per item.
#[test]
fn batched_inputs_sharing_a_weight_match_item_by_item() {
    let mut r = Generator::new(6);
    let w = randn(&[96, 300], Some(&mut r));
    let b = randn(&[96], Some(&mut r));
    for x in [
        randn(&[3, 5, 300], Some(&mut r)),
        randn(&[2, 3, 4, 300], Some(&mut r)),
        randn(&[5, 3, 300], Some(&mut r)).transpose(0, 1).unwrap(),
        randn(&[1, 7, 300], Some(&mut r))
            .expand(&[4, 7, 300])
            .unwrap(),
    ] {
        let y = kiln::functional::linear(&x, &w, Some(&b)).unwrap();
        assert_eq!(
            y.dims()[..x.dims().len() - 1],
            x.dims()[..x.dims().len() - 1]
        );
        let rows = x.numel() / 300;
        let flat = x
            .contiguous()
            .unwrap()
            .reshape(&[rows as i64, 300])
            .unwrap();
        let want = reference(&flat, &w, &b);
        assert!(
            close(&y.to_vec::<f32>().unwrap(), &want),
            "x {:?}",
            x.dims()
        );
    }
}

#[test]
fn a_small_batch_keeps_no_copy_and_gives_the_same_bits_every_call() {
    // up to 8 rows the dot products read `w` as stored; a copy would change
    // the summation order between the first call and later ones
    let mut r = Generator::new(9);
    let w = randn(&[1000, 576], Some(&mut r)).requires_grad_(true);
    let b = randn(&[1000], Some(&mut r)).requires_grad_(true);
    for rows in [1, 3, 8] {
        let x = randn(&[rows, 576], Some(&mut r));
        let (first, _) = infer(&x, &w, &b);
        for call in 1..3 {
            let (y, packs) = infer(&x, &w, &b);
            assert_eq!(packs, 0, "{rows} rows: call {call} kept a copy");
            assert_eq!(y, first, "{rows} rows: call {call}");
        }
    }
}
