//! Offline backups of a stopped coordinator's data directory, a single node's or a cluster
//! member's. The backup format, restores and the restore record are
//! `palisade_coordinator::backup`; this part reads a cluster member's store, so it sits above
//! the cluster.

use std::path::Path;

use palisade_coordinator::backup::{now_ms, Backup, BackupError, FORMAT};
use palisade_coordinator::store::StoreError;

/// A backup of a stopped single node's or cluster member's data directory (a member's is the
/// counter it applied).
pub fn offline(data_dir: &Path) -> Result<Backup, BackupError> {
    let in_use = || {
        BackupError::Refused(format!(
            "{} is in use by a running coordinator: back it up online \
             (palisade backup --endpoint URL --out FILE)",
            data_dir.display()
        ))
    };
    let member = data_dir.join(palisade_coordinator::CLUSTER_STORE_FILE);
    if member.exists() {
        // What this member applied, or holds in its Raft log: the leader may have issued more
        // since (the restore's other floors cover that).
        let counter = palisade_cluster::storage::read_counter(&member).map_err(|e| match e {
            redb::Error::DatabaseAlreadyOpen => in_use(),
            other => BackupError::Store(StoreError::Storage(other)),
        })?;
        return Ok(Backup {
            format: FORMAT,
            mode: "cluster".into(),
            last_epoch: counter.0,
            taken_at_ms: now_ms(),
            taken: "offline".into(),
        });
    }
    if !palisade_coordinator::log_store::exists_in(data_dir) {
        return Err(BackupError::Refused(format!(
            "{} holds no coordinator store ({} or {})",
            data_dir.display(),
            palisade_coordinator::STORE_FILE,
            palisade_coordinator::CLUSTER_STORE_FILE
        )));
    }
    // Read without writing: a torn record stays as it is, an earlier version's store is not
    // migrated (the coordinator does both when it next starts).
    let state = palisade_coordinator::log_store::read_in(data_dir).map_err(|e| match e {
        StoreError::InUse(_) => in_use(),
        other => BackupError::Store(other),
    })?;
    Ok(Backup {
        format: FORMAT,
        mode: "single".into(),
        last_epoch: state.last_epoch.0,
        taken_at_ms: now_ms(),
        taken: "offline".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offline_backup_of_a_stopped_member_reads_its_applied_counter() {
        let dir = tempfile::tempdir().unwrap();
        let stopped = dir.path().join("m");
        std::fs::create_dir(&stopped).unwrap();
        let store = palisade_cluster::storage::open(
            &stopped.join(palisade_coordinator::CLUSTER_STORE_FILE),
        )
        .unwrap();
        let error = offline(&stopped).unwrap_err().to_string();
        assert!(error.contains("in use"), "{error}");
        drop(store);
        let taken = offline(&stopped).unwrap();
        assert_eq!((taken.mode.as_str(), taken.last_epoch), ("cluster", 0));
    }
}
