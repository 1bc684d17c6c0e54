//! Times the CPU GEMM on the shapes the benchmarks lean on (W7's 1024^3, the
//! W6 MLP's forward and both backward products, ResNet-18's im2col GEMMs) and
//! prints the fastest of the repeats with its GFLOP/s, beside the `gemm`
//! crate's time on the same call (`KILN_GEMM_CRATE` routes
//! [`kiln_runtime::externs::gemm::gemm_strided`] to the crate).
//! `cargo bench --workspace --bench gemm_shapes [-- REPEATS]`.

use kiln_runtime::externs::gemm::gemm_strided;
use std::time::Instant;

/// `(m, k, n, a transposed, b transposed, what)`.
const SHAPES: &[(usize, usize, usize, bool, bool, &str)] = &[
    (1024, 1024, 1024, false, false, "W7"),
    (256, 784, 1024, false, true, "W6 fc1 x @ W^T"),
    (256, 1024, 1024, false, true, "W6 fc2 x @ W^T"),
    (256, 1024, 1024, false, false, "W6 fc2 dx = g @ W"),
    (1024, 256, 1024, true, false, "W6 fc2 dW = g^T @ x"),
    (1024, 256, 784, true, false, "W6 fc1 dW = g^T @ x"),
    (
        64,
        576,
        3136,
        false,
        false,
        "ResNet 3x3 64->64 @56 (per image)",
    ),
    (
        512,
        4608,
        49,
        false,
        false,
        "ResNet 3x3 512->512 @7 (per image)",
    ),
];

fn time(reps: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let reps: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    println!(
        "{:<36} {:>10} {:>9} {:>10} {:>9}",
        "shape", "kiln ms", "GF/s", "crate ms", "GF/s"
    );
    for &(m, k, n, at, bt, what) in SHAPES {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let mut c = vec![0.0f32; m * n];
        let (ars, acs) = if at { (1, m as isize) } else { (k as isize, 1) };
        let (brs, bcs) = if bt { (1, k as isize) } else { (n as isize, 1) };
        let mut run = || {
            gemm_strided(
                m, k, n, &a, ars, acs, &b, brs, bcs, &mut c, n as isize, 1, false,
            )
        };
        let ours = time(reps, &mut run);
        std::env::set_var("KILN_GEMM_CRATE", "1");
        let theirs = time(reps, &mut run);
        std::env::remove_var("KILN_GEMM_CRATE");
        let gf = |s: f64| 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "{:<36} {:>10.3} {:>9.1} {:>10.3} {:>9.1}",
            format!("{what} {m}x{k}x{n}"),
            ours * 1e3,
            gf(ours),
            theirs * 1e3,
            gf(theirs)
        );
    }
}
