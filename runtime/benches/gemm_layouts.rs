//! Times W6's products (an MLP 784-1024-1024-10 train step at batch 256) in
//! the operand layouts the train step hands the GEMM: `x @ w^T` (the weight
//! transposed), `dy @ w` and `dy^T @ x`, and a few other Linear shapes;
//! fastest of the repeats. `cargo bench -p kiln-runtime --bench gemm_layouts [-- REPEATS]`.

use kiln_runtime::externs::gemm::gemm_strided;
use std::time::Instant;

/// `(m, k, n, a transposed, b transposed, what)`.
const CASES: &[(usize, usize, usize, bool, bool, &str)] = &[
    (256, 784, 1024, false, true, "x @ w1^T"),
    (256, 1024, 1024, false, true, "h1 @ w2^T"),
    (256, 1024, 1024, false, false, "dy @ w2"),
    (256, 1024, 1024, false, false, "h1 @ w2 (contiguous copy)"),
    (1024, 256, 1024, true, false, "dy^T @ h1"),
    (1024, 256, 784, true, false, "dy^T @ x"),
    (64, 1024, 1024, false, true, "a batch of 64 @ w^T"),
    (64, 1024, 1024, false, false, "a batch of 64 @ w"),
    (
        256,
        4096,
        1024,
        false,
        true,
        "a transformer's MLP down-projection @ w^T",
    ),
];

fn main() {
    let repeats: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    for &(m, k, n, at, bt, what) in CASES {
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
        let mut out = vec![0f32; m * n];
        let (a_rs, a_cs) = if at { (1, m as isize) } else { (k as isize, 1) };
        let (b_rs, b_cs) = if bt { (1, k as isize) } else { (n as isize, 1) };
        let mut best = f64::INFINITY;
        for _ in 0..repeats {
            let t = Instant::now();
            gemm_strided(
                m, k, n, &a, a_rs, a_cs, &b, b_rs, b_cs, &mut out, n as isize, 1, false,
            );
            best = best.min(t.elapsed().as_secs_f64());
        }
        let gf = 2.0 * (m * k * n) as f64 / best / 1e9;
        println!(
            "{m:5}x{k:5}x{n:5}  {:8.3} ms {gf:7.1} GFLOP/s  {what}",
            best * 1e3
        );
    }
}
