//! Automatic mixed precision, like `torch.amp`: an [`autocast`] scope and
//! the [`GradScaler`].
//!
//! Inside an autocast scope (thread-local, like PyTorch's) the ops on
//! PyTorch's lower-precision list — `matmul`, `bmm`, `linear`, `conv1d`,
//! `conv2d`, `conv_transpose2d` — cast their floating inputs to the autocast
//! dtype (bf16 by default on CPU) and return that dtype, while the ops on the
//! fp32 list — the losses, `softmax`/`log_softmax`, the norms, `sum`/`mean`,
//! `exp`/`log`/`pow` — cast f16/bf16 inputs up to f32. f64 tensors and
//! non-floating tensors are never cast. The casts are recorded `to_dtype`
//! ops, so gradients flow back to the f32 parameters in their own dtype.
//!
//! ```
//! use kiln_frontend::{amp, functional as F, DType, Tensor};
//! let x = Tensor::ones(&[4, 3], DType::F32);
//! let w = Tensor::ones(&[2, 3], DType::F32);
//! let _ac = amp::autocast(DType::BF16).unwrap();
//! let y = F::linear(&x, &w, None).unwrap();
//! assert_eq!(y.dtype(), DType::BF16);
//! assert_eq!(y.softmax(-1).unwrap().dtype(), DType::F32);
//! ```

mod scaler;
#[cfg(test)]
mod tests;

pub use scaler::{GradScaler, GradScalerConfig};

use crate::Tensor;
use kiln_ir::{bail, DType, Result};
use std::cell::Cell;

/// The autocast dtype on CPU when none is given (`torch.get_autocast_dtype('cpu')`).
pub const DEFAULT_DTYPE: DType = DType::BF16;

thread_local! {
    /// (enabled, dtype) of this thread's autocast state.
    static STATE: Cell<(bool, DType)> = const { Cell::new((false, DEFAULT_DTYPE)) };
}

/// Restores the previous autocast state when dropped (nesting works like
/// nested `with torch.autocast(...)` blocks).
#[must_use = "autocast ends when the guard drops"]
pub struct AutocastGuard {
    prev: (bool, DType),
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        STATE.with(|s| s.set(self.prev));
    }
}

fn set_state(enabled: bool, dtype: DType) -> AutocastGuard {
    AutocastGuard {
        prev: STATE.with(|s| s.replace((enabled, dtype))),
    }
}

/// `with torch.autocast("cpu", dtype=dtype):` — `dtype` must be bf16 or f16.
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        bail!(
            "autocast",
            "autocast dtype must be bf16 or f16 (the lower-precision dtypes), got {dtype}"
        );
    }
    Ok(set_state(true, dtype))
}

/// `with torch.autocast("cpu"):` — the CPU default, bf16.
pub fn autocast_cpu() -> AutocastGuard {
    set_state(true, DEFAULT_DTYPE)
}

/// `with torch.autocast("cpu", enabled=on):` — keeps the current dtype; use
/// `set_autocast_enabled(false)` to run a region in full precision inside an
/// autocast scope.
pub fn set_autocast_enabled(on: bool) -> AutocastGuard {
    set_state(on, autocast_dtype())
}

/// Whether autocast is active on this thread (`torch.is_autocast_enabled()`).
pub fn autocast_enabled() -> bool {
    STATE.with(|s| s.get().0)
}

/// The dtype autocast uses on this thread (bf16 unless set).
pub fn autocast_dtype() -> DType {
    STATE.with(|s| s.get().1)
}

/// Which of PyTorch's autocast op lists an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `lower_precision_fp`: matmul, conv, linear run in the autocast dtype.
    Lower,
    /// `fp32`: losses, norms, softmax, reductions, exp/log/pow run in f32.
    F32,
}

/// The dtype `t` is cast to under `p`, when it must be (autocast on,
/// floating, not f64, not already there).
fn target(p: Policy, dt: DType) -> Option<DType> {
    if !dt.is_float() || dt == DType::F64 {
        return None;
    }
    let to = match p {
        Policy::Lower => autocast_dtype(),
        Policy::F32 => DType::F32,
    };
    (dt != to).then_some(to)
}

/// One argument of an autocast op: a tensor or an optional tensor.
pub trait CastArg {
    type Owned;
    fn needs_cast(&self, p: Policy) -> bool;
    fn cast(&self, p: Policy) -> Result<Self::Owned>;
}

impl CastArg for &Tensor {
    type Owned = Tensor;
    fn needs_cast(&self, p: Policy) -> bool {
        target(p, self.dtype()).is_some()
    }
    fn cast(&self, p: Policy) -> Result<Tensor> {
        match target(p, self.dtype()) {
            Some(to) => self.to_dtype(to),
            None => Ok((*self).clone()),
        }
    }
}

impl CastArg for Option<&Tensor> {
    type Owned = Option<Tensor>;
    fn needs_cast(&self, p: Policy) -> bool {
        self.as_ref().is_some_and(|t| t.needs_cast(p))
    }
    fn cast(&self, p: Policy) -> Result<Option<Tensor>> {
        self.as_ref().map(|t| t.cast(p)).transpose()
    }
}

/// A tuple of [`CastArg`]s.
pub trait CastArgs {
    type Owned;
    fn cast_all(&self, p: Policy) -> Result<Option<Self::Owned>>;
}

macro_rules! cast_args_tuple {
    ($($T:ident $i:tt),+) => {
        impl<$($T: CastArg),+> CastArgs for ($($T,)+) {
            type Owned = ($($T::Owned,)+);
            fn cast_all(&self, p: Policy) -> Result<Option<Self::Owned>> {
                if !($(self.$i.needs_cast(p))||+) {
                    return Ok(None);
                }
                Ok(Some(($(self.$i.cast(p)?,)+)))
            }
        }
    };
}
cast_args_tuple!(A 0);
cast_args_tuple!(A 0, B 1);
cast_args_tuple!(A 0, B 1, C 2);
cast_args_tuple!(A 0, B 1, C 2, D 3);
cast_args_tuple!(A 0, B 1, C 2, D 3, E 4);

/// The autocast entry of an op: `None` when autocast is off or no argument
/// needs a cast (run the op as is), else the arguments cast per `p` — the op
/// then calls itself with them:
///
/// ```ignore
/// if let Some((a, b)) = amp::cast_for(Policy::Lower, (a, b))? {
///     return matmul(&a, &b);
/// }
/// ```
pub fn cast_for<A: CastArgs>(p: Policy, args: A) -> Result<Option<A::Owned>> {
    if !autocast_enabled() {
        return Ok(None);
    }
    args.cast_all(p)
}
