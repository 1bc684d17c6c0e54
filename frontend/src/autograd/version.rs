//! Version counters: every in-place op bumps the counter shared by all views
//! of a storage, so a backward that needs a tensor saved at an older version
//! fails with an error naming the op that changed it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The version counter of one storage (shared by its views).
#[derive(Default, Debug)]
pub struct Version {
    v: AtomicU64,
    last_op: Mutex<String>,
}

impl Version {
    pub fn get(&self) -> u64 {
        self.v.load(Ordering::Acquire)
    }
    /// Records an in-place change by `op`.
    pub fn bump(&self, op: &str) {
        *self.last_op.lock().unwrap_or_else(|e| e.into_inner()) = op.to_string();
        self.v.fetch_add(1, Ordering::AcqRel);
    }
    /// The in-place op that last changed the storage.
    pub fn last_op(&self) -> String {
        self.last_op
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
