//! The vector ISA of the running CPU, detected once: the extern kernels
//! (Winograd transforms, fused optimizer steps) pick their AVX-512, AVX2 or
//! scalar body with it, and the conv algorithm cache keys its entries by it
//! (a choice timed on an AVX2 machine says nothing about an AVX-512 one).
//!
//! ```
//! use kiln_runtime::externs::cpu_isa::{detect, Isa};
//! let isa = detect();
//! assert!(isa >= Isa::Scalar);
//! println!("running on {}", isa.name());
//! ```

use std::sync::OnceLock;

/// The widest vector extension the kernels may use, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512 F (with AVX2 and FMA).
    Avx512,
}

impl Isa {
    /// `scalar`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The running CPU's [`Isa`] (`KILN_CPU_ISA=scalar|avx2` caps it, to test
/// the narrower bodies on a wider machine).
pub fn detect() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let found = hardware();
        match std::env::var("KILN_CPU_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => found.min(Isa::Avx2),
            _ => found,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn hardware() -> Isa {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        Isa::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn hardware() -> Isa {
    Isa::Scalar
}
