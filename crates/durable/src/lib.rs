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

/// Creates `dir` (and its parents) if it does not exist, and makes it private: mode 0700,
/// so that only its owner lists or opens what is in it.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    let mut permissions = std::fs::metadata(dir)?.permissions();
    if permissions.mode() & 0o077 != 0 {
        permissions.set_mode(0o700);
        std::fs::set_permissions(dir, permissions)?;
    }
    Ok(())
}

/// Makes every regular file directly in `dir` private (mode 0600): files a library created
/// with the process's umask (a redb store, 0644 by default).
pub fn make_files_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        let mut permissions = metadata.permissions();
        if metadata.is_file() && permissions.mode() & 0o077 != 0 {
            permissions.set_mode(permissions.mode() & 0o700);
            std::fs::set_permissions(entry.path(), permissions)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_directory_and_its_files_are_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("data"), b"x").unwrap();
        std::fs::set_permissions(dir.join("data"), std::fs::Permissions::from_mode(0o644)).unwrap();
        create_private_dir(&dir).unwrap();
        make_files_private(&dir).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("data")), 0o600);
    }

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
