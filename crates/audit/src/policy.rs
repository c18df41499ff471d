//! The lock policy: which locks are correctness-critical, where each critical lock's writes are
//! fenced (its *boundary*), and what happens when that boundary cannot enforce (the
//! *fallback*). Pure: parsing, validation and classification, no I/O.
//!
//! ```toml
//! default_class = "efficiency"          # the class of a lock no rule names
//!
//! [[lock]]
//! pattern = "report/*"                  # `*` matches any run of characters, `/` included
//! class = "critical"
//! boundary = { kind = "postgres", table = "report_result", url = "postgres://app@127.0.0.1/app" }
//!
//! [[lock]]
//! pattern = "invoice/*"
//! class = "critical"
//! boundary = { kind = "resource", url = "http://127.0.0.1:7430" }
//!
//! [[lock]]
//! pattern = "payout/*"
//! class = "critical"
//! boundary = { kind = "effects", url = "http://127.0.0.1:7430", capability = "none" }
//! fallback = "review"                   # review | compensate | accept-duplicates (+ reason)
//!
//! [[lock]]
//! pattern = "cache/*"
//! class = "efficiency"
//! ```
//!
//! Rules are tried in file order; the first whose pattern matches the lock decides.

use std::fmt;

use palisade_core::LockClass;
use serde::{Deserialize, Serialize};

/// Largest policy file accepted.
pub const MAX_POLICY_BYTES: usize = 256 * 1024;
/// Most rules in one policy.
pub const MAX_RULES: usize = 1_024;
/// Longest pattern (a lock name is at most 256 bytes; a pattern a little more for its `*`s).
pub const MAX_PATTERN_BYTES: usize = 512;
/// The prefix of the locks the audit's probe uses. No user lock should start with it.
pub const PROBE_LOCK_PREFIX: &str = "palisade-probe/";

/// Why a policy file was refused. The previous policy (if any) stays in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy: {0}")]
pub struct PolicyError(pub String);

/// A lock policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// The class of a lock no rule names.
    pub default_class: LockClass,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
}

/// One `[[lock]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// The lock-name pattern.
    pub pattern: Pattern,
    /// The class of the locks it matches.
    pub class: LockClass,
    /// Where writes under these locks are fenced (critical locks need one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary: Option<Boundary>,
    /// What happens when the boundary's receiver cannot enforce the fence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// Why duplicates are acceptable (required with `accept-duplicates`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a critical lock's final writes are checked against its epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Boundary {
    /// A Palisade reference store (`palisade resource serve`).
    Resource {
        /// Its base URL, `http://HOST:PORT`.
        url: String,
    },
    /// A table guarded by the PostgreSQL adapter (`GuardedTable::install_guard`).
    Postgres {
        /// The table (`name` or `schema.name`).
        table: String,
        /// How to reach the database.
        url: String,
        /// Roles trusted to write the table besides its owner and the role `url` connects
        /// as: the fence role given to `PostgresFence::connect` (docs/enforcement.md). Any
        /// other role that can write it is a critical finding.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        writers: Vec<String>,
    },
    /// An effects ledger (the reference store's `/v1/effects`) and its receiver.
    Effects {
        /// The ledger's base URL (the reference store's).
        url: String,
        /// What the receiver can do about a repeated request.
        capability: Capability,
        /// The receiver's name, for people.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        receiver: Option<String>,
    },
}

impl Boundary {
    /// `resource`, `postgres` or `effects`.
    pub fn kind(&self) -> &'static str {
        match self {
            Boundary::Resource { .. } => "resource",
            Boundary::Postgres { .. } => "postgres",
            Boundary::Effects { .. } => "effects",
        }
    }

    /// Where it is, for people; a PostgreSQL password is never shown.
    pub fn describe(&self) -> String {
        match self {
            Boundary::Resource { url } => format!("resource {url}"),
            Boundary::Postgres { table, url, .. } => {
                format!("postgres table {table} at {}", redact_url(url))
            }
            Boundary::Effects {
                url,
                capability,
                receiver,
            } => match receiver {
                Some(receiver) => {
                    format!("effects ledger {url}, receiver {receiver} ({capability})")
                }
                None => format!("effects ledger {url} ({capability})"),
            },
        }
    }

    /// The boundary with any password in its URL replaced by `***`, for the API and the
    /// console.
    pub fn redacted(&self) -> Boundary {
        match self {
            Boundary::Postgres {
                table,
                url,
                writers,
            } => Boundary::Postgres {
                table: table.clone(),
                url: redact_url(url),
                writers: writers.clone(),
            },
            other => other.clone(),
        }
    }
}

/// Connection parameters whose value is a secret or names where one is kept: libpq's
/// `password`, `sslpassword` and `passfile` (a path is redacted too: it says where the
/// credentials are).
const SECRET_PARAMETERS: &[&str] = &["password", "sslpassword", "passfile"];

/// A URL as it may be shown to anyone with `read`: the password of `scheme://user:secret@…`
/// and the value of every credential parameter libpq accepts in the query (`?password=…`,
/// `sslpassword=…`, `passfile=…`, names compared after percent-decoding, as libpq does)
/// replaced by `***`. Anything else is unchanged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(at) => before_query.split_at(at),
        None => (before_query, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _secret)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let mut shown = format!("{scheme}://{authority}{path}");
    if let Some(query) = query {
        shown.push('?');
        let parameters: Vec<String> = query.split('&').map(redact_parameter).collect();
        shown.push_str(&parameters.join("&"));
    }
    shown
}

/// `name=value` with the value replaced when `name` (percent-decoded) is a credential.
fn redact_parameter(parameter: &str) -> String {
    let (name, _value) = parameter.split_once('=').unwrap_or((parameter, ""));
    let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    let secret = SECRET_PARAMETERS
        .iter()
        .any(|secret| decoded.trim().eq_ignore_ascii_case(secret));
    if secret {
        format!("{name}=***")
    } else {
        parameter.to_owned()
    }
}

/// A receiver's capability (docs/effects.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// Deduplicates by idempotency key: retried safely.
    Idempotent,
    /// Answers "did you perform it?" and refuses late requests.
    Lookup,
    /// Neither: it cannot enforce anything, so the rule needs a fallback.
    None,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Capability::Idempotent => "idempotent",
            Capability::Lookup => "lookup",
            Capability::None => "none",
        })
    }
}

/// What happens to an effect whose outcome the receiver cannot establish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// A person decides from the receiver's own records.
    Review,
    /// A compensating action undoes a duplicate.
    Compensate,
    /// Duplicates are tolerated (the rule must say why).
    AcceptDuplicates,
}

/// A lock-name pattern: literal text, where `*` matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Checks a pattern: non-empty, printable ASCII, at most [`MAX_PATTERN_BYTES`].
    pub fn new(text: &str) -> Result<Self, PolicyError> {
        if text.is_empty() {
            return Err(PolicyError("a pattern is empty".into()));
        }
        if text.len() > MAX_PATTERN_BYTES {
            return Err(PolicyError(format!(
                "pattern {:?}… is longer than {MAX_PATTERN_BYTES} bytes",
                &text[..32]
            )));
        }
        if let Some(c) = text.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(PolicyError(format!(
                "pattern {text:?} contains {c:?}; lock names are printable ASCII without spaces"
            )));
        }
        Ok(Self(text.to_owned()))
    }

    /// The pattern's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches: linear-time glob matching with backtracking to the last `*`
    /// only (no exponential blow-up on patterns like `*a*a*a*b`).
    pub fn matches(&self, name: &str) -> bool {
        let (p, n) = (self.0.as_bytes(), name.as_bytes());
        let (mut pi, mut ni) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ni < n.len() {
            if pi < p.len() && p[pi] == b'*' {
                star = Some((pi, ni));
                pi += 1;
            } else if pi < p.len() && p[pi] == n[ni] {
                pi += 1;
                ni += 1;
            } else if let Some((star_p, star_n)) = star {
                pi = star_p + 1;
                ni = star_n + 1;
                star = Some((star_p, star_n + 1));
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
}

impl Serialize for Pattern {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the policy says about one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified<'a> {
    /// The lock's class.
    pub class: LockClass,
    /// The rule that decided, if any (else the default class applied, or the request's).
    pub rule: Option<&'a Rule>,
}

impl Classified<'_> {
    /// The boundary the deciding rule names.
    pub fn boundary(&self) -> Option<&Boundary> {
        self.rule.and_then(|rule| rule.boundary.as_ref())
    }
}

/// Why an acquire was refused by the policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyRefusal {
    /// The client said `efficiency` for a lock the policy says is critical.
    #[error(
        "lock {lock} is critical by the policy's rule {pattern:?}; the request said efficiency. \
         Drop the class from the request, or change the policy"
    )]
    Downgrade {
        /// The lock.
        lock: String,
        /// The rule's pattern.
        pattern: String,
    },
    /// `--require-policy`: a critical lock whose policy names no boundary.
    #[error(
        "lock {lock} is critical and the policy names no boundary for it (where its writes are \
         fenced); the coordinator runs with --require-policy. Add a [[lock]] rule with a \
         boundary, or class the lock efficiency"
    )]
    NoBoundary {
        /// The lock.
        lock: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    default_class: Option<String>,
    #[serde(default)]
    lock: Vec<RuleFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    pattern: String,
    class: String,
    #[serde(default)]
    boundary: Option<Boundary>,
    #[serde(default)]
    fallback: Option<Fallback>,
    #[serde(default)]
    reason: Option<String>,
}

impl Policy {
    /// No rules; every lock is critical unless its acquire says otherwise (the behaviour
    /// without a policy file).
    pub fn none() -> Self {
        Self {
            default_class: LockClass::Critical,
            rules: Vec::new(),
        }
    }

    /// Parses and checks a policy file's text.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(PolicyError(format!(
                "the file is {} bytes; the limit is {MAX_POLICY_BYTES}",
                text.len()
            )));
        }
        let file: PolicyFile = toml::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        if file.lock.len() > MAX_RULES {
            return Err(PolicyError(format!(
                "{} rules; the limit is {MAX_RULES}",
                file.lock.len()
            )));
        }
        let class = |text: &str, at: &str| {
            LockClass::parse(text).map_err(|e| PolicyError(format!("{at}: {}", e.0)))
        };
        let default_class = match &file.default_class {
            Some(text) => class(text, "default_class")?,
            None => LockClass::Critical,
        };
        let mut rules = Vec::with_capacity(file.lock.len());
        for (index, rule) in file.lock.into_iter().enumerate() {
            let at = format!("[[lock]] #{} ({:?})", index + 1, rule.pattern);
            let rule = Rule {
                pattern: Pattern::new(&rule.pattern)
                    .map_err(|e| PolicyError(format!("{at}: {}", e.0)))?,
                class: class(&rule.class, &at)?,
                boundary: rule.boundary,
                fallback: rule.fallback,
                reason: rule.reason,
            };
            check_rule(&rule).map_err(|message| PolicyError(format!("{at}: {message}")))?;
            rules.push(rule);
        }
        Ok(Self {
            default_class,
            rules,
        })
    }

    /// The rule that decides `lock` (the first that matches).
    pub fn rule_for(&self, lock: &str) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.pattern.matches(lock))
    }

    /// The class of `lock` when its acquire asks for `requested` (`None`: the request names no
    /// class). A matching rule decides (a request for `efficiency` on a critical lock is
    /// refused: its client believes duplicates are harmless); otherwise the request's class,
    /// else the default. With `require_boundary`, a critical lock with no boundary is refused.
    pub fn classify(
        &self,
        lock: &str,
        requested: Option<LockClass>,
        require_boundary: bool,
    ) -> Result<Classified<'_>, PolicyRefusal> {
        let rule = self.rule_for(lock);
        let class = match rule {
            Some(rule) => {
                if rule.class == LockClass::Critical && requested == Some(LockClass::Efficiency) {
                    return Err(PolicyRefusal::Downgrade {
                        lock: lock.to_owned(),
                        pattern: rule.pattern.0.clone(),
                    });
                }
                rule.class
            }
            None => requested.unwrap_or(self.default_class),
        };
        let classified = Classified { class, rule };
        if require_boundary
            && class == LockClass::Critical
            && classified.boundary().is_none()
            && !lock.starts_with(PROBE_LOCK_PREFIX)
        {
            return Err(PolicyRefusal::NoBoundary {
                lock: lock.to_owned(),
            });
        }
        Ok(classified)
    }

    /// The policy as the API shows it: passwords redacted.
    pub fn redacted(&self) -> Policy {
        Policy {
            default_class: self.default_class,
            rules: self
                .rules
                .iter()
                .map(|rule| Rule {
                    boundary: rule.boundary.as_ref().map(Boundary::redacted),
                    ..rule.clone()
                })
                .collect(),
        }
    }
}

/// Most roles a PostgreSQL boundary may trust to write besides its owner.
const MAX_WRITERS: usize = 16;

fn check_url(url: &str, what: &str, schemes: &[&str]) -> Result<(), String> {
    if schemes.iter().any(|scheme| {
        url.strip_prefix(scheme)
            .is_some_and(|rest| !rest.is_empty())
    }) {
        Ok(())
    } else {
        Err(format!(
            "{what} URL {:?} must start with {}",
            redact_url(url),
            schemes.join(" or ")
        ))
    }
}

fn check_rule(rule: &Rule) -> Result<(), String> {
    match &rule.boundary {
        Some(Boundary::Resource { url }) => check_url(url, "resource", &["http://"])?,
        Some(Boundary::Effects { url, .. }) => check_url(url, "effects ledger", &["http://"])?,
        Some(Boundary::Postgres {
            table,
            url,
            writers,
        }) => {
            check_url(url, "postgres", &["postgres://", "postgresql://"])?;
            palisade_fence_postgres::quote_identifier(table).map_err(|e| e.to_string())?;
            if writers.len() > MAX_WRITERS {
                return Err(format!("more than {MAX_WRITERS} writers"));
            }
            if let Some(bad) = writers
                .iter()
                .find(|w| w.is_empty() || w.len() > 63 || w.chars().any(char::is_control))
            {
                return Err(format!("writer {bad:?} is not a PostgreSQL role name"));
            }
        }
        None => {}
    }
    if rule.class == LockClass::Efficiency && rule.boundary.is_some() {
        return Err(
            "an efficiency lock names a boundary: if its writes must be fenced, class it \
             critical"
                .into(),
        );
    }
    if rule.fallback == Some(Fallback::AcceptDuplicates)
        && rule.reason.as_deref().is_none_or(|r| r.trim().is_empty())
    {
        return Err("fallback = \"accept-duplicates\" needs a reason = \"…\"".into());
    }
    if rule.fallback.is_some() && rule.class == LockClass::Efficiency {
        return Err("a fallback is for critical locks; this rule is efficiency".into());
    }
    if let Some(reason) = &rule.reason {
        if reason.len() > 1_024 {
            return Err("the reason is longer than 1024 bytes".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
default_class = "efficiency"

[[lock]]
pattern = "report/*"
class = "critical"
boundary = { kind = "postgres", table = "report_result", url = "postgres://app:hunter2@127.0.0.1/app" }

[[lock]]
pattern = "payout/*"
class = "critical"
boundary = { kind = "effects", url = "http://127.0.0.1:7430", capability = "none" }
fallback = "review"

[[lock]]
pattern = "bare/*"
class = "critical"
"#;

    #[test]
    fn the_documented_example_parses_and_classifies() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        assert_eq!(policy.default_class, LockClass::Efficiency);
        let report = policy.classify("report/7", None, true).unwrap();
        assert_eq!(report.class, LockClass::Critical);
        assert_eq!(report.boundary().unwrap().kind(), "postgres");
        let other = policy.classify("cache/1", None, true).unwrap();
        assert_eq!((other.class, other.rule), (LockClass::Efficiency, None));
        // The request's class applies where no rule speaks.
        let asked = policy
            .classify("cache/1", Some(LockClass::Critical), false)
            .unwrap();
        assert_eq!(asked.class, LockClass::Critical);
    }

    #[test]
    fn a_critical_lock_cannot_be_acquired_as_efficiency() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        let refusal = policy
            .classify("report/7", Some(LockClass::Efficiency), false)
            .unwrap_err();
        assert!(matches!(refusal, PolicyRefusal::Downgrade { .. }));
        // Asking critical for a lock the policy calls efficiency is harmless: the rule decides.
        let policy =
            Policy::parse("[[lock]]\npattern = \"c/*\"\nclass = \"efficiency\"\n").unwrap();
        let classified = policy
            .classify("c/1", Some(LockClass::Critical), true)
            .unwrap();
        assert_eq!(classified.class, LockClass::Efficiency);
    }

    #[test]
    fn require_policy_refuses_critical_locks_without_a_boundary() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        assert!(policy.classify("bare/1", None, false).is_ok());
        assert!(matches!(
            policy.classify("bare/1", None, true),
            Err(PolicyRefusal::NoBoundary { .. })
        ));
        // Unmatched, asked critical: no boundary either.
        assert!(policy
            .classify("x", Some(LockClass::Critical), true)
            .is_err());
        // The audit's own probe locks are never refused.
        assert!(policy
            .classify("palisade-probe/resource-1", Some(LockClass::Critical), true)
            .is_ok());
        // Without a policy file every lock is critical and has no boundary.
        assert!(Policy::none().classify("x", None, true).is_err());
        assert_eq!(
            Policy::none().classify("x", None, false).unwrap().class,
            LockClass::Critical
        );
    }

    #[test]
    fn bad_policies_are_refused_with_the_rule_named() {
        for (text, expect) in [
            ("default_class = \"bogus\"", "bogus"),
            ("[[lock]]\npattern = \"a\"\nclass = \"critical\"\nextra = 1", "extra"),
            ("[[lock]]\npattern = \"\"\nclass = \"critical\"", "empty"),
            ("[[lock]]\npattern = \"a b\"\nclass = \"critical\"", "' '"),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"critical\"\nfallback = \"accept-duplicates\"",
                "needs a reason",
            ),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"efficiency\"\nboundary = { kind = \"resource\", url = \"http://x\" }",
                "class it critical",
            ),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"critical\"\nboundary = { kind = \"resource\", url = \"ftp://x\" }",
                "must start with",
            ),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"critical\"\nboundary = { kind = \"postgres\", table = \"t; drop\", url = \"postgres://x\" }",
                "plain identifier",
            ),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"critical\"\nboundary = { kind = \"redis\", url = \"http://x\" }",
                "redis",
            ),
            (
                "[[lock]]\npattern = \"a\"\nclass = \"critical\"\nboundary = { kind = \"effects\", url = \"http://x\", capability = \"maybe\" }",
                "maybe",
            ),
        ] {
            let error = Policy::parse(text).unwrap_err();
            assert!(error.0.contains(expect), "{text:?}: {error}");
        }
        let huge = format!("# {}", "x".repeat(MAX_POLICY_BYTES));
        assert!(Policy::parse(&huge).unwrap_err().0.contains("limit"));
    }

    #[test]
    fn passwords_are_redacted_for_display() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        let shown = serde_json::to_string(&policy.redacted()).unwrap();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("app:***@127.0.0.1/app"), "{shown}");
        assert!(!policy.rules[0]
            .boundary
            .as_ref()
            .unwrap()
            .describe()
            .contains("hunter2"));
        assert_eq!(redact_url("http://h:1/x"), "http://h:1/x");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }

    /// Every form in which libpq takes a credential in a URL is redacted (issue 26, item 7).
    #[test]
    fn every_credential_form_libpq_accepts_is_redacted() {
        let cases = [
            (
                "postgres://app:hunter2@h:5432/db",
                "postgres://app:***@h:5432/db",
            ),
            (
                "postgres://h/db?user=app&password=hunter2",
                "postgres://h/db?user=app&password=***",
            ),
            (
                "postgresql://h/db?sslmode=require&sslpassword=hunter2",
                "postgresql://h/db?sslmode=require&sslpassword=***",
            ),
            (
                "postgres://h/db?passfile=/secret/hunter2.pgpass",
                "postgres://h/db?passfile=***",
            ),
            // libpq percent-decodes parameter names: `pass%77ord` is `password`.
            (
                "postgres://h/db?pass%77ord=hunter2",
                "postgres://h/db?pass%77ord=***",
            ),
            (
                "postgres://h/db?PASSWORD=hunter2",
                "postgres://h/db?PASSWORD=***",
            ),
            // No path, a query straight after the host; and both forms at once.
            (
                "postgres://app:hunter2@h?password=hunter2",
                "postgres://app:***@h?password=***",
            ),
            // A `/` or `@` inside the query does not move the authority.
            ("postgres://h?password=a/b@c", "postgres://h?password=***"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("hunter2"), "{url}");
        }
        let policy = Policy::parse(
            "[[lock]]\npattern = \"r/*\"\nclass = \"critical\"\n\
             boundary = { kind = \"postgres\", table = \"t\", \
             url = \"postgres://127.0.0.1/app?user=app&password=hunter2\" }\n",
        )
        .unwrap();
        let shown = serde_json::to_string(&policy.redacted()).unwrap();
        assert!(!shown.contains("hunter2"), "{shown}");
        let described = policy.rules[0].boundary.as_ref().unwrap().describe();
        assert!(!described.contains("hunter2"), "{described}");
    }

    #[test]
    fn patterns_match_like_globs() {
        let cases = [
            ("report/*", "report/7", true),
            ("report/*", "report/", true),
            ("report/*", "report", false),
            ("report/*", "reports/7", false),
            ("*", "anything/at/all", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*/7", "report/7", true),
        ];
        for (pattern, name, expect) in cases {
            assert_eq!(
                Pattern::new(pattern).unwrap().matches(name),
                expect,
                "{pattern} vs {name}"
            );
        }
        // Adversarial pattern: stays fast (a backtracking matcher would take forever).
        let slow = Pattern::new(&format!("{}b", "*a".repeat(40))).unwrap();
        assert!(!slow.matches(&"a".repeat(200)));
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let policy = Policy::parse(
            "[[lock]]\npattern = \"a/special\"\nclass = \"efficiency\"\n\
             [[lock]]\npattern = \"a/*\"\nclass = \"critical\"\n",
        )
        .unwrap();
        assert_eq!(
            policy.classify("a/special", None, false).unwrap().class,
            LockClass::Efficiency
        );
        assert_eq!(
            policy.classify("a/other", None, false).unwrap().class,
            LockClass::Critical
        );
    }
}
