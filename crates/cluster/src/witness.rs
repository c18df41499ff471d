//! A member's witness: a file beside its data directory (`DIR.witness`, outside it, so a copy
//! of the directory does not carry it) that records the member's store id and how far its state
//! machine has durably applied the log. It detects a data directory copied back from an older
//! copy (`cp -a`, a volume snapshot, a backup of the files) before the member rejoins (P6, P8).
//!
//! Why a member must not start from an older copy: Raft counts on every member keeping what it
//! acknowledged. A member that forgets entries (or a vote) can form a majority with another
//! member that lacks them, elect a leader without them, and so lose acknowledged grants and
//! issue their epochs again. A wiped member is caught by its store id (see [`super::identity`]);
//! a copied-back one keeps its store id, and is caught here: its applied index is below the one
//! the witness saw. Such a member refuses to start with a message naming the ways back (re-add
//! it empty, or `palisade restore` when every member went back).
//!
//! The witness is written *after* the store made the applied index durable, so after a crash
//! the store is never behind its witness; it is written at most every [`INTERVAL`], so a copy
//! taken within the last interval before the member stopped is not told apart from the current
//! directory (nothing was applied since, or too little to see).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_core::witness::{judge, Verdict, WitnessRecord};
use tokio::sync::watch;

use super::{ClusterError, NodeId};

/// The kind of store a member witness speaks of.
const KIND: &str = "member";

/// Longest time between two writes of the witness while the member applies entries.
pub const INTERVAL: Duration = palisade_core::witness::FOLLOW_INTERVAL;

/// The default place of the witness of data directory `data_dir`: its sibling `NAME.witness`.
pub fn default_path(data_dir: &Path) -> PathBuf {
    palisade_coordinator::high_water::sibling(data_dir, ".witness")
}

/// A member's witness file.
#[derive(Debug)]
pub struct Witness {
    path: PathBuf,
    seen: WitnessRecord,
}

impl Witness {
    /// Checks the store at `store_name` (id `store`, durably applied up to `applied`) against
    /// the witness at `path`, and records it. Refuses a store that applied less than the
    /// witness saw of the same store: the data directory went back in time.
    pub fn check(
        path: &Path,
        node: NodeId,
        store_name: &str,
        store: &str,
        applied: u64,
    ) -> Result<Self, ClusterError> {
        let witness = Self {
            path: path.to_owned(),
            seen: WitnessRecord {
                kind: KIND.into(),
                store: store.to_owned(),
                mark: applied,
            },
        };
        let found = match std::fs::read_to_string(path) {
            Ok(text) => Some(WitnessRecord::parse(&text).ok_or_else(|| {
                ClusterError::DataDirectory(format!(
                    "{} is not a Palisade witness; it tells whether the data directory is older \
                     than what this member acknowledged, so the member will not start without \
                     it: restore the file, or move it away if the data directory is known to be \
                     current",
                    path.display()
                ))
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(witness_io(path, e)),
        };
        match judge(found.as_ref(), &witness.seen) {
            Verdict::Current => return Ok(witness),
            Verdict::Record => {}
            Verdict::Behind { seen } => {
                return Err(ClusterError::DataDirectory(format!(
                    "{store_name} is an older copy of member {node}'s store: it applied the \
                     log up to entry {applied}, but this member had applied up to entry {seen} \
                     ({}). A member restarted from an older copy forgets entries and votes it \
                     acknowledged, which can lose granted leases and reissue epochs. If the \
                     other members are current: `palisade cluster remove {node}`, start this \
                     member with an empty data directory and --join, and `palisade cluster \
                     add` it. If every member went back to a copy: take `palisade backup` of it \
                     and `palisade restore --cluster` a new cluster from it (see \
                     docs/operations.md).",
                    path.display()
                )))
            }
            Verdict::OtherKind(kind) => {
                return Err(ClusterError::DataDirectory(format!(
                    "{} is the witness of a {kind}, not of a cluster member: is --data-dir \
                     right?",
                    path.display()
                )))
            }
        }
        witness.write()?;
        Ok(witness)
    }

    fn write(&self) -> Result<(), ClusterError> {
        palisade_durable::write_file(&self.path, self.seen.render().as_bytes())
            .map_err(|e| witness_io(&self.path, e))
    }

    /// Follows the durably applied index (`applied`, published by the state machine after its
    /// commit) into the witness, at most every [`INTERVAL`], until `shutdown`. A write that
    /// fails is logged and retried with the next change: the witness only ever lags.
    pub async fn follow(
        mut self,
        mut applied: watch::Receiver<Option<openraft::LogId<NodeId>>>,
        sync: crate::storage::SmSync,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let stopping = tokio::select! {
                changed = applied.changed() => changed.is_err(),
                _ = shutdown.wait_for(|stop| *stop) => true,
            };
            if stopping {
                // Every apply so far made durable first, so that the stop records it.
                let sync = sync.clone();
                if let Ok(Err(error)) = tokio::task::spawn_blocking(move || sync.sync()).await {
                    tracing::warn!(%error, "the applies could not be made durable at the stop");
                }
            }
            let index = applied.borrow_and_update().map_or(0, |l| l.index);
            if index > self.seen.mark {
                self.seen.mark = index;
                let (path, text) = (self.path.clone(), self.seen.render());
                let written = tokio::task::spawn_blocking(move || {
                    palisade_durable::write_file(&path, text.as_bytes())
                })
                .await;
                if let Ok(Err(error)) = written {
                    tracing::warn!(
                        witness = %self.path.display(), %error, "member witness not written"
                    );
                }
            }
            // A stop records where the member got to (the last write above).
            if stopping {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(INTERVAL) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        }
    }
}

fn witness_io(path: &Path, error: io::Error) -> ClusterError {
    ClusterError::DataDirectory(format!("member witness {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(path: &Path) -> u64 {
        WitnessRecord::parse(&std::fs::read_to_string(path).unwrap())
            .unwrap()
            .mark
    }

    #[test]
    fn p6_p8_a_store_behind_its_witness_is_refused_and_a_new_store_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n1.witness");
        // First start: recorded.
        Witness::check(&path, 1, "s", "aaaa", 5).unwrap();
        assert_eq!(mark(&path), 5);
        // The same store, further on: fine, and recorded.
        Witness::check(&path, 1, "s", "aaaa", 9).unwrap();
        // The same store, behind: a copy went back.
        let error = Witness::check(&path, 1, "s", "aaaa", 6)
            .unwrap_err()
            .to_string();
        assert!(error.contains("older copy"), "{error}");
        assert!(error.contains("palisade restore"), "{error}");
        assert!(error.contains("cluster remove 1"), "{error}");
        // Refusing changed nothing.
        Witness::check(&path, 1, "s", "aaaa", 9).unwrap();
        // A new store (wiped directory): followed from where it is.
        Witness::check(&path, 1, "s", "bbbb", 0).unwrap();
        Witness::check(&path, 1, "s", "bbbb", 0).unwrap();
        // A damaged witness refuses to start.
        std::fs::write(&path, "applied=3\n").unwrap();
        assert!(Witness::check(&path, 1, "s", "bbbb", 3).is_err());
        assert_eq!(
            default_path(Path::new("/x/n1")),
            PathBuf::from("/x/n1.witness")
        );
    }

    #[tokio::test]
    async fn p6_the_witness_follows_the_applied_index_and_stops_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n1.witness");
        let witness = Witness::check(&path, 1, "s", "aaaa", 0).unwrap();
        let (applied_tx, applied) = watch::channel(None);
        let (stop, shutdown) = watch::channel(false);
        let (_log, sm) = crate::storage::open(&dir.path().join("s.redb")).unwrap();
        let task = tokio::spawn(witness.follow(applied, sm.syncer(), shutdown));
        applied_tx
            .send(Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                7,
            )))
            .unwrap();
        for _ in 0..200 {
            let text = std::fs::read_to_string(&path).unwrap();
            if WitnessRecord::parse(&text).unwrap().mark == 7 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(mark(&path), 7);
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
