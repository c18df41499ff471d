//! The shared conformance suite, run against the embedded (redb) fenced store.

use std::sync::Arc;

use palisade_fence::conformance::Factory;
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_redb::RedbFence;

/// Each resource gets its own file in a directory kept for the whole test process.
struct RedbFactory;

impl Factory for RedbFactory {
    type Resource = RedbFence;

    async fn make(&self, mode: FenceMode, verifier: Arc<Verifier>) -> RedbFence {
        let dir = tempfile::tempdir().unwrap().keep();
        RedbFence::open(&dir.join("fence.redb"), mode, verifier).unwrap()
    }
}

palisade_fence::conformance_suite!(RedbFactory);
