//! Guards: what a compiled entry assumed about its inputs, and the typed
//! reason a call fails them (shown by `KILN_LOG=recompiles`).

use crate::Tensor;
use kiln_ir::shape::{fmt_dims, Dims};
use kiln_ir::DType;
use kiln_runtime::Device;
use std::fmt;

/// The facts a compiled entry was specialised for.
#[derive(Debug, Clone, PartialEq)]
pub struct Guards {
    /// Per argument: dtype, shape, requires_grad.
    pub args: Vec<(DType, Dims, bool)>,
    /// Per argument: its device (a graph's kernels run where its inputs are).
    pub devices: Vec<Device>,
    /// The module's train/eval mode.
    pub training: bool,
    /// Autograd would record this call (compiled backward is not used yet).
    pub needs_grad: bool,
}

/// Why a call did not match the last compiled entry.
#[derive(Debug, Clone, PartialEq)]
pub enum RecompileReason {
    ArgCount {
        expected: usize,
        actual: usize,
    },
    Rank {
        input: usize,
        expected: Dims,
        actual: Dims,
    },
    /// `batch`: only dim 0 changed, which re-plans without new machine code.
    Size {
        input: usize,
        dim: usize,
        expected: usize,
        actual: usize,
        batch: bool,
    },
    DType {
        input: usize,
        expected: DType,
        actual: DType,
    },
    RequiresGrad {
        input: usize,
        expected: bool,
        actual: bool,
    },
    Training {
        expected: bool,
        actual: bool,
    },
    Device {
        input: usize,
        expected: Device,
        actual: Device,
    },
    /// `compile_fn`'s replay of the closure ran different ops, constants or
    /// captured tensors than its trace (a captured Rust value changed).
    Captured(String),
}

impl RecompileReason {
    /// Whether it counts toward the recompile limit (a new batch size does not).
    pub fn counts(&self) -> bool {
        !matches!(self, RecompileReason::Size { batch: true, .. })
    }
}

impl fmt::Display for RecompileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use RecompileReason::*;
        match self {
            ArgCount { expected, actual } => write!(f, "expected {expected} inputs, got {actual}"),
            Rank {
                input,
                expected,
                actual,
            } => write!(
                f,
                "input {input}: rank changed, expected shape {} got {}",
                fmt_dims(expected),
                fmt_dims(actual)
            ),
            Size {
                input,
                dim,
                expected,
                actual,
                batch,
            } => {
                write!(
                    f,
                    "input {input} dim {dim}: expected size {expected}, got {actual}"
                )?;
                if *batch {
                    write!(f, " (batch dim: re-planned, kernels reused)")?;
                }
                Ok(())
            }
            DType {
                input,
                expected,
                actual,
            } => {
                write!(f, "input {input}: expected dtype {expected}, got {actual}")
            }
            RequiresGrad {
                input,
                expected,
                actual,
            } => write!(
                f,
                "input {input}: expected requires_grad={expected}, got {actual}"
            ),
            Captured(why) => write!(f, "a captured value changed: {why}"),
            Training { expected, actual } => write!(
                f,
                "module mode changed: expected training={expected}, got training={actual}"
            ),
            Device {
                input,
                expected,
                actual,
            } => write!(f, "input {input}: expected device {expected}, got {actual}"),
        }
    }
}

impl Guards {
    pub fn of(args: &[Tensor], training: bool, needs_grad: bool) -> Guards {
        Guards {
            args: args
                .iter()
                .map(|a| (a.dtype(), a.dims_vec(), a.requires_grad()))
                .collect(),
            devices: args.iter().map(Tensor::device).collect(),
            training,
            needs_grad,
        }
    }

    /// The first difference between these guards and a call's `actual` ones.
    pub fn miss_reason(&self, actual: &Guards) -> RecompileReason {
        use RecompileReason::*;
        if self.training != actual.training {
            return Training {
                expected: self.training,
                actual: actual.training,
            };
        }
        if self.args.len() != actual.args.len() {
            return ArgCount {
                expected: self.args.len(),
                actual: actual.args.len(),
            };
        }
        let only_batch = self.args.iter().zip(&actual.args).all(|(a, b)| {
            a.0 == b.0
                && a.2 == b.2
                && a.1.len() == b.1.len()
                && a.1[1.min(a.1.len())..] == b.1[1.min(b.1.len())..]
        });
        for (input, (e, a)) in self.devices.iter().zip(&actual.devices).enumerate() {
            if e != a {
                return Device {
                    input,
                    expected: *e,
                    actual: *a,
                };
            }
        }
        for (input, (e, a)) in self.args.iter().zip(&actual.args).enumerate() {
            if e.0 != a.0 {
                return DType {
                    input,
                    expected: e.0,
                    actual: a.0,
                };
            }
            if e.1.len() != a.1.len() {
                return Rank {
                    input,
                    expected: e.1.clone(),
                    actual: a.1.clone(),
                };
            }
            if let Some(dim) = (0..e.1.len()).find(|&d| e.1[d] != a.1[d]) {
                return Size {
                    input,
                    dim,
                    expected: e.1[dim],
                    actual: a.1[dim],
                    batch: only_batch,
                };
            }
            if e.2 != a.2 {
                return RequiresGrad {
                    input,
                    expected: e.2,
                    actual: a.2,
                };
            }
        }
        Training {
            expected: self.training,
            actual: actual.training,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(dims: &[usize]) -> Guards {
        Guards::of(&[Tensor::zeros(dims, DType::F32)], false, false)
    }

    #[test]
    fn a_new_batch_size_is_a_replan_that_does_not_count() {
        let r = g(&[8, 4]).miss_reason(&g(&[16, 4]));
        assert_eq!(
            r.to_string(),
            "input 0 dim 0: expected size 8, got 16 (batch dim: re-planned, kernels reused)"
        );
        assert!(!r.counts());
    }

    #[test]
    fn other_dims_dtypes_and_modes_count() {
        let r = g(&[8, 4]).miss_reason(&g(&[8, 5]));
        assert_eq!(r.to_string(), "input 0 dim 1: expected size 4, got 5");
        assert!(r.counts());
        let d = Guards::of(&[Tensor::zeros(&[8, 4], DType::F64)], false, false);
        assert_eq!(
            g(&[8, 4]).miss_reason(&d).to_string(),
            "input 0: expected dtype f32, got f64"
        );
        let t = Guards::of(&[Tensor::zeros(&[8, 4], DType::F32)], true, false);
        assert!(g(&[8, 4])
            .miss_reason(&t)
            .to_string()
            .contains("training=true"));
    }
}
