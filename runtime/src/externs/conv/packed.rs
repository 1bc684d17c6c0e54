//! Weights packed (transformed) once per parameter version: a conv called
//! with a [`WeightKey`] reuses the packed form while the weight's storage is
//! the same and its version counter has not moved; an in-place change of
//! the parameter (an optimizer step) bumps the version and so repacks.
//!
//! The cache holds a `Weak` to each storage it keys by, so a freed
//! storage's address cannot be reused by a new one while its entry lives:
//! an entry can only ever match the storage it was packed from.
//!
//! Parameters are keyed because every write to them is an in-place op that
//! moves the version. So are storages marked [`mark_stable`]: a compiled
//! graph's cached hoisted values (BatchNorm folded into a conv's weight),
//! which nothing writes again while the cache holds them.
//!
//! ```
//! use kiln_runtime::externs::conv::packed::{packed_or_insert, WeightKey};
//! use kiln_runtime::Storage;
//! use std::sync::Arc;
//! let st = Arc::new(Storage::zeros(kiln_ir::DType::F32, 4));
//! let key = WeightKey { storage: &st, offset: 0, dims: &[4], version: 0 };
//! let a = packed_or_insert::<f32>(Some(key), "demo", || vec![1.0, 2.0]);
//! let b = packed_or_insert::<f32>(Some(key), "demo", || unreachable!());
//! assert!(Arc::ptr_eq(&a, &b));
//! ```

use crate::Storage;
use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

/// Which weight a packed form belongs to: its storage, the element offset
/// and dims of its view, and the storage's version counter.
#[derive(Clone, Copy)]
pub struct WeightKey<'a> {
    pub storage: &'a Arc<Storage>,
    pub offset: usize,
    pub dims: &'a [usize],
    pub version: u64,
}

struct Entry {
    storage: Weak<Storage>,
    offset: usize,
    dims: Vec<usize>,
    version: u64,
    kind: &'static str,
    packed: Arc<dyn Any + Send + Sync>,
}

/// Entries kept; beyond that the oldest go (a model has a few dozen convs).
const CAPACITY: usize = 256;

static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

thread_local! {
    static PACKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many packed forms this thread has made: a test's way to see that a
/// cached form was reused, not made again.
pub fn packs_on_this_thread() -> u64 {
    PACKS.with(|n| n.get())
}

/// The storages marked [`mark_stable`] that are still alive.
static STABLE: Mutex<Vec<Weak<Storage>>> = Mutex::new(Vec::new());

/// Marks `storage` as written only by in-place ops that move its tensor's
/// version counter from now on, so a conv weight in it is packed once per
/// version ([`is_stable`]) as a parameter's is.
///
/// ```
/// use kiln_runtime::externs::conv::packed::{is_stable, mark_stable};
/// use kiln_runtime::Storage;
/// use std::sync::Arc;
/// let st = Arc::new(Storage::zeros(kiln_ir::DType::F32, 4));
/// assert!(!is_stable(&st));
/// mark_stable(&st);
/// assert!(is_stable(&st));
/// ```
pub fn mark_stable(storage: &Arc<Storage>) {
    let mut stable = STABLE.lock().unwrap_or_else(|e| e.into_inner());
    stable.retain(|s| s.strong_count() > 0);
    if !stable
        .iter()
        .any(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(storage)))
    {
        stable.push(Arc::downgrade(storage));
    }
}

/// Whether `storage` was marked [`mark_stable`].
pub fn is_stable(storage: &Arc<Storage>) -> bool {
    let stable = STABLE.lock().unwrap_or_else(|e| e.into_inner());
    stable
        .iter()
        .any(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(storage)))
}

/// The packed form `kind` of the weight `key`, made by `pack` when absent
/// or stale; without a key it is made afresh (nothing to remember it by).
pub fn packed_or_insert<T: Send + Sync + 'static>(
    key: Option<WeightKey>,
    kind: &'static str,
    pack: impl FnOnce() -> Vec<T>,
) -> Arc<Vec<T>> {
    let pack = || {
        PACKS.with(|n| n.set(n.get() + 1));
        pack()
    };
    let Some(key) = key else {
        return Arc::new(pack());
    };
    let ptr = Arc::as_ptr(key.storage);
    let same = |e: &Entry| {
        e.kind == kind
            && e.offset == key.offset
            && e.dims == key.dims
            && std::ptr::eq(e.storage.as_ptr(), ptr)
    };
    {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = cache.iter().find(|e| same(e) && e.version == key.version) {
            if let Ok(p) = e.packed.clone().downcast::<Vec<T>>() {
                return p;
            }
        }
        // a stale version of this weight, or a dead storage: drop them now
        cache.retain(|e| !same(e) && e.storage.strong_count() > 0);
    }
    let packed = Arc::new(pack());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CAPACITY {
        cache.remove(0);
    }
    cache.push(Entry {
        storage: Arc::downgrade(key.storage),
        offset: key.offset,
        dims: key.dims.to_vec(),
        version: key.version,
        kind,
        packed: packed.clone(),
    });
    packed
}

/// How many packed weights are cached (for tests and `explain`).
pub fn cached_count() -> usize {
    CACHE.lock().unwrap_or_else(|e| e.into_inner()).len()
}
