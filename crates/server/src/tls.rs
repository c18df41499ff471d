//! TLS on the coordinator's one port: its clients (HTTPS and gRPC: `--tls-cert`, `--tls-key`,
//! and `--client-ca` for client certificates) and its cluster peers (`--peer-cert`,
//! `--peer-key`, `--peer-ca`, see [`palisade_cluster::peer_tls`]).
//!
//! One handshake serves both. The certificate the server shows is chosen by the name the
//! client asks for (SNI): members dial each other as `node-N.palisade` and get the member's
//! peer certificate; everyone else gets the client-port certificate. A client certificate is
//! verified against the peer CA and the client CA together during the handshake, and then,
//! once per connection, against each of them alone, so that the two never stand in for each
//! other:
//! - signed by the **peer CA**: the request carries [`PeerCertificates`], which the Raft
//!   service requires (and nothing else honours);
//! - signed by the **client CA**: the request carries [`CertificatePrincipal`], the subject's
//!   common name, which authenticates the caller like a bearer secret ([`crate::auth`]).
//!
//! With client TLS configured the port speaks TLS only (a clear-text request is answered 400
//! `tls_required`), except in a cluster run with `--insecure-peers`, whose members still talk
//! in clear.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use palisade_core::Principal;
use palisade_listener::{ClearText, PeerCertificates};
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use palisade_listener::credentials::{
    certificates, certified_key, provider, read_pem, roots, verifier, TlsError,
};

use palisade_cluster::peer_tls::PeerTls;

/// The principal named by a client certificate the client CA signed (its subject's common
/// name), on every request of that connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificatePrincipal(pub Principal);

/// The client port's credentials (`--tls-cert`, `--tls-key`, `--client-ca`).
pub struct ClientTls {
    key: Arc<CertifiedKey>,
    /// The client CA: its certificates and a verifier of chains ending at it alone.
    client_ca: Option<(Vec<CertificateDer<'static>>, Arc<dyn ClientCertVerifier>)>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("ClientTls")
            .field("client_ca", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Loads and checks the files now (a bad file fails the start, not the first client).
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let chain = certificates(&read_pem(cert)?, cert)?;
        let key = certified_key(chain, &read_pem(key)?, key)?;
        let client_ca = match client_ca {
            None => None,
            Some(path) => {
                let ca = certificates(&read_pem(path)?, path)?;
                let verifier = verifier(roots(&ca, path)?, path)?;
                Some((ca, verifier))
            }
        };
        Ok(Self { key, client_ca })
    }

    /// True when clients may authenticate with certificates (`--client-ca`).
    pub fn verifies_clients(&self) -> bool {
        self.client_ca.is_some()
    }
}

/// Shows the peer certificate to members (who ask for `node-N.palisade`), the client-port
/// certificate to everyone else.
#[derive(Debug)]
struct ByServerName {
    client: Option<Arc<CertifiedKey>>,
    peer: Option<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ByServerName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let to_a_member = hello
            .server_name()
            .is_some_and(|name| name.starts_with("node-") && name.ends_with(".palisade"));
        let (first, second) = if to_a_member {
            (&self.peer, &self.client)
        } else {
            (&self.client, &self.peer)
        };
        first.clone().or_else(|| second.clone())
    }
}

/// The principal a client certificate names: its subject's common name.
fn named_principal(leaf: &CertificateDer<'_>) -> Option<Principal> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let common_name = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Principal::new(common_name).ok()
}

/// The TLS of the coordinator's port, or `None` when it has neither client nor peer TLS.
/// `clear_peers`: cluster members talk in clear (`--insecure-peers`), so clear text stays
/// served even with client TLS.
pub fn listener_tls(
    client: Option<&ClientTls>,
    peer: Option<&PeerTls>,
    clear_peers: bool,
) -> Result<Option<palisade_listener::Tls>, TlsError> {
    if client.is_none() && peer.is_none() {
        return Ok(None);
    }
    let peer = peer.map(PeerTls::side);
    let client_ca = client.and_then(|c| c.client_ca.clone());
    let flag = Path::new("--client-ca");
    if let (Some(peer), Some((ca, _))) = (&peer, &client_ca) {
        if ca.iter().any(|c| peer.ca.contains(c)) {
            return Err(TlsError::new(
                flag,
                "the client CA is the peer CA: a client certificate could then speak as a \
                 cluster member; give clients a CA of their own",
            ));
        }
    }
    let mut anchors: Vec<CertificateDer<'static>> = Vec::new();
    if let Some(peer) = &peer {
        anchors.extend(peer.ca.iter().cloned());
    }
    if let Some((ca, _)) = &client_ca {
        anchors.extend(ca.iter().cloned());
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new(flag, e))?;
    let builder = if anchors.is_empty() {
        builder.with_no_client_auth()
    } else {
        let both = WebPkiClientVerifier::builder_with_provider(roots(&anchors, flag)?, provider());
        // Members must show a certificate; clients may (bearer secrets need none).
        let both = if client.is_some() {
            both.allow_unauthenticated()
        } else {
            both
        };
        builder.with_client_cert_verifier(both.build().map_err(|e| TlsError::new(flag, e))?)
    };
    let mut config = builder.with_cert_resolver(Arc::new(ByServerName {
        client: client.map(|c| c.key.clone()),
        peer: peer.as_ref().map(|p| p.key.clone()),
    }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let identify = identify_by_ca(
        peer.map(|p| p.verifier),
        client_ca.map(|(_, verifier)| verifier),
    );
    let clear_text = if client.is_some() && !clear_peers {
        ClearText::Refuse
    } else {
        ClearText::Serve
    };
    Ok(Some(palisade_listener::Tls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        identify,
        clear_text,
    }))
}

/// What the server makes of a connection's verified client certificates, once per
/// connection: checked against the peer CA alone, then the client CA alone, so that the two
/// never stand in for each other. A member's chain becomes [`PeerCertificates`], a client's
/// the [`CertificatePrincipal`] its common name names.
fn identify_by_ca(
    peer_verifier: Option<Arc<dyn ClientCertVerifier>>,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> palisade_listener::Identify {
    Arc::new(move |chain| {
        let mut extensions = http::Extensions::new();
        let Some((leaf, intermediates)) = chain.split_first() else {
            return extensions;
        };
        let signed_by = |verifier: &Option<Arc<dyn ClientCertVerifier>>| {
            verifier.as_ref().is_some_and(|v| {
                v.verify_client_cert(leaf, intermediates, UnixTime::now())
                    .is_ok()
            })
        };
        if signed_by(&peer_verifier) {
            extensions.insert(PeerCertificates(Arc::new(chain.to_vec())));
        } else if signed_by(&client_verifier) {
            if let Some(principal) = named_principal(leaf) {
                extensions.insert(CertificatePrincipal(principal));
            }
        }
        extensions
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_names_its_principal_by_common_name() {
        let mut params = rcgen::CertificateParams::new(vec!["client.example".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "orders");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            named_principal(cert.der()),
            Some(Principal::new("orders").unwrap())
        );
        // A certificate with no common name names nobody.
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let anonymous = params.self_signed(&key).unwrap();
        assert_eq!(named_principal(anonymous.der()), None);
    }
}
