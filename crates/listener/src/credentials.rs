//! TLS credentials from PEM files, for the port's TLS ([`crate::Tls`]) and for whoever builds
//! it: certificate chains, private keys, trust anchors and verifiers, and the error that names
//! the file at fault. One crypto provider (ring) for the whole process.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::sign::CertifiedKey;

/// A TLS file or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TlsError {
    /// The file (or the flag) at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl TlsError {
    /// `message` about the file (or flag) `path`.
    pub fn new(path: &Path, message: impl fmt::Display) -> Self {
        Self {
            path: path.to_owned(),
            message: message.to_string(),
        }
    }
}

/// The TLS library's crypto provider (ring; one for the whole process).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM file.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::new(path, e))
}

/// The certificates of a PEM file (at least one).
pub fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::new(path, e))?;
    if chain.is_empty() {
        return Err(TlsError::new(path, "holds no certificate"));
    }
    Ok(chain)
}

/// A certificate chain and its private key, ready to be shown in handshakes.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key_pem: &[u8],
    key_path: &Path,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::new(key_path, e))?;
    let certified = CertifiedKey::from_der(chain, key, &provider())
        .map_err(|e| TlsError::new(key_path, format!("does not fit its certificate: {e}")))?;
    Ok(Arc::new(certified))
}

/// The trust anchors of a CA file.
pub fn roots(
    ca: &[CertificateDer<'static>],
    path: &Path,
) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for authority in ca {
        roots
            .add(authority.clone())
            .map_err(|e| TlsError::new(path, e))?;
    }
    Ok(Arc::new(roots))
}

/// A verifier that accepts exactly the chains ending at `roots`.
pub fn verifier(
    roots: Arc<rustls::RootCertStore>,
    path: &Path,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::new(path, e))
}

/// What the port's TLS needs from a cluster member's peer credentials.
pub struct PeerSide {
    /// The member's certificate chain and key.
    pub key: Arc<CertifiedKey>,
    /// The peer CA's certificates.
    pub ca: Vec<CertificateDer<'static>>,
    /// A verifier of chains ending at the peer CA alone.
    pub verifier: Arc<dyn ClientCertVerifier>,
}
