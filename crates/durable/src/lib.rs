//! Durable small files, and the directory fsync that makes a new name survive a power cut.
//!
//! A file's own fsync makes its bytes durable, not its name: a file created or renamed into a
//! directory is lost with the directory entry unless the directory is fsynced too. Every small
//! file Palisade keeps (the high-water bound, a witness, a backup, a restore record, the
//! signing key's directory) goes through [`write_file`], so a crash leaves either the old
//! content or the new one under the name, never a torn or missing file.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod appends;
pub mod records;

use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// fsyncs a directory, so that the names created, renamed or removed in it survive a power
/// cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// fsyncs the directory that holds `path` (the current directory for a bare name).
pub fn sync_parent_dir(path: &Path) -> io::Result<()> {
    match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => sync_dir(Path::new(".")),
    }
}

/// Writes `bytes` to `path` durably: into `PATH.tmp`, fsynced, renamed over `path`, and the
/// directory fsynced. When it returns `Ok`, `path` holds `bytes` across a power cut; when it
/// fails or the machine stops midway, `path` still holds what it held before (a leftover
/// `PATH.tmp` is overwritten by the next write).
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    sync_parent_dir(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_content_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bound");
        write_file(&path, b"first").unwrap();
        write_file(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("bound")]);
    }

    #[test]
    fn a_write_that_cannot_finish_leaves_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bound");
        write_file(&path, b"kept").unwrap();
        // The temporary name is taken by a directory: the write fails before the rename.
        std::fs::create_dir(dir.path().join("bound.tmp")).unwrap();
        assert!(write_file(&path, b"lost").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
    }

    #[test]
    fn a_bare_name_syncs_the_current_directory() {
        assert!(sync_parent_dir(Path::new("Cargo.toml")).is_ok());
        assert!(sync_dir(Path::new("/nonexistent/palisade")).is_err());
    }
}
