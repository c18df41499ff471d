//! [`AnyLedger`]: the ledger a URL names — `postgres://…` (the PostgreSQL ledger, used
//! directly) or `http(s)://…` (the embedded ledger a reference store hosts) — or an embedded
//! ledger opened in this process.

use std::sync::Arc;

use palisade_fence::{FloorSource, Verifier};

use crate::ledger::{Answer, Begin, BeginRequest, Ledger, LedgerError, ListFilter, Stats};
use crate::model::{OpId, Record, SendResult, Settlement, Verdict};
use crate::{HttpLedger, LocalLedger, PostgresStore, RedbStore};

/// A ledger chosen at run time.
pub enum AnyLedger {
    /// An embedded ledger in this process.
    Embedded(LocalLedger<RedbStore>),
    /// PostgreSQL, used directly.
    Postgres(LocalLedger<PostgresStore>),
    /// An embedded ledger over HTTP.
    Http(HttpLedger),
}

impl AnyLedger {
    /// Connects to the ledger at `url`. `verifier` checks owners' tokens for the PostgreSQL
    /// ledger, and `floors` (the coordinator's) lets it refuse owners the coordinator
    /// superseded after the database went back ([`PostgresStore::with_floors`]); an HTTP
    /// ledger checks both itself. `admin_secret` is sent to an HTTP ledger.
    pub async fn connect(
        url: &str,
        verifier: Arc<Verifier>,
        floors: Option<Arc<dyn FloorSource>>,
        admin_secret: Option<String>,
    ) -> Result<Self, LedgerError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut store = PostgresStore::connect(url).await?;
            if let Some(floors) = floors {
                store = store.with_floors(floors);
            }
            Ok(AnyLedger::Postgres(LocalLedger::new(store, verifier)))
        } else if url.starts_with("http://") || url.starts_with("https://") {
            Ok(AnyLedger::Http(HttpLedger::new(url, admin_secret)?))
        } else {
            Err(LedgerError::Storage(format!(
                "a ledger is a postgres:// URL or the http:// URL of a reference store, not {url:?}"
            )))
        }
    }
}

macro_rules! both {
    ($self:ident, $ledger:ident => $call:expr) => {
        match $self {
            AnyLedger::Embedded($ledger) => $call.await,
            AnyLedger::Postgres($ledger) => $call.await,
            AnyLedger::Http($ledger) => $call.await,
        }
    };
}

impl Ledger for AnyLedger {
    async fn begin(&self, request: BeginRequest) -> Result<Begin, LedgerError> {
        both!(self, l => l.begin(request))
    }

    async fn finish(
        &self,
        token: &str,
        id: &OpId,
        attempt: u32,
        result: SendResult,
    ) -> Result<Answer, LedgerError> {
        both!(self, l => l.finish(token, id, attempt, result))
    }

    async fn settle(
        &self,
        token: Option<&str>,
        id: &OpId,
        attempt: u32,
        settlement: Settlement,
    ) -> Result<Answer, LedgerError> {
        both!(self, l => l.settle(token, id, attempt, settlement))
    }

    async fn reattempt(
        &self,
        id: &OpId,
        attempt: u32,
        attempt_timeout_ms: u64,
    ) -> Result<Answer, LedgerError> {
        both!(self, l => l.reattempt(id, attempt, attempt_timeout_ms))
    }

    async fn resolve(
        &self,
        id: &OpId,
        verdict: Verdict,
        by: &str,
        why: &str,
    ) -> Result<Answer, LedgerError> {
        both!(self, l => l.resolve(id, verdict, by, why))
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        both!(self, l => l.get(id))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        both!(self, l => l.list(filter))
    }

    async fn stats(&self) -> Result<Stats, LedgerError> {
        both!(self, l => l.stats())
    }
}
