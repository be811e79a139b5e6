//! Atomic file writes: every file the library and the CLI write goes through [`write_atomic`].
//!
//! The content is written to a temporary file in the destination's folder, flushed to disk
//! (`fsync`), and renamed over the destination; the folder is then synced so the rename itself
//! survives a crash. A writer that fails midway (disk full, a crash, an error in the
//! serializer) leaves the previous file exactly as it was and no temporary file behind; a
//! reader never sees a half-written file.
//!
//! ```
//! use ferrofx_core::atomic_file::{write_atomic, write_atomic_bytes};
//! let dir = std::env::temp_dir().join(format!("ferrofx-doc-atomic-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("model.bin");
//! write_atomic_bytes("save", &path, b"first").unwrap();
//! // a writer that fails midway leaves the previous content
//! let e = write_atomic("save", &path, |tmp| {
//!     std::fs::write(tmp, b"partial").unwrap();
//!     Err(ferrofx_core::Error::io("save", "disk full"))
//! });
//! assert!(e.is_err());
//! assert_eq!(std::fs::read(&path).unwrap(), b"first");
//! assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1); // no temporary file left
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The temporary path next to `path` a write goes to first (`.name.tmp-<pid>-<n>`).
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".to_string());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Writes `path` atomically: `write` fills the temporary file whose path it receives; then the
/// file is synced and renamed over `path`. On any error (from `write`, the sync or the rename)
/// the temporary file is removed and `path` is untouched. `op` names the caller in errors.
pub fn write_atomic(op: &str, path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.is_dir() {
        return Err(Error::io(op, format!("cannot write {}: it is a directory; give a file name", path.display())));
    }
    if !dir.is_dir() {
        return Err(Error::io(
            op,
            format!(
                "cannot write {}: the folder {} does not exist; create it first (mkdir -p {})",
                path.display(),
                dir.display(),
                dir.display()
            ),
        ));
    }
    let tmp = temp_path(path);
    let result = write(&tmp).and_then(|()| {
        let io = |what: &str, e: std::io::Error| Error::io(op, format!("cannot {what} {}: {e}", path.display()));
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| io("flush", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("replace", e))?;
        // make the rename durable (best effort: not every platform can open a folder)
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically (see [`write_atomic`]).
pub fn write_atomic_bytes(op: &str, path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(op, path, |tmp| {
        std::fs::write(tmp, bytes).map_err(|e| Error::io(op, format!("cannot write {}: {e}", path.display())))
    })
}

/// Whether two paths name the same file (both exist and share device and inode on Unix; equal
/// canonical paths elsewhere). The CLI refuses to write an output over one of its inputs.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ferrofx-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn replaces_only_on_success() {
        let d = dir("replace");
        let p = d.join("f");
        write_atomic_bytes("t", &p, b"one").unwrap();
        write_atomic_bytes("t", &p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let e = write_atomic("t", &p, |_| Err(Error::io("t", "crash before rename"))).unwrap_err();
        assert!(e.message().contains("crash before rename"));
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn missing_folder_and_directory_targets_are_refused() {
        let d = dir("missing");
        let e = write_atomic_bytes("t", &d.join("no/such/x"), b"1").unwrap_err();
        assert!(e.message().contains("does not exist"), "{e}");
        let e = write_atomic_bytes("t", &d, b"1").unwrap_err();
        assert!(e.message().contains("is a directory"), "{e}");
        assert!(same_file(&d, &d.join(".")));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
