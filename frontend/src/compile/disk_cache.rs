//! The on-disk cache of the passes' output: a traced graph's text hashes to
//! the planned graph's text, so a second process compiling the same model
//! skips rewriting and lowering (machine code is not cached on disk: the
//! Cranelift JIT emits into this process's memory; kernels recompile, about
//! 1 ms each).
//!
//! Location: `plans/` under the per-user cache root
//! ([`kiln_runtime::cache_dir`]: `$KILN_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`; folders mode 0700, one
//! writable by other users is not used); `KILN_CACHE_DIR=off` disables it.
//! Entries are keyed by the traced graph text and the identity of the
//! running binary (its path, size and modification time), so a rebuilt
//! kiln never reads an older build's plans.
//!
//! An entry cannot lie: its first line carries a content hash of the
//! binary identity, the traced graph and the planned graph, checked on
//! load. An entry that fails the check (edited, truncated, from another
//! build), does not parse or does not match the traced inputs is recomputed
//! with a warning and overwritten. Files are written atomically
//! ([`kiln_runtime::atomic_file`]).

use kiln_ir::graph::Graph;
use std::path::PathBuf;

/// The first word of an entry, then the format version and the content hash.
const MAGIC: &str = "kiln-plan";
const FORMAT: u32 = 1;

/// The plan cache's directory (None: `KILN_CACHE_DIR=off`).
pub fn dir() -> Option<PathBuf> {
    kiln_runtime::cache_dir::subdir("plans")
}

/// FNV-1a: a stable hash (std's hasher may change between Rust releases).
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

const FNV_START: u64 = 0xcbf29ce484222325;

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

fn path_for(traced_text: &str) -> Option<PathBuf> {
    let h = fnv(binary_identity().as_bytes(), FNV_START);
    let h = fnv(traced_text.as_bytes(), h);
    Some(dir()?.join(format!("{h:016x}.graph")))
}

/// The hash an entry for `traced_text` planned as `planned_text` carries.
fn content_hash(traced_text: &str, planned_text: &str) -> u64 {
    let h = fnv(binary_identity().as_bytes(), FNV_START ^ FORMAT as u64);
    let h = fnv(traced_text.as_bytes(), h);
    // a separator no graph text contains, so (a, bc) and (ab, c) differ
    let h = fnv(b"\0--planned--\0", h);
    fnv(planned_text.as_bytes(), h)
}

/// An entry's text: the header line, then the planned graph.
fn encode(traced_text: &str, planned_text: &str) -> String {
    let h = content_hash(traced_text, planned_text);
    format!("{MAGIC} {FORMAT} {h:016x}\n{planned_text}")
}

/// The planned graph text of an entry, or why it is not trusted.
fn decode<'a>(traced_text: &str, entry: &'a str) -> Result<&'a str, String> {
    let (head, planned) = entry.split_once('\n').ok_or("no header line")?;
    let mut words = head.split(' ');
    if words.next() != Some(MAGIC) || words.next() != Some(FORMAT.to_string().as_str()) {
        return Err(format!("not a format-{FORMAT} plan (header `{head}`)"));
    }
    let stored = words.next().and_then(|h| u64::from_str_radix(h, 16).ok());
    let want = content_hash(traced_text, planned);
    if stored != Some(want) {
        return Err(format!(
            "its content hash does not match (stored {}, computed {want:016x}): the file was changed",
            stored.map_or("none".into(), |h| format!("{h:016x}"))
        ));
    }
    Ok(planned)
}

fn warn(path: &std::path::Path, why: &str) {
    eprintln!(
        "kiln: warning: compile cache entry {} rejected ({why}); recompiling it",
        path.display()
    );
}

/// The planned graph stored for `traced`, if any and if it passes the
/// content check (else a warning, and `None`: the caller recomputes).
pub fn load(traced: &Graph) -> Option<Graph> {
    let traced_text = traced.to_text();
    let path = path_for(&traced_text)?;
    let entry = std::fs::read_to_string(&path).ok()?;
    let planned = match decode(&traced_text, &entry) {
        Ok(p) => p,
        Err(why) => {
            warn(&path, &why);
            return None;
        }
    };
    let g = match Graph::parse(planned) {
        Ok(g) => g,
        Err(e) => {
            warn(&path, &format!("it does not parse: {e}"));
            return None;
        }
    };
    // the inputs must line up with the traced graph's bindings
    let same_inputs = g.inputs().len() == traced.inputs().len()
        && g.inputs()
            .iter()
            .zip(traced.inputs())
            .all(|(a, b)| g.meta(*a).ok() == traced.meta(*b).ok());
    if !same_inputs {
        warn(&path, "its inputs differ from the traced graph's");
        return None;
    }
    Some(g)
}

/// Stores `planned` for `traced` (best effort: a cache that cannot be written is skipped).
pub fn store(traced: &Graph, planned: &Graph) {
    let traced_text = traced.to_text();
    let Some(path) = path_for(&traced_text) else {
        return;
    };
    // no fsync needed for correctness (a lost entry is only a miss), but the
    // shared writer syncs anyway; entries are small
    let _ = kiln_runtime::atomic_file::write(
        &path,
        encode(&traced_text, &planned.to_text()).as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_entry_fails_the_content_check() {
        let traced = "graph @f(%0: f32[4]) -> f32[4] {\n  %1 = exp %0 : f32[4]\n  return %1\n}\n";
        let planned = traced;
        let e = encode(traced, planned);
        assert_eq!(decode(traced, &e), Ok(planned));
        let edited = e.replace("exp", "neg");
        let why = decode(traced, &edited).unwrap_err();
        assert!(why.contains("content hash does not match"), "{why}");
        // a plan stored for another traced graph does not pass either
        assert!(decode("graph @g() {}\n", &e).is_err());
        assert!(decode(traced, planned).is_err(), "no header");
    }
}
