//! Python-style `UserWarning`s: printed to stderr once per call site and
//! message (the default `warnings` filter), and recorded so tests can observe
//! them with [`take`].
//!
//! ```
//! use kiln_frontend::{functional as F, warnings, DType, Tensor};
//! use kiln_passes::Reduction;
//! let x = Tensor::zeros(&[4, 1], DType::F32);
//! let y = Tensor::zeros(&[4], DType::F32);
//! let l = F::mse_loss(&x, &y, Reduction::None).unwrap(); // broadcasts to [4,4]
//! assert_eq!(l.dims(), &[4, 4]);
//! assert!(warnings::take()[0].contains("different to the input size"));
//! ```

use std::collections::BTreeSet;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

/// One issued warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// `file:line:col` of the user's call.
    pub location: String,
    pub message: String,
    thread: ThreadId,
}

struct State {
    seen: BTreeSet<(String, String)>,
    log: Vec<Warning>,
}

static STATE: Mutex<State> = Mutex::new(State {
    seen: BTreeSet::new(),
    log: Vec::new(),
});
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Issues `message` for the call site `at`: printed (`UserWarning: ...`) and
/// recorded the first time this site issues this message, ignored after.
/// Returns whether it was issued.
pub fn warn_at(at: &Location<'_>, message: &str) -> bool {
    let location = format!("{}:{}:{}", at.file(), at.line(), at.column());
    let mut s = state();
    if !s.seen.insert((location.clone(), message.to_string())) {
        return false;
    }
    eprintln!("{location}: UserWarning: {message}");
    COUNT.fetch_add(1, Ordering::Relaxed);
    s.log.push(Warning {
        location,
        message: message.to_string(),
        thread: std::thread::current().id(),
    });
    true
}

/// [`warn_at`] the caller's location (`#[track_caller]` functions pass their
/// own caller's).
#[track_caller]
pub fn warn(message: &str) -> bool {
    warn_at(Location::caller(), message)
}

/// The messages of the warnings issued on this thread since the last `take`
/// (removed from the record).
pub fn take() -> Vec<String> {
    let me = std::thread::current().id();
    let mut s = state();
    let (mine, rest): (Vec<Warning>, Vec<Warning>) = s.log.drain(..).partition(|w| w.thread == me);
    s.log = rest;
    mine.into_iter().map(|w| w.message).collect()
}

/// Every recorded warning, from every thread (removed from the record).
pub fn take_all() -> Vec<Warning> {
    std::mem::take(&mut state().log)
}

/// How many warnings this process has issued.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}
