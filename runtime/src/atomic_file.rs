//! Atomic file writes that leave nothing behind: the bytes go to a temporary
//! file beside the target (a name no other process or restart can pick:
//! pid plus a random suffix), are synced, and are renamed over the target,
//! so a reader sees the old file or the new one, never half of one. A
//! writer killed mid-write leaves its temporary behind; the next write to
//! the same path removes every temporary whose writer is gone. A name that
//! already exists is retried with another suffix, never an error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` atomically (see the module doc); on error the
/// old file, if any, is intact and the temporary is removed.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("kiln-doc-atomic-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let p = dir.join("x.bin");
/// kiln_runtime::atomic_file::write(&p, b"hello").unwrap();
/// assert_eq!(std::fs::read(&p).unwrap(), b"hello");
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with(path, |f| f.write_all(bytes))
}

/// [`write`] with the content produced by `fill` (called once, on the open
/// temporary file; it may stream).
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path has no file name",
        )
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = name.to_string_lossy();
    remove_stale_temps(&dir, &name);
    let (tmp, mut f) = create_temp(&dir, &name)?;
    let res = (|| {
        fill(&mut f)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // make the rename durable (best effort: not every platform lets a
        // folder be opened and synced)
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// The prefix every temporary for `name` starts with: `.NAME.tmp-`.
fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// Creates `.NAME.tmp-PID-RANDOM` exclusively, retrying on a name collision.
fn create_temp(dir: &Path, name: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut last = None;
    for _ in 0..16 {
        let tmp = dir.join(format!(
            "{}{}-{:016x}",
            temp_prefix(name),
            std::process::id(),
            random_u64()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("the loop ran"))
}

/// Removes temporaries of `name` in `dir` left by writers that are no longer
/// running (their pid is gone; without `/proc`, ones older than an hour).
/// Live writers' temporaries are left alone.
pub fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = temp_prefix(name);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if is_stale(pid, &e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn is_stale(pid: Option<u32>, path: &Path) -> bool {
    let proc = Path::new("/proc");
    match pid {
        Some(p) if proc.is_dir() => !proc.join(p.to_string()).exists(),
        _ => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600),
    }
}

/// 64 random-enough bits: std's per-process random hash keys, the clock and
/// a counter (unpredictable across processes and restarts; not crypto).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kiln-atomic-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_dead_writers_temp_is_removed_by_the_next_write() {
        let d = dir("stale");
        let p = d.join("ck.safetensors");
        // a pid no process has (above the kernel's pid_max of 2^22)
        let stale = d.join(".ck.safetensors.tmp-4194999-00000000deadbeef");
        std::fs::write(&stale, vec![0u8; 1000]).unwrap();
        // a live writer's temp (this process) stays
        let live = d.join(format!(
            ".ck.safetensors.tmp-{}-0000000000000001",
            std::process::id()
        ));
        std::fs::write(&live, b"x").unwrap();
        write(&p, b"new").unwrap();
        assert!(!stale.exists());
        assert!(live.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn temp_names_never_repeat() {
        let a: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(a.len(), 1000);
    }

    #[test]
    fn a_failed_fill_leaves_the_old_file_and_no_temp() {
        let d = dir("fail");
        let p = d.join("f");
        write(&p, b"old").unwrap();
        let e = write_with(&p, |_| Err(std::io::Error::other("disk full")));
        assert!(e.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        let n = std::fs::read_dir(&d).unwrap().count();
        assert_eq!(n, 1, "only the file itself");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
