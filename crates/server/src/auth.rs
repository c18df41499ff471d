//! Who may do what: principals authenticated by bearer secrets, authorised by an ACL.
//!
//! Callers authenticate with a bearer secret (`Authorization: Bearer SECRET`, or gRPC metadata
//! `authorization`) or with a client certificate signed by the client CA (`--client-ca`),
//! whose subject's common name is the principal ([`crate::tls::CertificatePrincipal`]); a
//! request carrying both is the bearer's. Two files, both reloaded on SIGHUP (a file that no longer parses is refused and the previous
//! policy stays in force):
//!
//! ```text
//! # auth file: PRINCIPAL sha256:HEX   (the SHA-256 of the bearer secret; several lines per
//! #            principal let an old and a new secret overlap during rotation)
//! orders   sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//!
//! # ACL file: PRINCIPAL RIGHT SCOPE   (SCOPE: NAME/ for every lock under NAME/, =NAME for
//! #           that one lock, * for every lock; whole path segments: orders/ never grants
//! #           orders-archive/1; any other form is refused at load, naming the line)
//! orders   acquire orders/
//! reports  acquire =report-daily
//! grafana  read    *
//! ops      admin   *
//! ```
//!
//! Rights nest: `admin` (any lease, cluster membership; only with `*`) ⊇ `acquire` (acquire,
//! and renew/release of one's own leases) ⊇ `read` (list, describe, watch). Secrets are
//! high-entropy random strings (`palisade auth new` makes one), so one SHA-256 is the right
//! hash: a slow password hash would cost every request and buys nothing against a 256-bit
//! secret. The auth file may be left out when clients use certificates only. With no files
//! configured the coordinator is open: every caller is `anonymous` with
//! every right, which `palisade serve` allows only on loopback addresses.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use palisade_core::limits::{MAX_ACL_RULES, MAX_AUTH_FILE_BYTES};
use palisade_core::{Lease, LockName, Principal};
use sha2::{Digest as _, Sha256};

use crate::tls::CertificatePrincipal;

/// What a caller may do, on a lock-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Right {
    /// List, describe and watch locks.
    Read,
    /// Acquire locks, and renew or release one's own leases (includes `Read`).
    Acquire,
    /// Anything: any lease, cluster membership (includes `Acquire`).
    Admin,
}

impl Right {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Right::Read),
            "acquire" => Some(Right::Acquire),
            "admin" => Some(Right::Admin),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Acquire => "acquire",
            Right::Admin => "admin",
        }
    }
}

/// A request refused by authentication or authorisation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No credentials, or credentials that name nobody (HTTP 401, gRPC `UNAUTHENTICATED`).
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A known principal without the right (HTTP 403, gRPC `PERMISSION_DENIED`).
    #[error("principal {principal} lacks the {right} right{on}")]
    PermissionDenied {
        /// Who asked.
        principal: Principal,
        /// The right it lacks.
        right: &'static str,
        /// On which lock, as text (" on lock L"), or empty.
        on: String,
    },
}

/// Why an auth or ACL file was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A line breaks the format.
    #[error("{path}:{line}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// The locks one ACL line covers, matched on whole path segments: `jobs/` never grants
/// `jobs-secret` or `jobsadmin/x`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// `*`: every lock.
    Every,
    /// `NAME/` (or `NAME/*`): every lock under `NAME/`; holds the `NAME/`.
    Under(String),
    /// `=NAME`: that one lock.
    Exactly(String),
}

impl Scope {
    /// Parses the third field of an ACL line; an ambiguous one is refused with the fix.
    fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Scope::Every);
        }
        if let Some(name) = text.strip_prefix('=') {
            LockName::new(name).map_err(|e| e.0)?;
            return Ok(Scope::Exactly(name.to_owned()));
        }
        let under = text.strip_suffix('*').unwrap_or(text);
        if under.ends_with('/') && !under.contains('*') {
            // A prefix of a valid lock name is itself a valid lock name.
            LockName::new(under).map_err(|e| e.0)?;
            return Ok(Scope::Under(under.to_owned()));
        }
        Err(format!(
            "{text:?} is ambiguous: rules match whole path segments, so write {:?} for every \
             lock under it, {:?} for that one lock, or * for every lock (a rule without a \
             trailing / used to grant every name starting with it, such as {text}-secret)",
            format!("{}/", text.trim_end_matches(['*', '/'])),
            format!("={}", text.trim_end_matches('*'))
        ))
    }

    fn covers(&self, lock: &LockName) -> bool {
        match self {
            Scope::Every => true,
            Scope::Under(prefix) => lock.as_str().starts_with(prefix.as_str()),
            Scope::Exactly(name) => lock.as_str() == name,
        }
    }
}

/// One ACL line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    right: Right,
    scope: Scope,
}

/// The parsed files.
#[derive(Debug, Default)]
struct Policy {
    /// SHA-256 of a bearer secret → its principal.
    secrets: HashMap<[u8; 32], Principal>,
    /// Each principal's rules, shared with every request it makes (no copy per request).
    rules: HashMap<Principal, Arc<[Rule]>>,
    /// Limits the ACL file sets for a principal (`PRINCIPAL limits
    /// leases=N,waiters=N,watches=N`); the others get [`Limits::default`].
    limits: HashMap<Principal, Limits>,
}

/// What one principal may hold open at once on this coordinator (issue 26, item 10): without
/// them one principal could fill a lock's 1,024 waiter slots, or the lease table, and every
/// other principal would be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Leases held plus acquires queued in the lease table (counted by the lease table, in
    /// the step that grants: exact).
    pub leases: usize,
    /// Acquires in flight (waiting for a lock, or being granted).
    pub waiters: usize,
    /// Open watch streams.
    pub watches: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            leases: 10_000,
            waiters: 128,
            watches: 64,
        }
    }
}

/// Which of a principal's [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limited {
    /// Leases held or awaited.
    Leases,
    /// Acquires in flight.
    Waiters,
    /// Watch streams.
    Watches,
}

impl Limited {
    /// Its name, as in the ACL file and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Limited::Leases => "leases",
            Limited::Waiters => "waiters",
            Limited::Watches => "watches",
        }
    }
}

/// A slot counted against a principal's limit, given back when dropped.
pub struct Slot {
    counts: Arc<std::sync::Mutex<HashMap<(Principal, Limited), usize>>>,
    key: (Principal, Limited),
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().expect("not poisoned");
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// A principal at its limit.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "principal {principal} already has {limit} {} open on this coordinator (its limit; the ACL \
     file sets it with `{principal} limits {}=N`)",
    what.as_str(), what.as_str()
)]
pub struct AtLimit {
    /// Who.
    pub principal: Principal,
    /// Which limit.
    pub what: Limited,
    /// The limit.
    pub limit: usize,
}

fn parse_limits(text: &str) -> Result<Limits, String> {
    let mut limits = Limits::default();
    for part in text.split(',') {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected leases=N, waiters=N or watches=N"))?;
        let value: usize = value
            .parse()
            .ok()
            .filter(|v| (1..=100_000).contains(v))
            .ok_or_else(|| format!("{part:?}: the limit must be 1 to 100000"))?;
        match name {
            "leases" => limits.leases = value,
            "waiters" => limits.waiters = value,
            "watches" => limits.watches = value,
            _ => {
                return Err(format!(
                    "{name:?} is no limit: use leases, waiters or watches"
                ))
            }
        }
    }
    Ok(limits)
}

impl Policy {
    /// `principal`'s rules (none when the ACL does not name it).
    fn rules_of(&self, principal: &Principal) -> Arc<[Rule]> {
        self.rules
            .get(principal)
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }
}

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    principal: Principal,
    /// Authenticated by a client certificate (not a bearer secret).
    by_certificate: bool,
    /// `None`: the coordinator is open (every right).
    rules: Option<Arc<[Rule]>>,
}

impl Caller {
    /// The caller of an open coordinator: `anonymous`, every right.
    pub fn open() -> Self {
        Self {
            principal: Principal::anonymous(),
            by_certificate: false,
            rules: None,
        }
    }

    /// Who it is.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// True when it has `right` on `lock` (`None`: on every lock, as for cluster operations).
    pub fn can(&self, right: Right, lock: Option<&LockName>) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        rules.iter().any(|rule| {
            rule.right >= right
                && match lock {
                    Some(lock) => rule.scope.covers(lock),
                    None => rule.scope == Scope::Every,
                }
        })
    }

    /// `Ok` when it has `right` on `lock` (`None`: on every lock).
    pub fn require(&self, right: Right, lock: Option<&LockName>) -> Result<(), Denied> {
        if self.can(right, lock) {
            return Ok(());
        }
        Err(Denied::PermissionDenied {
            principal: self.principal.clone(),
            right: right.as_str(),
            on: lock.map_or(String::new(), |lock| format!(" on lock {lock}")),
        })
    }

    /// Whom the lease table must check a renew or release against: `None` for an admin (any
    /// lease), else this principal (its own leases only).
    pub fn lease_actor(&self) -> Option<Principal> {
        if self.rules.is_some() && self.can(Right::Admin, None) {
            None
        } else {
            Some(self.principal.clone())
        }
    }

    /// True when a listing may show this lease's id (the capability to renew and release it):
    /// to its own principal or an admin, and never on an open coordinator, where everybody is
    /// `anonymous` and the id is all that protects a lease.
    pub fn sees_lease_id(&self, lease: &Lease) -> bool {
        self.rules.is_some() && (lease.principal == self.principal || self.can(Right::Admin, None))
    }
}

/// The authentication and authorisation policy of one coordinator, shared by its front ends.
pub struct Auth {
    /// The auth file (absent: certificates only) and the ACL file; `None`: open.
    files: Option<(Option<PathBuf>, PathBuf)>,
    policy: RwLock<Arc<Policy>>,
    /// Slots each principal holds against its [`Limits`].
    counts: Arc<std::sync::Mutex<HashMap<(Principal, Limited), usize>>>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret hashes.
        f.debug_struct("Auth").field("files", &self.files).finish()
    }
}

impl Auth {
    /// No authentication: every caller is `anonymous` with every right.
    pub fn open() -> Self {
        Self {
            files: None,
            policy: RwLock::new(Arc::default()),
            counts: Arc::default(),
        }
    }

    /// Loads principals from `auth_file` and rights from `acl_file`.
    pub fn from_files(auth_file: &Path, acl_file: &Path) -> Result<Self, AuthConfigError> {
        Self::load(Some(auth_file), acl_file)
    }

    /// Loads rights from `acl_file`, and principals with bearer secrets from `auth_file` when
    /// given (without it, only client certificates authenticate).
    pub fn load(auth_file: Option<&Path>, acl_file: &Path) -> Result<Self, AuthConfigError> {
        let policy = load(auth_file, acl_file)?;
        Ok(Self {
            files: Some((auth_file.map(Path::to_owned), acl_file.to_owned())),
            policy: RwLock::new(Arc::new(policy)),
            counts: Arc::default(),
        })
    }

    /// `caller`'s limit of `what` under the policy in force; `None` on an open coordinator,
    /// which has no limits: every caller is the same `anonymous`.
    pub fn limit(&self, caller: &Caller, what: Limited) -> Option<usize> {
        self.files.as_ref()?;
        let limits = self
            .policy
            .read()
            .expect("not poisoned")
            .limits
            .get(&caller.principal)
            .copied()
            .unwrap_or_default();
        Some(match what {
            Limited::Leases => limits.leases,
            Limited::Waiters => limits.waiters,
            Limited::Watches => limits.watches,
        })
    }

    /// Counts one `what` against `caller`'s limit, or refuses when it is at it (`None`: an
    /// open coordinator, no limits). Leases are counted by the lease table instead: pass
    /// [`limit`](Self::limit) to the acquire.
    pub fn admit(&self, caller: &Caller, what: Limited) -> Result<Option<Slot>, AtLimit> {
        let Some(limit) = self.limit(caller, what) else {
            return Ok(None);
        };
        let key = (caller.principal.clone(), what);
        let mut counts = self.counts.lock().expect("not poisoned");
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= limit {
            return Err(AtLimit {
                principal: caller.principal.clone(),
                what,
                limit,
            });
        }
        *count += 1;
        Ok(Some(Slot {
            counts: self.counts.clone(),
            key,
        }))
    }

    /// The principal an audit probe's tokens name on `lock`, so that they look like the
    /// tokens of the lock's real owners (a boundary that refuses only the audit's principal
    /// is caught, and one that requires the owners' principal accepts the probe's newer
    /// token): `anonymous` on an open coordinator; else the first principal, by name, that
    /// the ACL lets acquire `lock`, one without `admin` before an admin; `None` when nobody
    /// may acquire it (no real token can name an owner then).
    pub fn probe_principal(&self, lock: &LockName) -> Option<Principal> {
        if self.files.is_none() {
            return Some(Principal::anonymous());
        }
        let policy = self.policy.read().expect("not poisoned").clone();
        let mut owners: Vec<(bool, &Principal)> = policy
            .rules
            .iter()
            .filter(|(_, rules)| {
                rules
                    .iter()
                    .any(|rule| rule.right >= Right::Acquire && rule.scope.covers(lock))
            })
            .map(|(principal, rules)| {
                let admin = rules.iter().any(|rule| rule.right == Right::Admin);
                (admin, principal)
            })
            .collect();
        owners.sort();
        owners.first().map(|(_, principal)| (*principal).clone())
    }

    /// True when callers must authenticate.
    pub fn is_enabled(&self) -> bool {
        self.files.is_some()
    }

    /// Reads both files again; on any error the policy in force stays as it was. Returns the
    /// number of principals and rules now in force.
    pub fn reload(&self) -> Result<(usize, usize), AuthConfigError> {
        let Some((auth_file, acl_file)) = &self.files else {
            return Ok((0, 0));
        };
        let policy = load(auth_file.as_deref(), acl_file)?;
        let counts = (
            policy.secrets.len(),
            policy.rules.values().map(|rules| rules.len()).sum(),
        );
        *self.policy.write().expect("not poisoned") = Arc::new(policy);
        Ok(counts)
    }

    /// The caller presenting `authorization` (the `Authorization` header's value, or gRPC's
    /// `authorization` metadata) on a connection whose client certificate named `certificate`.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        certificate: Option<&CertificatePrincipal>,
    ) -> Result<Caller, Denied> {
        if self.files.is_none() {
            return Ok(Caller::open());
        }
        let Some(header) = authorization else {
            let certificate = certificate.ok_or(Denied::Unauthenticated(
                "this coordinator needs credentials: send Authorization: Bearer SECRET (or \
                 connect over TLS with a client certificate)",
            ))?;
            let principal = certificate.0.clone();
            let policy = self.policy.read().expect("not poisoned").clone();
            return Ok(Caller {
                rules: Some(policy.rules_of(&principal)),
                principal,
                by_certificate: true,
            });
        };
        let secret = header
            .strip_prefix(b"Bearer ")
            .or_else(|| header.strip_prefix(b"bearer "))
            .ok_or(Denied::Unauthenticated(
                "the Authorization header must be Bearer SECRET",
            ))?;
        let digest: [u8; 32] = Sha256::digest(secret.trim_ascii()).into();
        let policy = self.policy.read().expect("not poisoned").clone();
        let principal = policy
            .secrets
            .get(&digest)
            .ok_or(Denied::Unauthenticated("unknown credentials"))?
            .clone();
        Ok(Caller {
            rules: Some(policy.rules_of(&principal)),
            principal,
            by_certificate: false,
        })
    }
}

impl Auth {
    /// `caller` with the rules in force now (SIGHUP may have changed them), or `None` when its
    /// principal was removed: what a long-lived stream checks before each step.
    pub fn refreshed(&self, caller: &Caller) -> Option<Caller> {
        if self.files.is_none() {
            return Some(caller.clone());
        }
        if !self.is_current(caller) {
            return None;
        }
        let policy = self.policy.read().expect("not poisoned");
        Some(Caller {
            rules: Some(policy.rules_of(&caller.principal)),
            ..caller.clone()
        })
    }

    /// True while `caller` is still a principal of the policy in force (a stream authenticated
    /// when it opened stops when its principal is removed by a reload: from the auth file for
    /// a bearer, from the ACL for a certificate). Always true when open.
    pub fn is_current(&self, caller: &Caller) -> bool {
        if self.files.is_none() {
            return true;
        }
        let policy = self.policy.read().expect("not poisoned");
        if caller.by_certificate {
            policy.rules.contains_key(&caller.principal)
        } else {
            policy.secrets.values().any(|p| *p == caller.principal)
        }
    }
}

/// The auth-file line for a bearer `secret`: its SHA-256 as `sha256:HEX`.
pub fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.trim().as_bytes());
    format!("sha256:{}", palisade_core::hex(&digest))
}

fn read_config_file(path: &Path) -> Result<String, AuthConfigError> {
    let io = |source| AuthConfigError::Io {
        path: path.to_owned(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(io)?;
    if metadata.len() > MAX_AUTH_FILE_BYTES {
        return Err(io(std::io::Error::other(format!(
            "is {} bytes; the limit is {MAX_AUTH_FILE_BYTES}",
            metadata.len()
        ))));
    }
    std::fs::read_to_string(path).map_err(io)
}

/// The non-comment lines of `text`, split on whitespace, with their 1-based numbers.
fn lines(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let line = line.split('#').next().unwrap_or("").trim();
        (!line.is_empty()).then(|| (n + 1, line.split_whitespace().collect()))
    })
}

fn load(auth_file: Option<&Path>, acl_file: &Path) -> Result<Policy, AuthConfigError> {
    let auth_text = match auth_file {
        Some(path) => read_config_file(path)?,
        None => String::new(),
    };
    let auth_file = auth_file.unwrap_or(Path::new("(no auth file)"));
    let mut policy = Policy {
        secrets: load_secrets(auth_file, &auth_text)?,
        ..Policy::default()
    };
    let mut rules: HashMap<Principal, Vec<Rule>> = HashMap::new();
    let mut count = 0;
    for (line, fields) in lines(&read_config_file(acl_file)?) {
        let syntax = |message: String| syntax(acl_file, line, message);
        let [name, right, scope] = fields[..] else {
            return Err(syntax(
                "expected: PRINCIPAL read|acquire|admin NAME/ (or =NAME for one lock, or * for \
                 every lock)"
                    .into(),
            ));
        };
        let principal = Principal::new(name).map_err(|e| syntax(e.0))?;
        if right == "limits" {
            let limits = parse_limits(scope).map_err(syntax)?;
            if policy.limits.insert(principal, limits).is_some() {
                return Err(syntax("a second limits line".into()));
            }
            continue;
        }
        let rule = parse_rule(right, scope).map_err(syntax)?;
        count += 1;
        if count > MAX_ACL_RULES {
            return Err(syntax(format!("more than {MAX_ACL_RULES} rules")));
        }
        rules.entry(principal).or_default().push(rule);
    }
    policy.rules = rules
        .into_iter()
        .map(|(principal, rules)| (principal, Arc::from(rules)))
        .collect();
    Ok(policy)
}

/// A syntax error at `line` of `path`.
fn syntax(path: &Path, line: usize, message: String) -> AuthConfigError {
    AuthConfigError::Syntax {
        path: path.to_owned(),
        line,
        message,
    }
}

/// The auth file's lines, `PRINCIPAL sha256:HEX`: each secret's hash → its principal.
fn load_secrets(
    auth_file: &Path,
    text: &str,
) -> Result<HashMap<[u8; 32], Principal>, AuthConfigError> {
    let mut secrets = HashMap::new();
    for (line, fields) in lines(text) {
        let syntax = |message: String| syntax(auth_file, line, message);
        let [name, hash] = fields[..] else {
            return Err(syntax("expected: PRINCIPAL sha256:HEX".into()));
        };
        let principal = Principal::new(name).map_err(|e| syntax(e.0))?;
        let digest = parse_hash(hash).ok_or_else(|| {
            syntax(
                "the secret's hash must be sha256: and 64 hex digits \
                 (palisade auth hash makes it)"
                    .into(),
            )
        })?;
        if let Some(other) = secrets.insert(digest, principal.clone()) {
            if other != principal {
                return Err(syntax(format!(
                    "this secret already names principal {other}"
                )));
            }
        }
    }
    Ok(secrets)
}

/// An ACL rule from its right and scope fields.
fn parse_rule(right: &str, scope: &str) -> Result<Rule, String> {
    let right = Right::parse(right)
        .ok_or_else(|| format!("right {right:?} is unknown; use read, acquire or admin"))?;
    let scope = Scope::parse(scope)?;
    if right == Right::Admin && scope != Scope::Every {
        return Err("admin covers the whole coordinator: its prefix must be *".into());
    }
    Ok(Rule { right, scope })
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
