//! Client credentials from flags and the environment, as every client command reads them:
//! the bearer secret (`--token-file`, `PALISADE_AUTH_TOKEN`) and TLS to the coordinator
//! (`--ca`, `--cert`, `--key`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

/// TLS to the coordinator (for `https://` endpoints).
#[derive(Args, Clone, Default)]
pub struct ClientTlsArgs {
    /// The CA that signed the coordinator's certificate (PEM); needed for https:// endpoints.
    #[arg(long, env = "PALISADE_CA")]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) whose subject's common name is the principal (the
    /// coordinator must trust its CA with --client-ca). Needs --key.
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
}

/// The PEM files of [`ClientTlsArgs`], read.
pub struct ClientTlsFiles {
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTlsArgs {
    pub fn read(&self) -> anyhow::Result<ClientTlsFiles> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path)
                .with_context(|| format!("cannot read the {what} {}", path.display()))
        };
        let ca = self.ca.as_deref().map(|p| read(p, "CA file")).transpose()?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                Some((read(cert, "client certificate")?, read(key, "client key")?))
            }
            _ => None,
        };
        Ok(ClientTlsFiles { ca, identity })
    }

    /// `credentials` with this TLS added.
    pub fn add_to(
        &self,
        mut credentials: palisade_client::Credentials,
    ) -> anyhow::Result<palisade_client::Credentials> {
        let files = self.read()?;
        if let Some(ca) = &files.ca {
            credentials = credentials.with_ca_pem(ca);
        }
        if let Some((cert, key)) = &files.identity {
            credentials = credentials.with_identity_pem(cert, key);
        }
        Ok(credentials)
    }

    /// An HTTP client that trusts --ca (only: no system roots), presents --cert, sends
    /// `bearer` with every request and gives up after `timeout`.
    pub fn http(&self, bearer: Option<&str>, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        let files = self.read()?;
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(secret) = bearer {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {secret}"))
                .context("the token must be printable ASCII")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2));
        if let Some(ca) = &files.ca {
            for certificate in reqwest::Certificate::from_pem_bundle(ca).context("--ca")? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        if let Some((cert, key)) = &files.identity {
            let mut pem = key.clone();
            pem.push(b'\n');
            pem.extend_from_slice(cert);
            builder = builder.identity(reqwest::Identity::from_pem(&pem).context("--cert/--key")?);
        }
        builder.build().context("cannot set up the HTTP client")
    }
}

/// The environment variable of the bearer secret a client command sends.
pub const AUTH_TOKEN_ENV: &str = "PALISADE_AUTH_TOKEN";
/// The environment variable of an ownership (fencing) token: `resource put|activate`,
/// `effects perform`, and what `lock run` gives its command.
pub const FENCE_TOKEN_ENV: &str = "PALISADE_FENCE_TOKEN";

/// The old name of the bearer secret. It also meant the ownership token to `resource put`,
/// `resource activate` and `effects perform`: it is read as the bearer secret only (the
/// documented interface), with a warning naming [`AUTH_TOKEN_ENV`], and refused where it meant
/// an ownership token, naming [`FENCE_TOKEN_ENV`].
pub const OLD_TOKEN_ENV: &str = "PALISADE_TOKEN";

/// The bearer secret a client command sends: from `token_file`, else from PALISADE_AUTH_TOKEN,
/// else from the old PALISADE_TOKEN (with a warning), else none.
pub fn bearer_secret(token_file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    if let Some(path) = token_file {
        let secret = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        let secret = secret.trim();
        anyhow::ensure!(
            !secret.is_empty(),
            "the token file {} is empty",
            path.display()
        );
        return Ok(Some(secret.to_owned()));
    }
    let read = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let old = read(OLD_TOKEN_ENV);
    if old.is_some() {
        tracing::warn!(
            "{OLD_TOKEN_ENV} is read as the bearer secret; its name is now {AUTH_TOKEN_ENV}"
        );
    }
    Ok(read(AUTH_TOKEN_ENV).or(old))
}
