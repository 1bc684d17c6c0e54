//! Weights packed (transformed) once per parameter version: a kernel called
//! with a [`WeightKey`] reuses the packed form while the weight's storage is
//! the same and its version counter has not moved; an in-place change of
//! the parameter (an optimizer step) bumps the version and so repacks.
//! Convolutions pack on first use ([`packed_or_insert`]); a Linear's
//! row-major weight copy only on the second use of one version
//! ([`packed_on_reuse`]), so training, which uses each version once, holds
//! no copies.
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
//! use kiln_runtime::externs::packed::{packed_or_insert, WeightKey};
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
    /// None: this version was seen once, by [`packed_on_reuse`], not packed.
    packed: Option<Arc<dyn Any + Send + Sync>>,
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
/// use kiln_runtime::externs::packed::{is_stable, mark_stable};
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
    let Some(key) = key else {
        return Arc::new(counted(pack));
    };
    match lookup(key, kind) {
        Lookup::Packed(p) => p,
        Lookup::Seen | Lookup::Absent => insert_packed(key, kind, pack),
    }
}

/// The packed form `kind` of the weight `key` if this version of it was
/// asked for before: None on the first use of a version (the caller
/// transforms the weight for this call only), packed by `pack` and kept on
/// the second, reused after. A weight whose every version is used once — a
/// parameter in training — is never packed or held.
///
/// ```
/// use kiln_runtime::externs::packed::{packed_on_reuse, WeightKey};
/// use kiln_runtime::Storage;
/// use std::sync::Arc;
/// let st = Arc::new(Storage::zeros(kiln_ir::DType::F32, 4));
/// let key = |version| WeightKey { storage: &st, offset: 0, dims: &[4], version };
/// assert!(packed_on_reuse::<f32>(key(0), "demo", || unreachable!()).is_none());
/// let a = packed_on_reuse::<f32>(key(0), "demo", || vec![1.0]).unwrap();
/// let b = packed_on_reuse::<f32>(key(0), "demo", || unreachable!()).unwrap();
/// assert!(Arc::ptr_eq(&a, &b));
/// assert!(packed_on_reuse::<f32>(key(1), "demo", || unreachable!()).is_none());
/// ```
pub fn packed_on_reuse<T: Send + Sync + 'static>(
    key: WeightKey,
    kind: &'static str,
    pack: impl FnOnce() -> Vec<T>,
) -> Option<Arc<Vec<T>>> {
    match lookup(key, kind) {
        Lookup::Packed(p) => Some(p),
        Lookup::Seen => Some(insert_packed(key, kind, pack)),
        Lookup::Absent => {
            insert(key, kind, None);
            None
        }
    }
}

fn counted<T>(pack: impl FnOnce() -> Vec<T>) -> Vec<T> {
    PACKS.with(|n| n.set(n.get() + 1));
    pack()
}

enum Lookup<T> {
    Packed(Arc<Vec<T>>),
    /// This version was seen once and not packed.
    Seen,
    Absent,
}

fn same(e: &Entry, key: &WeightKey, kind: &str) -> bool {
    e.kind == kind
        && e.offset == key.offset
        && e.dims == key.dims
        && std::ptr::eq(e.storage.as_ptr(), Arc::as_ptr(key.storage))
}

/// The entry of this version of `key`; stale versions of it and entries of
/// dead storages are dropped on the way.
fn lookup<T: Send + Sync + 'static>(key: WeightKey, kind: &'static str) -> Lookup<T> {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = cache
        .iter()
        .find(|e| same(e, &key, kind) && e.version == key.version)
    {
        match e.packed.clone().map(|p| p.downcast::<Vec<T>>()) {
            Some(Ok(p)) => return Lookup::Packed(p),
            None => return Lookup::Seen,
            Some(Err(_)) => {}
        }
    }
    cache.retain(|e| !same(e, &key, kind) && e.storage.strong_count() > 0);
    Lookup::Absent
}

fn insert_packed<T: Send + Sync + 'static>(
    key: WeightKey,
    kind: &'static str,
    pack: impl FnOnce() -> Vec<T>,
) -> Arc<Vec<T>> {
    let packed = Arc::new(counted(pack));
    insert(key, kind, Some(packed.clone()));
    packed
}

/// Records `packed` (None: seen, not packed) as this version of `key`,
/// replacing what it had.
fn insert(key: WeightKey, kind: &'static str, packed: Option<Arc<dyn Any + Send + Sync>>) {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache.retain(|e| !same(e, &key, kind));
    if cache.len() >= CAPACITY {
        cache.remove(0);
    }
    cache.push(Entry {
        storage: Arc::downgrade(key.storage),
        offset: key.offset,
        dims: key.dims.to_vec(),
        version: key.version,
        kind,
        packed,
    });
}

/// How many packed weights are cached (for tests and `explain`).
pub fn cached_count() -> usize {
    let cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache.iter().filter(|e| e.packed.is_some()).count()
}
