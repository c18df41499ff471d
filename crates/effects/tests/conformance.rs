//! The ledger conformance suite, run against the embedded ledger, the embedded ledger reached
//! over HTTP (as `palisade resource serve` hosts it), and PostgreSQL.

use std::sync::Arc;

use palisade_effects::conformance::LedgerFactory;
use palisade_effects::http::{routes, Served};
use palisade_effects::{HttpLedger, LocalLedger, PostgresStore, RedbStore};
use palisade_fence::Verifier;

/// Each ledger gets its own file in a directory kept for the whole test process.
struct Embedded;

impl LedgerFactory for Embedded {
    type Ledger = LocalLedger<RedbStore>;

    async fn make(&self, verifier: Arc<Verifier>) -> Self::Ledger {
        let dir = tempfile::tempdir().unwrap().keep();
        LocalLedger::new(
            RedbStore::open(&dir.join("effects.redb")).unwrap(),
            verifier,
        )
    }
}

/// An embedded ledger served on loopback, reached with the admin secret.
struct OverHttp;

impl LedgerFactory for OverHttp {
    type Ledger = HttpLedger;

    async fn make(&self, verifier: Arc<Verifier>) -> HttpLedger {
        let ledger = Embedded.make(verifier).await;
        let served = Served::new(ledger, Some("s3cret".into()));
        let app = axum::Router::new().nest("/v1/effects", routes(served));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        HttpLedger::new(&format!("http://{address}"), Some("s3cret".into())).unwrap()
    }
}

/// The test database of `scripts/test` (shared; cases use lock names of their own).
struct Postgres;

impl LedgerFactory for Postgres {
    type Ledger = LocalLedger<PostgresStore>;

    async fn make(&self, verifier: Arc<Verifier>) -> Self::Ledger {
        let url = std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
            "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a \
             throwaway PostgreSQL on loopback and sets it",
        );
        LocalLedger::new(PostgresStore::connect(&url).await.unwrap(), verifier)
    }
}

mod embedded {
    use super::*;
    palisade_effects::ledger_conformance_suite!(Embedded);
}

mod over_http {
    use super::*;
    palisade_effects::ledger_conformance_suite!(OverHttp);
}

mod postgres {
    use super::*;
    palisade_effects::ledger_conformance_suite!(Postgres);
}
