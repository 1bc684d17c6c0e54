//! The profiler's cost: N small eager ops (adds of a 16-element f32 tensor)
//! with the profiler off and on, in ns/op, plus the cost of an instrumented
//! call site itself when off (one relaxed atomic load and a branch).
//!
//! `cargo bench --bench profiler_overhead` (`-- 1000000` for more ops).

use kiln::profiler::{self, Category};
use kiln::Tensor;
use std::hint::black_box;
use std::time::Instant;

fn adds(x: &Tensor, y: &Tensor, n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        black_box(x.add(y).unwrap());
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[16]).unwrap();
    let y = Tensor::from_vec(vec![0.5f32; 16], &[16]).unwrap();
    adds(&x, &y, n / 10); // warm the kernel cache and the allocator
    let (mut off, mut on) = (vec![], vec![]);
    let mut events = 0;
    for _ in 0..5 {
        off.push(adds(&x, &y, n));
        let (ns, p) = profiler::profile(|| adds(&x, &y, n));
        on.push(ns);
        events = p.events().len();
    }
    let (off, on) = (median(off), median(on));
    // an instrumented call site with the profiler off
    let m = n * 1000;
    let t = Instant::now();
    for i in 0..m {
        let _s = profiler::scope("site", Category::Op).bytes(|| i as u64);
        black_box(i);
    }
    let site = t.elapsed().as_nanos() as f64 / m as f64;
    let t = Instant::now();
    for i in 0..m {
        black_box(i);
    }
    let empty = t.elapsed().as_nanos() as f64 / m as f64;
    println!("{n} adds of a 16-element f32 tensor, median of 5 runs:");
    println!("  profiler off: {off:>8.1} ns/op");
    println!(
        "  profiler on:  {on:>8.1} ns/op  (+{:.1} ns per recorded event; {events} events per run)",
        on - off
    );
    println!(
        "  instrumented call site while off: {site:.2} ns vs an empty loop {empty:.2} ns ({m} iterations)"
    );
}
