//! Mutual TLS between cluster members (`--peer-cert`, `--peer-key`, `--peer-ca`).
//!
//! Raft traffic shares the client port. A member with peer credentials serves TLS on that port
//! to connections that open a TLS handshake (`palisade_listener::serve_with_tls`) and requires
//! a client certificate signed by the peer CA; clear-text connections are clients. The Raft
//! service accepts a message only over such a connection, and only when the certificate names
//! the node the message claims to come from: DNS name `node-N.palisade` (see [`node_name`]).
//! Members dial each other over TLS presenting their own certificate, and check that the
//! answering member's certificate names the node they meant to reach. The peer CA must be
//! dedicated to the cluster: whoever holds a certificate it signed for `node-N.palisade` can
//! speak as node N.

use std::path::Path;
use std::sync::Arc;

use palisade_listener::PeerCertificates;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::{ClusterError, NodeId};

/// The name a member's certificate carries (as a DNS subject alternative name).
pub fn node_name(node: NodeId) -> String {
    format!("node-{node}.palisade")
}

/// A member's peer credentials, loaded and checked at start.
pub struct PeerTls {
    acceptor: TlsAcceptor,
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("PeerTls")
    }
}

fn config_error(what: impl std::fmt::Display) -> ClusterError {
    ClusterError::Config(format!("peer TLS: {what}"))
}

fn read(path: &Path) -> Result<Vec<u8>, ClusterError> {
    std::fs::read(path).map_err(|e| config_error(format!("{}: {e}", path.display())))
}

/// True when `leaf` (DER) is valid for `node`'s name.
fn names(leaf: &CertificateDer<'_>, node: NodeId) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(node_name(node)) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

impl PeerTls {
    /// Loads member `own`'s certificate chain, key and the peer CA, and checks them now (a bad
    /// file fails the start, not the first connection): the certificate must name `own`.
    pub fn load(own: NodeId, cert: &Path, key: &Path, ca: &Path) -> Result<Self, ClusterError> {
        let (cert_pem, key_pem, ca_pem) = (read(cert)?, read(key)?, read(ca)?);
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| config_error(format!("{}: {e}", cert.display())))?;
        let leaf = chain
            .first()
            .ok_or_else(|| config_error(format!("{} holds no certificate", cert.display())))?;
        if !names(leaf, own) {
            return Err(config_error(format!(
                "{} does not name node {own}: a member's certificate must carry the DNS name {}",
                cert.display(),
                node_name(own)
            )));
        }
        let private_key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| config_error(format!("{}: {e}", key.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for authority in CertificateDer::pem_slice_iter(&ca_pem) {
            let authority =
                authority.map_err(|e| config_error(format!("{}: {e}", ca.display())))?;
            roots
                .add(authority)
                .map_err(|e| config_error(format!("{}: {e}", ca.display())))?;
        }
        if roots.is_empty() {
            return Err(config_error(format!(
                "{} holds no certificate",
                ca.display()
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(config_error)?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, private_key)
            .map_err(config_error)?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            ca_pem,
            cert_pem,
            key_pem,
        })
    }

    /// The acceptor of the member's listener.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// How to dial member `target`: present this member's certificate, trust only the peer CA,
    /// and require the answer to come from a certificate naming `target`.
    pub fn client_config(&self, target: NodeId) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .domain_name(node_name(target))
    }

    /// Whether a connection's verified certificates name `node`.
    pub fn certifies(certificates: &PeerCertificates, node: NodeId) -> bool {
        certificates.0.first().is_some_and(|leaf| names(leaf, node))
    }
}
