//! `torch.use_deterministic_algorithms`: one process-wide switch that makes
//! every kernel's floating-point summation order fixed, so a run repeats bit
//! for bit (same inputs, same thread count, same device).
//!
//! What is deterministic without the switch, and what it changes:
//!
//! | path | by default | with the switch |
//! |---|---|---|
//! | JIT kernels (CPU) | yes: threads split kept dims only; each reduction runs in one thread in index order | same |
//! | GEMM, batched GEMM (CPU) | yes: threads split rows/columns of the output, never `k` | same |
//! | conv forward, conv_transpose, pooling, embedding (CPU) | yes: each output element is written by one thread | same |
//! | embedding / gather backward (CPU, CUDA) | yes: a gather over the indices, no scatter-add | same |
//! | conv weight gradient (CPU, parallel) | yes: fixed sample ranges per partial sum (whichever thread runs it), partials added in range order | same |
//! | every CUDA kernel | yes: no kernel uses atomics; a value is reduced by one thread or one block in a fixed tree | same |
//! | DataLoader with workers | yes: batches do not depend on the worker count | same |
//!
//! No op kiln has needs an atomic or order-dependent reduction that cannot
//! be replaced, so the switch never refuses an op; [`require_deterministic`]
//! is the check a future such op calls, erroring with the op's name.
//!
//! ```
//! use kiln_runtime::deterministic::*;
//! let before = are_deterministic_algorithms_enabled();
//! use_deterministic_algorithms(true);
//! assert!(are_deterministic_algorithms_enabled());
//! assert!(require_deterministic("scatter_add_", "adds with atomics").is_err());
//! use_deterministic_algorithms(before);
//! ```

use kiln_ir::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns deterministic algorithms on or off for the whole process.
pub fn use_deterministic_algorithms(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// `torch.are_deterministic_algorithms_enabled()`.
pub fn are_deterministic_algorithms_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// For an op whose result depends on the order threads finish in: an error
/// naming `op` and `why` while deterministic algorithms are on.
pub fn require_deterministic(op: &str, why: &str) -> Result<()> {
    if are_deterministic_algorithms_enabled() {
        return Err(Error::op(
            op,
            format!(
                "does not have a deterministic implementation ({why}), but use_deterministic_algorithms(true) is set"
            ),
        ));
    }
    Ok(())
}
