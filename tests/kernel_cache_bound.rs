//! The JIT kernel cache is bounded for long-running processes: with a small
//! bound, compiling many distinct kernels keeps the machine code it holds
//! under the bound (oldest generations retired), `memory_summary()` shows
//! the size and the bound, and an evicted kernel recompiles and computes the
//! right values, while a plan still holding old code keeps working.
//! (Own test binary: the bound is process-wide.)

use kiln::compile::compile_fn;
use kiln::runtime::launch::{kernel_cache, set_kernel_cache_limit};
use kiln::Tensor;

/// Six pointwise steps chosen by the bits of `n`: one distinct fused
/// kernel per `n` in `0..64`, each small next to the bound.
fn chain(n: usize, x: &Tensor) -> kiln::Result<Tensor> {
    let mut y = x.clone();
    for bit in 0..6 {
        y = if n >> bit & 1 == 1 {
            y.tanh()?
        } else {
            (&y * 1.5).sigmoid()?
        };
    }
    Ok(y)
}

fn close(a: &Tensor, b: &Tensor) {
    for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
        assert!((p - q).abs() <= 1e-6 * (1.0 + q.abs()), "{p} vs {q}");
    }
}

#[test]
fn many_kernels_stay_under_a_small_bound_and_evicted_ones_recompile() {
    let bound = 48 << 10;
    set_kernel_cache_limit(bound);
    let x = kiln::bench::randn(&[257], 1);
    let first = compile_fn("chain1", |t| Ok(vec![chain(1, &t[0])?]));
    close(
        &first.call(&[x.clone()]).unwrap()[0],
        &chain(1, &x).unwrap(),
    );
    let mut peak = 0;
    for n in 2..64 {
        let f = compile_fn("chain", move |t| Ok(vec![chain(n, &t[0])?]));
        close(&f.call(&[x.clone()]).unwrap()[0], &chain(n, &x).unwrap());
        let k = kernel_cache();
        if std::env::var("DEBUG_KC").is_ok() {
            eprintln!("{n}: {k:?}");
        }
        assert!(
            k.code_bytes <= bound,
            "after {n} kernels: {} bytes held, bound {bound}",
            k.code_bytes
        );
        peak = peak.max(k.code_bytes);
    }
    let k = kernel_cache();
    println!(
        "kernel cache: {} kernels, {} bytes (peak {peak}), bound {bound}, {} generations, {} evicted",
        k.kernels, k.code_bytes, k.generations, k.evicted
    );
    assert!(k.evicted > 0, "nothing was evicted: {k:?}");
    assert!(k.generations >= 2, "{k:?}");
    let summary = kiln::runtime::memory_summary();
    assert!(summary.contains("JIT code bound"), "{summary}");
    assert!(summary.contains(&format!("({bound} bytes)")), "{summary}");
    // the first plan still holds its (retired) code and runs it
    close(
        &first.call(&[x.clone()]).unwrap()[0],
        &chain(1, &x).unwrap(),
    );
    // a fresh compile of an evicted kernel recompiles it, correctly
    let before = kiln::runtime::cache_stats().compiles;
    let again = compile_fn("chain2-again", |t| Ok(vec![chain(2, &t[0])?]));
    close(
        &again.call(&[x.clone()]).unwrap()[0],
        &chain(2, &x).unwrap(),
    );
    assert!(
        kiln::runtime::cache_stats().compiles > before,
        "an evicted kernel was not recompiled"
    );
}
