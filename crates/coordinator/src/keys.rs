//! The coordinator's signing key: created on first start, kept in the data directory, readable
//! by its owner only.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use palisade_core::TokenSigner;

/// File name of the secret key inside the data directory (32 raw bytes).
pub const SIGNING_KEY_FILE: &str = "signing.key";

/// Why the signing key could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Reading or writing the key file failed.
    #[error("signing key {path}: {source}")]
    Io {
        /// The key file.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The key file is readable by others than its owner, or not 32 bytes.
    #[error("signing key {path}: {problem}")]
    Unsafe {
        /// The key file.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

/// Loads the signing key from `data_dir`, creating it (mode 0600, fsynced) on first start.
pub fn load_or_create_signer(data_dir: &Path) -> Result<TokenSigner, KeyError> {
    let path = data_dir.join(SIGNING_KEY_FILE);
    let name = path.display().to_string();
    let io_error = |source| KeyError::Io {
        path: name.clone(),
        source,
    };
    match File::open(&path) {
        Ok(mut file) => {
            let mode = file.metadata().map_err(io_error)?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(KeyError::Unsafe {
                    path: name,
                    problem: format!("mode {:o} lets others read it; chmod 600 it", mode & 0o777),
                });
            }
            let mut bytes = Vec::with_capacity(32);
            file.read_to_end(&mut bytes).map_err(io_error)?;
            let secret: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| KeyError::Unsafe {
                path: name.clone(),
                problem: format!("{} bytes; an Ed25519 secret key is 32", b.len()),
            })?;
            Ok(TokenSigner::from_secret_bytes(&secret))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret).map_err(|e| io_error(io::Error::other(e.to_string())))?;
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io_error)?;
            file.write_all(&secret).map_err(io_error)?;
            file.sync_all().map_err(io_error)?;
            palisade_durable::sync_dir(data_dir).map_err(io_error)?;
            Ok(TokenSigner::from_secret_bytes(&secret))
        }
        Err(error) => Err(io_error(error)),
    }
}

/// Creates the data directory (mode 0700) if it does not exist.
pub fn create_data_dir(data_dir: &Path) -> io::Result<()> {
    fs::create_dir_all(data_dir)?;
    let mut permissions = fs::metadata(data_dir)?.permissions();
    if permissions.mode() & 0o077 != 0 {
        permissions.set_mode(0o700);
        fs::set_permissions(data_dir, permissions)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_created_once_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_signer(dir.path()).unwrap();
        let mode = fs::metadata(dir.path().join(SIGNING_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let second = load_or_create_signer(dir.path()).unwrap();
        assert_eq!(first.key_id(), second.key_id());
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create_signer(dir.path()).unwrap();
        let path = dir.path().join(SIGNING_KEY_FILE);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load_or_create_signer(dir.path()),
            Err(KeyError::Unsafe { .. })
        ));
    }
}
