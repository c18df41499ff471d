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
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::sign::CertifiedKey;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::{ClusterError, NodeId};
use palisade_listener::credentials::{self as tls, PeerSide, TlsError};

/// The name a member's certificate carries (as a DNS subject alternative name).
pub fn node_name(node: NodeId) -> String {
    format!("node-{node}.palisade")
}

/// A member's peer credentials, loaded and checked at start.
pub struct PeerTls {
    key: Arc<CertifiedKey>,
    ca: Vec<CertificateDer<'static>>,
    /// Accepts exactly the chains ending at the peer CA.
    verifier: Arc<dyn ClientCertVerifier>,
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

fn config_error(error: TlsError) -> ClusterError {
    ClusterError::Config(format!("peer TLS: {error}"))
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
        let (cert_pem, key_pem, ca_pem) = (
            tls::read_pem(cert).map_err(config_error)?,
            tls::read_pem(key).map_err(config_error)?,
            tls::read_pem(ca).map_err(config_error)?,
        );
        let chain = tls::certificates(&cert_pem, cert).map_err(config_error)?;
        if !names(&chain[0], own) {
            return Err(ClusterError::Config(format!(
                "peer TLS: {} does not name node {own}: a member's certificate must carry the \
                 DNS name {}",
                cert.display(),
                node_name(own)
            )));
        }
        let certified = tls::certified_key(chain, &key_pem, key).map_err(config_error)?;
        let authorities = tls::certificates(&ca_pem, ca).map_err(config_error)?;
        let verifier = tls::verifier(tls::roots(&authorities, ca).map_err(config_error)?, ca)
            .map_err(config_error)?;
        Ok(Self {
            key: certified,
            ca: authorities,
            verifier,
            ca_pem,
            cert_pem,
            key_pem,
        })
    }

    /// What the port's TLS (`palisade_server::tls::listener_tls`) needs of these credentials.
    pub fn side(&self) -> PeerSide {
        PeerSide {
            key: self.key.clone(),
            ca: self.ca.clone(),
            verifier: self.verifier.clone(),
        }
    }

    /// How to dial member `target`: present this member's certificate, trust only the peer CA,
    /// and require the answer to come from a certificate naming `target`.
    pub fn client_config(&self, target: NodeId) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .domain_name(node_name(target))
    }

    /// Whether a connection's certificates (verified against the peer CA alone, see
    /// `palisade_server::tls`) name `node`.
    pub fn certifies(certificates: &PeerCertificates, node: NodeId) -> bool {
        certificates.0.first().is_some_and(|leaf| names(leaf, node))
    }
}
