//! Receivers of effects, by capability, and [`HttpReceiver`]: a client of the receiver HTTP
//! protocol that `palisade receiver serve` implements (docs/effects.md describes it, so an
//! adapter for a real provider can follow the same shape).

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ledger::Attempt;
use crate::model::{bounded_text, Capability, SendResult};

/// Header: the operation's idempotency key.
pub const KEY_HEADER: &str = "idempotency-key";
/// Header: the attempt must not be performed after this time (ms since the Unix epoch).
pub const DEADLINE_HEADER: &str = "palisade-deadline";
/// Header: the operation (`LOCK:OP`), for the receiver's record.
pub const OP_HEADER: &str = "palisade-op";
/// Header: the attempt's epoch, for the receiver's record.
pub const EPOCH_HEADER: &str = "palisade-epoch";
/// Header: the attempt's number, for the receiver's record.
pub const ATTEMPT_HEADER: &str = "palisade-attempt";

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Performed, with the receiver's reference.
    Performed {
        /// The reference.
        reference: Option<String>,
    },
    /// Not performed (definitive only after the attempt's deadline and the lookup margin).
    NotPerformed,
}

/// A failure to ask the receiver (not an answer).
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    /// The receiver cannot do this (no lookup, no compensation).
    #[error("the receiver does not support {0}")]
    Unsupported(&'static str),
    /// No usable answer.
    #[error("receiver unavailable: {0}")]
    Unavailable(String),
}

/// Where effects go. The application declares the capability; it must be true of the
/// receiver (docs/effects.md says what each one requires).
pub trait Receiver: Send + Sync {
    /// The receiver's name in the ledger.
    fn name(&self) -> &str;

    /// What it can do.
    fn capability(&self) -> Capability;

    /// Sends one attempt, with its idempotency key and deadline. Never panics and never
    /// retries by itself: every failure is a [`SendResult`].
    fn send(&self, attempt: &Attempt) -> impl Future<Output = SendResult> + Send;

    /// Was the effect with this key performed? (`lookup` and `idempotent` receivers that can
    /// say.)
    fn status(&self, key: &str) -> impl Future<Output = Result<Status, ReceiverError>> + Send;

    /// Undoes the effect with this key by another effect; returns the compensation's reference.
    fn compensate(&self, key: &str) -> impl Future<Output = Result<String, ReceiverError>> + Send;
}

/// A receiver speaking the receiver HTTP protocol.
#[derive(Clone)]
pub struct HttpReceiver {
    name: String,
    capability: Capability,
    base: String,
    http: reqwest::Client,
}

/// Longest wait for one receiver answer, by default.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

impl HttpReceiver {
    /// A receiver at `base` (`http://host:port`), waiting at most `timeout` for an answer.
    pub fn new(
        name: impl Into<String>,
        capability: Capability,
        base: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, ReceiverError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| ReceiverError::Unavailable(e.to_string()))?;
        Ok(Self {
            name: name.into(),
            capability,
            base: base.into().trim_end_matches('/').to_owned(),
            http,
        })
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl Receiver for HttpReceiver {
    fn name(&self) -> &str {
        &self.name
    }

    fn capability(&self) -> Capability {
        self.capability
    }

    async fn send(&self, attempt: &Attempt) -> SendResult {
        let request = self
            .http
            .post(format!("{}/v1/effects", self.base))
            .header(KEY_HEADER, &attempt.key)
            .header(DEADLINE_HEADER, attempt.deadline_ms.to_string())
            .header(OP_HEADER, attempt.id.to_string())
            .header(EPOCH_HEADER, attempt.epoch.to_string())
            .header(ATTEMPT_HEADER, attempt.n.to_string())
            .body(attempt.payload.clone());
        let response = match request.send().await {
            Ok(response) => response,
            // Connection refused before anything was written is still ambiguous to us: a
            // proxy or a half-open connection may have delivered it.
            Err(error) => {
                return SendResult::Ambiguous {
                    reason: bounded_text(&format!("no answer: {error}")),
                }
            }
        };
        let status = response.status();
        let answer = match response.json::<Answer>().await {
            Ok(answer) => answer,
            Err(error) => {
                return SendResult::Ambiguous {
                    reason: bounded_text(&format!("unreadable answer ({status}): {error}")),
                }
            }
        };
        let why = || {
            bounded_text(&format!(
                "{status}: {}",
                answer
                    .message
                    .clone()
                    .or(answer.error.clone())
                    .unwrap_or_default()
            ))
        };
        match status.as_u16() {
            200..=299 => SendResult::Performed {
                reference: answer.reference.clone(),
            },
            410 => SendResult::Expired { reason: why() },
            // In progress elsewhere, overloaded, or failing: it may have been performed.
            409 | 429 | 500..=599 => SendResult::Ambiguous { reason: why() },
            _ => SendResult::Refused { reason: why() },
        }
    }

    async fn status(&self, key: &str) -> Result<Status, ReceiverError> {
        let response = self
            .http
            .get(format!("{}/v1/effects/{key}", self.base))
            .send()
            .await
            .map_err(|e| ReceiverError::Unavailable(e.to_string()))?;
        match response.status().as_u16() {
            200 => {
                let answer: Answer = response
                    .json()
                    .await
                    .map_err(|e| ReceiverError::Unavailable(e.to_string()))?;
                Ok(Status::Performed {
                    reference: answer.reference,
                })
            }
            404 => Ok(Status::NotPerformed),
            501 => Err(ReceiverError::Unsupported("lookup")),
            other => Err(ReceiverError::Unavailable(format!(
                "lookup answered {other}"
            ))),
        }
    }

    async fn compensate(&self, key: &str) -> Result<String, ReceiverError> {
        let response = self
            .http
            .post(format!("{}/v1/effects/{key}/compensate", self.base))
            .send()
            .await
            .map_err(|e| ReceiverError::Unavailable(e.to_string()))?;
        match response.status().as_u16() {
            200 => {
                let answer: Answer = response
                    .json()
                    .await
                    .map_err(|e| ReceiverError::Unavailable(e.to_string()))?;
                Ok(answer.reference.unwrap_or_default())
            }
            501 => Err(ReceiverError::Unsupported("compensation")),
            other => Err(ReceiverError::Unavailable(format!(
                "compensation answered {other}"
            ))),
        }
    }
}
