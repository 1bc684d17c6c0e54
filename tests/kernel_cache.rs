//! The kernel cache is keyed by signature (dtypes, rank after collapsing,
//! inner-stride pattern), not sizes: a new batch size reuses machine code.
//! (Its own test binary: the cache counters are process-wide.)

use kiln::runtime::cache_stats;
use kiln::{DType, Tensor};

// Counters are process-wide: tests in this binary take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn launches() -> usize {
    let s = cache_stats();
    s.hits + s.compiles
}

#[test]
fn new_batch_size_reuses_machine_code() {
    let _g = SERIAL.lock().unwrap();
    let x = Tensor::full(&[8, 100], 0.5, DType::F32);
    let before = cache_stats();
    let y = x.elu(0.7).unwrap();
    let after_first = cache_stats();
    assert_eq!(
        after_first.compiles,
        before.compiles + 1,
        "first elu compiles one kernel"
    );

    for batch in [1usize, 3, 16, 257] {
        let x = Tensor::full(&[batch, 100], -0.25, DType::F32);
        x.elu(0.7).unwrap();
    }
    let after_sizes = cache_stats();
    assert_eq!(
        after_sizes.compiles, after_first.compiles,
        "other sizes reuse the kernel"
    );
    assert!(after_sizes.hits >= after_first.hits + 4);

    // a transposed input is another signature (strided inner loop): one new kernel,
    // then reused for other sizes too
    let t = Tensor::full(&[100, 8], 1.0, DType::F32).t().unwrap();
    t.elu(0.7).unwrap();
    let after_t = cache_stats();
    assert_eq!(after_t.compiles, after_sizes.compiles + 1);
    Tensor::full(&[100, 33], 1.0, DType::F32)
        .t()
        .unwrap()
        .elu(0.7)
        .unwrap();
    assert_eq!(cache_stats().compiles, after_t.compiles);
    assert_eq!(y.dims(), &[8, 100]);
}

#[test]
fn eager_composites_fuse_pointwise_chains() {
    let _g = SERIAL.lock().unwrap();
    let x = Tensor::full(&[64, 256], 0.5, DType::F32);
    let (w, b) = (
        Tensor::ones(&[256], DType::F32),
        Tensor::zeros(&[256], DType::F32),
    );
    let count = |f: &dyn Fn()| {
        let before = launches();
        f();
        launches() - before
    };
    // one online log-sum-exp pass storing (shift, logsum); exp((x - shift) - logsum)
    assert_eq!(count(&|| drop(x.softmax(-1).unwrap())), 2);
    // the same pass; (x - shift) - logsum
    assert_eq!(count(&|| drop(x.log_softmax(-1).unwrap())), 2);
    // the log-sum-exp pass alone
    assert_eq!(count(&|| drop(x.logsumexp(&[-1], false).unwrap())), 1);
    // one Welford pass storing (mean, var, rstd); (x - mean) * rstd * w + b
    assert_eq!(
        count(&|| drop(
            kiln::functional::layer_norm(&x, &[256], Some(&w), Some(&b), 1e-5).unwrap()
        )),
        2
    );
    // unfused gelu chain of W1 is one kernel per op
    assert_eq!(count(&|| drop(x.gelu(false).unwrap())), 1);
}
