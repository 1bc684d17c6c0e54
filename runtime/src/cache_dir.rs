//! Where kiln's on-disk caches live: one root for every cache (the compile
//! plans, `plans/`; the NVRTC CUBINs, `cuda/`), private to the user.
//!
//! The root is `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln` (an absolute
//! one: the XDG spec says to ignore a relative value), else
//! `$HOME/.cache/kiln`; `KILN_CACHE_DIR=off` turns disk caching off. The
//! folders kiln creates are mode 0700, and a root owned by another user or
//! writable by others is refused (with a warning, once): a cache another
//! user can write could feed this process any plan or kernel.

use std::path::{Path, PathBuf};

/// The cache root from the environment (`var` reads a variable), or `None`
/// when caching is off or no location is known.
///
/// ```
/// use kiln_runtime::cache_dir::root_from;
/// let env = |k: &str| (k == "HOME").then(|| "/home/me".to_string());
/// assert_eq!(root_from(env), Some("/home/me/.cache/kiln".into()));
/// ```
pub fn root_from(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty());
    if let Some(d) = set("KILN_CACHE_DIR") {
        return (d != "off").then(|| PathBuf::from(d));
    }
    if let Some(d) = set("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Some(PathBuf::from(d).join("kiln"));
    }
    set("HOME").map(|h| PathBuf::from(h).join(".cache").join("kiln"))
}

/// The folder `sub` of the cache root from this process's environment,
/// created (mode 0700) and checked to be this user's alone; `None` when
/// caching is off or the folder cannot be used (a warning says why, once
/// per folder).
pub fn subdir(sub: &str) -> Option<PathBuf> {
    let root = root_from(|k| std::env::var(k).ok())?;
    let dir = root.join(sub);
    match ensure_private(&dir) {
        Ok(()) => Some(dir),
        Err(why) => {
            warn_once(&dir, &why);
            None
        }
    }
}

/// Creates `dir` (and missing parents) with mode 0700 and checks that it is
/// owned by this user and not writable by group or others.
pub fn ensure_private(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create it: {e}"))?;
        let m = std::fs::metadata(dir).map_err(|e| format!("cannot read it: {e}"))?;
        let me = current_uid();
        if me.is_some_and(|uid| m.uid() != uid) {
            return Err(format!(
                "it is owned by uid {}, not this user; set KILN_CACHE_DIR to a folder of yours",
                m.uid()
            ));
        }
        if m.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "it is writable by other users (mode {:o}); chmod 700 it or set KILN_CACHE_DIR",
                m.permissions().mode() & 0o777
            ));
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it: {e}"))
    }
}

/// This process's user id, read from `/proc/self` (owned by the real user).
#[cfg(unix)]
fn current_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

fn warn_once(dir: &Path, why: &str) {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(dir.to_path_buf())
    {
        eprintln!(
            "kiln: warning: not using the cache folder {}: {why}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_follows_the_environment() {
        let cases: &[(&[(&str, &str)], Option<&str>)] = &[
            (&[("KILN_CACHE_DIR", "/c"), ("HOME", "/h")], Some("/c")),
            (&[("KILN_CACHE_DIR", "off"), ("HOME", "/h")], None),
            (&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")], Some("/x/kiln")),
            (
                &[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")],
                Some("/h/.cache/kiln"),
            ),
            (
                &[("KILN_CACHE_DIR", ""), ("HOME", "/h")],
                Some("/h/.cache/kiln"),
            ),
            (&[], None),
        ];
        for (vars, want) in cases {
            let got = root_from(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.into()));
            assert_eq!(got, want.map(PathBuf::from), "{vars:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn folders_are_private_and_a_shared_one_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("kiln-cachedir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let sub = d.join("plans");
        ensure_private(&sub).unwrap();
        let mode = std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private(&sub).unwrap_err();
        assert!(e.contains("writable by other users (mode 777)"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
