//! The shared conformance suite, run against PostgreSQL (the same cases as the embedded store).

mod common;

use std::sync::Arc;

use palisade_fence::conformance::Factory;
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_postgres::PostgresFence;

struct PostgresFactory;

impl Factory for PostgresFactory {
    type Resource = PostgresFence;

    async fn make(&self, mode: FenceMode, verifier: Arc<Verifier>) -> PostgresFence {
        PostgresFence::connect(&common::postgres_url(), 8, mode, verifier)
            .await
            .expect("connect to the test PostgreSQL")
            .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()))
    }
}

palisade_fence::conformance_suite!(PostgresFactory);
