//! Where the resource's trusted keys come from, and their refresh.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::token::decode_public_key;
use palisade_core::{KeyId, TokenVerifier};
use palisade_fence::Verifier;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::ResourceError;

/// Refreshes from the coordinator are at least this far apart, so a stream of tokens with an
/// unknown key cannot turn the resource into a load generator against the coordinator.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// How far a token's issue time may be off the resource's clock and still count as signed
/// after a key fetch (see [`KeyRing::ensure_known`]).
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// How often a resource fetches the coordinator's keys even when no token asks for it (drops
/// retired keys).
pub const DEFAULT_KEY_REFRESH: Duration = Duration::from_secs(30);
/// Time allowed for one key fetch.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

/// Where trusted keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// `GET {url}/v1/keys` of the coordinator, at start and when a token names an unknown key.
    Coordinator(String),
    /// A file: the JSON of `GET /v1/keys`, or one base64url public key per line.
    File(PathBuf),
}

/// The trusted keys of a running resource.
pub struct KeyRing {
    source: KeySource,
    /// Keys never trusted, whoever publishes them (an operator's revocation).
    revoked: Vec<KeyId>,
    verifier: Arc<Verifier>,
    http: reqwest::Client,
    /// When the last fetch started (monotonic, and wall-clock ms); `None` before the first.
    last_fetch: Mutex<Option<(Instant, u64)>>,
    /// Times the set of trusted keys changed (a key added, rotated out or revoked), for
    /// `palisade_resource_trusted_key_changes_total`: an unexpected change is a restored
    /// coordinator or a key someone slipped in.
    pub key_changes: prometheus_client::metrics::counter::Counter,
    /// Keys trusted now.
    pub trusted_keys: prometheus_client::metrics::gauge::Gauge,
    /// The ids trusted now, for `/v1/info`.
    trusted_ids: std::sync::Mutex<Vec<String>>,
    /// A CA was given for the coordinator's TLS (a leader's URL is checked like the source's).
    with_ca: bool,
}

impl KeyRing {
    /// Keys from `source`. A coordinator is trusted only over a channel an attacker cannot
    /// write into: `https://` with `coordinator_ca` (PEM; the only roots trusted), or clear
    /// text to a loopback address. A key that arrived any other way could be anybody's.
    pub fn new(
        source: KeySource,
        revoked: Vec<KeyId>,
        verifier: Arc<Verifier>,
        coordinator_ca: Option<&Path>,
    ) -> Result<Self, ResourceError> {
        let mut http = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(FETCH_TIMEOUT);
        if let KeySource::Coordinator(url) = &source {
            check_channel(url, coordinator_ca.is_some()).map_err(ResourceError::Keys)?;
        }
        if let Some(path) = coordinator_ca {
            let pem = std::fs::read(path)
                .map_err(|e| ResourceError::Keys(format!("{}: {e}", path.display())))?;
            let authorities = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ResourceError::Keys(format!("{}: {e}", path.display())))?;
            if authorities.is_empty() {
                return Err(ResourceError::Keys(format!(
                    "{}: holds no certificate",
                    path.display()
                )));
            }
            for authority in authorities {
                http = http.add_root_certificate(authority);
            }
        }
        let http = http
            .build()
            .map_err(|e| ResourceError::Keys(format!("HTTP client: {e}")))?;
        Ok(Self {
            source,
            revoked,
            verifier,
            http,
            last_fetch: Mutex::new(None),
            key_changes: Default::default(),
            trusted_keys: Default::default(),
            trusted_ids: std::sync::Mutex::new(Vec::new()),
            with_ca: coordinator_ca.is_some(),
        })
    }

    /// Loads the keys at start: a key file must be valid; an unreachable coordinator is only
    /// logged (the resource is not ready until keys arrive, and fetches on the first token).
    pub async fn load_initial(&self) -> Result<(), ResourceError> {
        match &self.source {
            KeySource::File(path) => {
                let keys = load_key_file(path).map_err(ResourceError::Keys)?;
                self.install(keys);
            }
            KeySource::Coordinator(url) => {
                let mut last = self.last_fetch.lock().await;
                if let Err(error) = self.fetch(&mut last).await {
                    tracing::warn!(%url, %error, "cannot fetch the coordinator's keys yet");
                }
            }
        }
        Ok(())
    }

    /// Trusts exactly `keys`, less the revoked ones. A key the source stops publishing is
    /// dropped with it (rotation).
    fn install(&self, mut keys: TokenVerifier) {
        for key_id in &self.revoked {
            if keys.distrust(*key_id) {
                tracing::warn!(%key_id, "a revoked key is still published; it is not trusted");
            }
        }
        let ids: Vec<String> = keys.key_ids().iter().map(ToString::to_string).collect();
        self.verifier.replace(keys);
        self.trusted_keys.set(ids.len() as i64);
        let mut trusted = self.trusted_ids.lock().expect("not poisoned");
        if *trusted != ids {
            if !trusted.is_empty() {
                tracing::warn!(before = ?*trusted, now = ?ids, "the trusted keys changed");
            }
            self.key_changes.inc();
            *trusted = ids;
        }
    }

    /// The key ids trusted now.
    pub fn trusted_ids(&self) -> Vec<String> {
        self.trusted_ids.lock().expect("not poisoned").clone()
    }

    /// True once at least one key is trusted.
    pub fn ready(&self) -> bool {
        self.verifier.has_any_key()
    }

    /// Called when a token names `key_id`: fetches the coordinator's keys if the id is unknown.
    /// Fetches are at least [`MIN_REFRESH_INTERVAL`] apart. A token signed after the last fetch
    /// began (by its own `issued_at_ms`, within [`CLOCK_SKEW`]) waits for the next fetch — a
    /// coordinator restored a moment ago signs with a new key — and any fetch that started
    /// after the token arrived answers it: a stream of such tokens costs the coordinator one
    /// fetch per interval, and no caller waits more than one interval and one fetch. A token
    /// signed before the last fetch (whose key that fetch did not have: an old or unknown key)
    /// does not wait. The token is verified afterwards either way; the claimed time only
    /// decides whether to wait, never what is accepted.
    pub async fn ensure_known(&self, key_id: KeyId, issued_at_ms: u64) {
        if self.verifier.knows(key_id) {
            return;
        }
        let arrived = Instant::now();
        let mut last = self.last_fetch.lock().await;
        if self.verifier.knows(key_id) || last.is_some_and(|(at, _)| at >= arrived) {
            return; // fetched while this token waited
        }
        if let Some((at, wall_ms)) = *last {
            if issued_at_ms.saturating_add(CLOCK_SKEW.as_millis() as u64) < wall_ms {
                // Older than the last fetch, which did not have its key.
                if at.elapsed() < MIN_REFRESH_INTERVAL {
                    return;
                }
            } else {
                tokio::time::sleep_until(at + MIN_REFRESH_INTERVAL).await;
            }
        }
        if let Err(error) = self.fetch(&mut last).await {
            tracing::warn!(%error, "key refresh failed");
        }
    }

    /// Fetches the coordinator's keys every `every` until `shutdown`, so a key the coordinator
    /// stops publishing (retired, rotated) is dropped even when no token names a new key.
    pub async fn refresh_periodically(
        self: Arc<Self>,
        every: Duration,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        if !matches!(self.source, KeySource::Coordinator(_)) {
            return;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let mut last = self.last_fetch.lock().await;
            if let Err(error) = self.fetch(&mut last).await {
                tracing::warn!(%error, "periodic key refresh failed");
            }
        }
    }

    /// The claims of `token` for `lock` when it verifies with the trusted keys (and the
    /// principal rules); `None` when it does not (the store then refuses it as invalid).
    pub fn verified(
        &self,
        token: &str,
        lock: &palisade_core::LockName,
    ) -> Option<palisade_core::TokenClaims> {
        self.verifier.verify(token, lock).ok()
    }

    /// Makes sure the key that signed `token` is known, fetching the coordinator's keys when
    /// it names one not trusted yet.
    pub async fn refresh_for(&self, token: &str) {
        if let Ok(claims) = palisade_core::token::decode_unverified(token) {
            self.ensure_known(claims.key_id, claims.issued_at_ms).await;
        }
    }

    /// Asks the coordinator for `lock`'s floor statement (`GET /v1/locks/{lock}/floor`) and
    /// verifies it with the trusted keys (fetching them first when the statement names an
    /// unknown key). `None` when the keys come from a file: there is nobody to ask.
    pub async fn lock_floor(
        &self,
        lock: &palisade_core::LockName,
    ) -> Option<Result<(palisade_core::Epoch, String), String>> {
        let KeySource::Coordinator(url) = &self.source else {
            return None;
        };
        let path = format!("/v1/locks/{}/floor", lock.as_str().replace('/', "%2F"));
        let first = format!("{}{path}", url.trim_end_matches('/'));
        Some(match self.get_floor(&first).await {
            // A cluster member that does not lead names the leader: asked once more there,
            // over a channel held to the same rule as the source's.
            Err(FloorAnswer::NotLeader(Some(leader))) => {
                match check_channel(&leader, self.with_ca) {
                    Ok(()) => {
                        let url = format!("{}{path}", leader.trim_end_matches('/'));
                        match self.get_floor(&url).await {
                            Ok(body) => self.verify_floor(&url, &body, lock).await,
                            Err(answer) => Err(answer.to_string()),
                        }
                    }
                    Err(why) => Err(format!("the leader {leader}: {why}")),
                }
            }
            Err(answer) => Err(answer.to_string()),
            Ok(body) => self.verify_floor(&first, &body, lock).await,
        })
    }

    /// `GET url`: its JSON, or why not (a `not_leader` answer with the leader it names).
    async fn get_floor(&self, url: &str) -> Result<serde_json::Value, FloorAnswer> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| FloorAnswer::Failed(format!("GET {url}: {e}")))?;
        let status = response.status();
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| FloorAnswer::Failed(format!("GET {url}: {status}: {e}")))?;
        if status.is_success() {
            return Ok(body);
        }
        if body["error"] == "not_leader" {
            return Err(FloorAnswer::NotLeader(
                body["leader"].as_str().map(str::to_owned),
            ));
        }
        Err(FloorAnswer::Failed(format!("GET {url}: {status}: {body}")))
    }

    async fn verify_floor(
        &self,
        url: &str,
        body: &serde_json::Value,
        lock: &palisade_core::LockName,
    ) -> Result<(palisade_core::Epoch, String), String> {
        let statement = body["statement"]
            .as_str()
            .ok_or_else(|| format!("GET {url}: no floor statement (an older coordinator?)"))?;
        if let Ok(key_id) = palisade_core::token::floor_key_id(statement) {
            self.ensure_known(key_id, u64::MAX).await;
        }
        self.verifier
            .verify_floor(statement, lock)
            .map(|claims| (claims.floor, statement.to_owned()))
            .map_err(|e| format!("the floor statement from {url} does not verify: {e}"))
    }

    /// Fetches and installs the coordinator's keys now; `last` is the held fetch time.
    async fn fetch(&self, last: &mut Option<(Instant, u64)>) -> Result<(), String> {
        let KeySource::Coordinator(url) = &self.source else {
            return Ok(());
        };
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        *last = Some((Instant::now(), wall_ms));
        let url = format!("{}/v1/keys", url.trim_end_matches('/'));
        let body = self
            .http
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("GET {url}: {e}"))?
            .text()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let keys = parse_keys(&body)?;
        self.install(keys);
        tracing::info!(%url, "trusted keys refreshed");
        Ok(())
    }
}

/// Why a floor could not be read from one member.
enum FloorAnswer {
    /// It does not lead; the leader it names, if any.
    NotLeader(Option<String>),
    /// Anything else.
    Failed(String),
}

/// The coordinator's floors, verified with these keys: what a PostgreSQL fence asks when its
/// database's incarnation changed (`PostgresFence::with_floors`). Keys from a file: nobody to
/// ask, an error.
impl palisade_fence::FloorSource for KeyRing {
    fn floor<'a>(
        &'a self,
        lock: &'a palisade_core::LockName,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<palisade_core::Epoch, String>> + Send + 'a>,
    > {
        Box::pin(async move { self.floor_statement(lock).await.map(|(floor, _)| floor) })
    }

    fn floor_statement<'a>(
        &'a self,
        lock: &'a palisade_core::LockName,
    ) -> palisade_fence::FloorStatementFuture<'a> {
        Box::pin(async move {
            match self.lock_floor(lock).await {
                Some(answer) => answer.map(|(floor, statement)| (floor, Some(statement))),
                None => Err(
                    "the keys come from a file: there is no coordinator to ask for floors".into(),
                ),
            }
        })
    }
}

impl std::fmt::Display for FloorAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FloorAnswer::NotLeader(_) => {
                f.write_str("the coordinator does not lead, nor knows who does")
            }
            FloorAnswer::Failed(why) => f.write_str(why),
        }
    }
}

/// Whether keys may be fetched from `url`: over TLS with a CA given, or in clear to loopback.
fn check_channel(url: &str, with_ca: bool) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("coordinator URL {url:?}: {e}"))?;
    match parsed.scheme() {
        "https" if with_ca => Ok(()),
        "https" => Err(format!(
            "{url} is https: give the CA that signed the coordinator's certificate (--ca)"
        )),
        "http" if is_loopback(&parsed) => Ok(()),
        "http" => Err(format!(
            "{url} is neither https nor a loopback address: keys fetched in clear could be \
             replaced on the way, and a forged key admits forged tokens. Use https:// with \
             --ca, or pin the keys with --trust-key"
        )),
        other => Err(format!(
            "coordinator URL {url:?}: scheme {other:?} is not http(s)"
        )),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// Reads a key file: the JSON of `GET /v1/keys`, or one base64url key per line.
pub fn load_key_file(path: &Path) -> Result<TokenVerifier, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_keys(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses keys: the JSON of `GET /v1/keys`, or one base64url key per line.
pub fn parse_keys(text: &str) -> Result<TokenVerifier, String> {
    let encoded: Vec<String> = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(json) => json["keys"]
            .as_array()
            .ok_or("JSON without a \"keys\" array")?
            .iter()
            .map(|k| k["public_key"].as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or("a key without \"public_key\"")?,
        Err(_) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect(),
    };
    if encoded.is_empty() {
        return Err("no keys".into());
    }
    let keys = encoded
        .iter()
        .map(|k| decode_public_key(k).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TokenVerifier::new(keys))
}

#[cfg(test)]
mod tests {
    use palisade_core::token::encode_public_key;
    use palisade_core::TokenSigner;

    use super::*;

    #[test]
    fn keys_parse_from_json_or_lines() {
        let key = TokenSigner::from_secret_bytes(&[4; 32]);
        let encoded = encode_public_key(&key.verifying_key());
        let json = format!(r#"{{"keys":[{{"key_id":"x","public_key":"{encoded}"}}]}}"#);
        assert!(parse_keys(&json).unwrap().knows(key.key_id()));
        let lines = format!("# coordinator\n{encoded}\n");
        assert!(parse_keys(&lines).unwrap().knows(key.key_id()));
        assert!(parse_keys("").is_err());
        assert!(parse_keys("not-a-key").is_err());
    }

    #[test]
    fn p4_keys_come_only_over_tls_with_a_ca_or_from_loopback() {
        for url in [
            "http://127.0.0.1:7420",
            "http://127.9.9.9:1",
            "http://[::1]:7420",
            "http://localhost:7420",
        ] {
            assert!(check_channel(url, false).is_ok(), "{url}");
        }
        assert!(check_channel("https://coordinator.example:7420", true).is_ok());
        let clear = check_channel("http://10.0.0.5:7420", false).unwrap_err();
        assert!(clear.contains("--trust-key"), "{clear}");
        // A CA does not make clear text safe.
        assert!(check_channel("http://10.0.0.5:7420", true).is_err());
        let no_ca = check_channel("https://10.0.0.5:7420", false).unwrap_err();
        assert!(no_ca.contains("--ca"), "{no_ca}");
        assert!(check_channel("ftp://127.0.0.1", false).is_err());
        assert!(check_channel("not a url", false).is_err());
    }
}
