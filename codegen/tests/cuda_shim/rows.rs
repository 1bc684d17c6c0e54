//! Reductions with a row pass (softmax, log_softmax, layer_norm in one
//! kernel) through the CUDA C: every thread reads the stored parts back
//! after the block barrier. The parts merge in the kernel's tree order, so
//! f32 gets rtol 1e-4 (the row pass amplifies a shift's rounding by |x|).

use super::cases::Case;
use super::common::row_pass::{kernel, views, Norm};
use super::common::*;

pub fn row_pass_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    for norm in [Norm::Softmax, Norm::LogSoftmax, Norm::LayerNorm] {
        for (dt, tol) in [(F32, 1e-4), (F64, 1e-10)] {
            for (rows, n, strided) in [
                (5, 1, false),
                (4, 37, false),
                (3, 300, false),
                (4, 37, true),
            ] {
                let inner = if strided {
                    Inner::Strided
                } else {
                    Inner::Contiguous
                };
                let k = kernel(norm, dt, inner);
                cases.push(Case {
                    label: format!("{} {dt} {rows}x{n} strided={strided}", k.name),
                    // inf and NaN rows merge order-dependently in Welford's tree (NaN vs
                    // inf), as in the plain reduction cases: only log-sum-exp gets them
                    views: views(
                        &k,
                        rows,
                        n,
                        (strided, !matches!(norm, Norm::LayerNorm)),
                        rng,
                    ),
                    k,
                    sizes: vec![rows, n],
                    scalars: vec![],
                    tol: Tol {
                        rtol: tol,
                        atol: tol,
                    },
                    grid: 2,
                    block: 64,
                    shift: vec![],
                });
            }
        }
    }
}
