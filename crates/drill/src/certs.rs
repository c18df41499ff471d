//! Certificates for one run (a drill, a bench, a test): made with rcgen into a directory as
//! PEM files, never committed; the keys die with the run's temporary directory.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The parameters of a CA named `name` (the same name gives the same issuer).
fn authority_params(name: &str) -> anyhow::Result<CertificateParams> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name.push(DnType::CommonName, name);
    Ok(ca)
}

/// A self-signed CA that may sign certificates.
fn authority(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    Ok(CertifiedIssuer::self_signed(
        authority_params(name)?,
        KeyPair::generate()?,
    )?)
}

/// The client CA's name.
const CLIENT_CA: &str = "palisade client CA";

/// Writes `NAME.pem` and `NAME.key` in `dir`: a certificate `issuer` signed with `params`.
fn issue(
    dir: &Path,
    name: &str,
    params: CertificateParams,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> anyhow::Result<()> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem())?;
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
    Ok(())
}

/// A CA of its own and a certificate per node of `nodes` naming `node-N.palisade` (server and
/// client use), as PEM files in `dir`: `ca.pem`, `node-N.pem`, `node-N.key`.
pub fn peer_credentials(dir: &Path, nodes: impl IntoIterator<Item = u64>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let issuer = authority("palisade peer CA")?;
    std::fs::write(dir.join("ca.pem"), issuer.pem())?;
    for node in nodes {
        let mut params = CertificateParams::new(vec![format!("node-{node}.palisade")])?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        issue(dir, &format!("node-{node}"), params, &issuer)?;
    }
    Ok(())
}

/// TLS for a coordinator's (or a store's) client port on loopback, and client certificates,
/// as PEM files in `dir`: `server-ca.pem` signed `server.pem`/`server.key` (valid for
/// 127.0.0.1, ::1 and localhost); `client-ca.pem` (its key in `client-ca.key`, to issue more
/// with [`client_certificate`]) signed `client-P.pem`/`client-P.key` for each principal P of
/// `principals`.
pub fn client_credentials(dir: &Path, principals: &[&str]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let server_ca = authority("palisade server CA")?;
    std::fs::write(dir.join("server-ca.pem"), server_ca.pem())?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        "localhost".to_owned(),
    ])?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    issue(dir, "server", params, &server_ca)?;
    let client_ca = authority(CLIENT_CA)?;
    std::fs::write(dir.join("client-ca.pem"), client_ca.pem())?;
    std::fs::write(dir.join("client-ca.key"), client_ca.key().serialize_pem())?;
    for principal in principals {
        client_certificate(dir, principal, &[])?;
    }
    Ok(())
}

/// Issues `client-P.pem`/`client-P.key` in `dir` from its `client-ca.pem`/`client-ca.key`: a
/// client certificate whose subject's common name is `principal`, also carrying the DNS names
/// `dns_names` (a test uses them to try a client certificate as a member's).
pub fn client_certificate(dir: &Path, principal: &str, dns_names: &[&str]) -> anyhow::Result<()> {
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(dir.join("client-ca.key"))?)?;
    let issuer = rcgen::Issuer::new(authority_params(CLIENT_CA)?, ca_key);
    let key = KeyPair::generate()?;
    let names: Vec<String> = dns_names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, principal);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer)?;
    std::fs::write(dir.join(format!("client-{principal}.pem")), cert.pem())?;
    std::fs::write(
        dir.join(format!("client-{principal}.key")),
        key.serialize_pem(),
    )?;
    Ok(())
}
