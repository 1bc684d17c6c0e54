//! Capturing launches for replay and recording the kernels launched.

use super::*;
thread_local! {
    static RECORDING: std::cell::RefCell<Option<Vec<Kernel>>> = const { std::cell::RefCell::new(None) };
    static CAPTURE: std::cell::RefCell<Option<Vec<Captured>>> = const { std::cell::RefCell::new(None) };
}

/// One launch seen by [`capture_launches`]: everything needed to run it
/// again on other buffers of the same layouts without building KernelIR or
/// looking machine code up.
pub enum Captured {
    /// A CPU launch: machine code, collapsed loop dims, per-operand strides
    /// (flattened) and where each operand starts.
    Launch(CapturedLaunch),
    /// A launch that cannot be replayed as one call (a CUDA device, or
    /// f16/bf16 operands widened through temporaries).
    Opaque(&'static str),
}

/// A replayable CPU launch (see [`Captured`]).
pub struct CapturedLaunch {
    pub exec: Arc<Executable>,
    /// The kernel as specialised for this launch (for [`record_kernels`]).
    pub kernel: Arc<Kernel>,
    pub dims: Vec<usize>,
    pub strides: Vec<isize>,
    pub scalars: Vec<u64>,
    /// Per operand (outputs first): its storage and the element offset of its view.
    pub storages: Vec<*const Storage>,
    /// Per operand: its storage's [`Storage::id`] (an address is reused once
    /// its storage is freed; the id is not).
    pub ids: Vec<u64>,
    pub offsets: Vec<usize>,
    /// Per operand: its storage's dtype and length in elements.
    pub dtypes: Vec<DType>,
    pub lens: Vec<usize>,
    /// Dim 0 may be split across threads.
    pub splittable: bool,
}

/// Runs `f` and returns the launches it made on this thread, for replay with
/// [`run_launch`] (the compiled executor's prebuilt launch list).
pub fn capture_launches<R>(f: impl FnOnce() -> R) -> (R, Vec<Captured>) {
    let prev = CAPTURE.with(|c| c.borrow_mut().replace(vec![]));
    let out = f();
    let got = CAPTURE
        .with(|c| std::mem::replace(&mut *c.borrow_mut(), prev))
        .unwrap_or_default();
    (out, got)
}

pub(super) fn capturing() -> bool {
    CAPTURE.with(|c| c.borrow().is_some())
}

pub(super) fn note_captured(c: impl FnOnce() -> Captured) {
    CAPTURE.with(|v| {
        if let Some(v) = v.borrow_mut().as_mut() {
            v.push(c())
        }
    });
}

/// Whether [`record_kernels`] is recording on this thread (a replayed launch
/// then notes its kernel, as a launch through [`launch`] does).
pub fn recording_kernels() -> bool {
    RECORDING.with(|r| r.borrow().is_some())
}

/// Runs `f` and returns it with the kernels it launched on this thread, as
/// specialised for launch (rank after collapsing, inner-stride pattern) — what
/// snapshot tests and `explain`-style tools look at.
pub fn record_kernels<R>(f: impl FnOnce() -> R) -> (R, Vec<Kernel>) {
    let prev = RECORDING.with(|r| r.borrow_mut().replace(vec![]));
    let out = f();
    let got = RECORDING
        .with(|r| std::mem::replace(&mut *r.borrow_mut(), prev))
        .unwrap_or_default();
    (out, got)
}

/// Adds `k` (as specialised for launch) to this thread's [`record_kernels`].
pub fn note_launched(k: &Kernel) {
    RECORDING.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(k.clone())
        }
    });
}
