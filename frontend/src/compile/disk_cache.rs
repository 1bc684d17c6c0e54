//! The on-disk cache of the passes' output: a traced graph's text hashes to
//! the planned graph's text, so a second process compiling the same model
//! skips rewriting and lowering (machine code is not cached on disk: the
//! Cranelift JIT emits into this process's memory; kernels recompile, about
//! 1 ms each).
//!
//! Location: `$KILN_CACHE_DIR`, else `<tmp>/kiln-cache`; `KILN_CACHE_DIR=off`
//! disables it. Entries are keyed by the traced graph text and the identity
//! of the running binary (its path, size and modification time), so a
//! rebuilt kiln never reads an older build's plans. Files are written
//! atomically; an unreadable or unparsable entry is treated as a miss.

use kiln_ir::graph::Graph;
use std::path::PathBuf;

/// The plan cache's directory (None: `KILN_CACHE_DIR=off`).
pub fn dir() -> Option<PathBuf> {
    match std::env::var("KILN_CACHE_DIR") {
        Ok(d) if d == "off" => None,
        Ok(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => Some(std::env::temp_dir().join("kiln-cache")),
    }
}

/// FNV-1a: a stable hash (std's hasher may change between Rust releases).
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn binary_identity() -> String {
    let exe = std::env::current_exe().ok();
    let meta = exe.as_ref().and_then(|e| std::fs::metadata(e).ok());
    let mtime = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{exe:?} {} {mtime}", meta.map_or(0, |m| m.len()))
}

fn path_for(traced: &Graph) -> Option<PathBuf> {
    let text = traced.to_text();
    let h = fnv(binary_identity().as_bytes(), 0xcbf29ce484222325);
    let h = fnv(text.as_bytes(), h);
    Some(dir()?.join(format!("{h:016x}.graph")))
}

/// The planned graph stored for `traced`, if any.
pub fn load(traced: &Graph) -> Option<Graph> {
    let text = std::fs::read_to_string(path_for(traced)?).ok()?;
    let g = Graph::parse(&text).ok()?;
    // the inputs must line up with the traced graph's bindings
    let same_inputs = g.inputs().len() == traced.inputs().len()
        && g.inputs()
            .iter()
            .zip(traced.inputs())
            .all(|(a, b)| g.meta(*a).ok() == traced.meta(*b).ok());
    same_inputs.then_some(g)
}

/// Stores `planned` for `traced` (best effort: a cache that cannot be written is skipped).
pub fn store(traced: &Graph, planned: &Graph) {
    let Some(path) = path_for(traced) else { return };
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    // temp file + rename: readers see a whole entry or none (no fsync: a
    // lost entry is only a miss)
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, planned.to_text()).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
