//! Member identity: each cluster store has a random **store id**, created with the store, and
//! each member remembers (durably) the store id of every peer it has exchanged Raft messages
//! with. Every Raft message and every answer carries its sender's store id.
//!
//! Why: a member whose data directory was lost (wiped, replaced disk, restored from nothing)
//! and restarted with the same flags comes back with an empty log and no vote. Raft's safety
//! rests on what each member persisted — an empty member can vote twice in a term and can be
//! counted in a majority for entries it no longer has — so it could let a committed grant be
//! lost and its epoch issued again (P1, P8; the cluster simulation shows it in about half of
//! its seeds when crashes also wipe disks). With identities, the peers refuse such a member:
//! its votes, appends and answers are dropped, and it is told why. The way back is the one for
//! any new member: `palisade cluster remove ID`, start it with `--join`, `palisade cluster add`
//! (a membership without the node makes every member forget its old store id).
//!
//! The first exchange with a peer teaches its id (trust on first use), so members of a new
//! cluster, late first starts, and members added with `--join` need nothing more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use redb::{Database, Durability, ReadableTable, TableDefinition};

use super::NodeId;

/// Peer node id → the store id it presented first.
const PEER_STORES: TableDefinition<u64, &str> = TableDefinition::new("peer_stores");
/// This store's id, in the `raft_meta`-like table of its own.
const OWN_STORE: TableDefinition<&str, &str> = TableDefinition::new("store_identity");

/// gRPC metadata of the sender's node id on Raft messages.
pub const FROM_METADATA: &str = "palisade-raft-from";
/// gRPC metadata of the sender's (or the answering member's) store id.
pub const STORE_METADATA: &str = "palisade-raft-store";

/// A peer presented another store than the one this member knows it by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {peer} presents store {presented}, but this member knows it as store {known}: node \
     {peer} lost its data directory (or another machine uses its id). Its messages are refused. \
     To bring it back: `palisade cluster remove {peer}`, start it with --join and an empty data \
     directory, then `palisade cluster add {peer} HOST:PORT`"
)]
pub struct Refused {
    /// The peer.
    pub peer: NodeId,
    /// The store id this member knows it by.
    pub known: String,
    /// The store id it presented.
    pub presented: String,
}

/// This member's store id and what it knows of its peers'. Clones share it.
#[derive(Clone)]
pub struct Identity {
    store: String,
    db: Arc<Database>,
    known: Arc<Mutex<BTreeMap<NodeId, String>>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads the store id (creating it with a new store) and the known peers.
    pub(crate) fn open(db: Arc<Database>) -> Result<Self, String> {
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        let store = {
            let mut own = txn.open_table(OWN_STORE).map_err(|e| e.to_string())?;
            let existing = own
                .get("store_id")
                .map_err(|e| e.to_string())?
                .map(|v| v.value().to_string());
            match existing {
                Some(id) => id,
                None => {
                    let id = new_store_id()?;
                    own.insert("store_id", id.as_str())
                        .map_err(|e| e.to_string())?;
                    id
                }
            }
        };
        let mut known = BTreeMap::new();
        {
            let peers = txn.open_table(PEER_STORES).map_err(|e| e.to_string())?;
            for row in peers.iter().map_err(|e| e.to_string())? {
                let (peer, store) = row.map_err(|e| e.to_string())?;
                known.insert(peer.value(), store.value().to_string());
            }
        }
        txn.commit().map_err(|e| e.to_string())?;
        Ok(Self {
            store,
            db,
            known: Arc::new(Mutex::new(known)),
        })
    }

    /// This store's id.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// Admits a message from, or an answer by, `peer` presenting `store`. The first store a
    /// peer presents is remembered (durably, before admitting); another one later is refused.
    pub fn admit(&self, peer: NodeId, store: &str) -> Result<(), Refused> {
        let mut known = self.known.lock().expect("not poisoned");
        match known.get(&peer) {
            Some(id) if id == store => Ok(()),
            Some(id) => Err(Refused {
                peer,
                known: id.clone(),
                presented: store.to_string(),
            }),
            None => {
                if let Err(error) = self.persist(|table| {
                    table.insert(peer, store)?;
                    Ok(())
                }) {
                    // Not remembered, so not admitted: the next message tries again.
                    tracing::warn!(%error, peer, "could not record a peer's store id");
                    return Err(Refused {
                        peer,
                        known: "(unrecorded)".into(),
                        presented: store.to_string(),
                    });
                }
                tracing::info!(peer, store, "learned a peer's store id");
                known.insert(peer, store.to_string());
                Ok(())
            }
        }
    }

    /// Forgets the store ids of peers that are no longer members (a removed node may come back
    /// with a new store, through `--join` and `cluster add`).
    pub fn retain_members(&self, members: &[NodeId]) {
        let mut known = self.known.lock().expect("not poisoned");
        let gone: Vec<NodeId> = known
            .keys()
            .copied()
            .filter(|peer| !members.contains(peer))
            .collect();
        if gone.is_empty() {
            return;
        }
        let removed = self.persist(|table| {
            for peer in &gone {
                table.remove(*peer)?;
            }
            Ok(())
        });
        match removed {
            Ok(()) => {
                for peer in &gone {
                    known.remove(peer);
                }
                tracing::info!(?gone, "forgot the store ids of removed members");
            }
            Err(error) => tracing::warn!(%error, "could not forget removed members' store ids"),
        }
    }

    fn persist(
        &self,
        change: impl FnOnce(&mut redb::Table<u64, &str>) -> Result<(), redb::StorageError>,
    ) -> Result<(), String> {
        let mut txn = self.db.begin_write().map_err(|e| e.to_string())?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(PEER_STORES).map_err(|e| e.to_string())?;
            change(&mut table).map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())
    }
}

fn new_store_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a store id: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> (tempfile::TempDir, Identity) {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("s.redb")).unwrap());
        (dir, Identity::open(db).unwrap())
    }

    #[test]
    fn a_peer_is_known_by_the_first_store_it_presents_even_after_a_restart() {
        let (dir, first) = identity();
        first.admit(2, "aaaa").unwrap();
        first.admit(2, "aaaa").unwrap();
        let refused = first.admit(2, "bbbb").unwrap_err();
        assert_eq!(
            (refused.known.as_str(), refused.presented.as_str()),
            ("aaaa", "bbbb")
        );
        assert!(refused.to_string().contains("palisade cluster remove 2"));
        let own = first.store().to_string();
        drop(first);
        let db = Arc::new(Database::open(dir.path().join("s.redb")).unwrap());
        let reopened = Identity::open(db).unwrap();
        assert_eq!(reopened.store(), own, "the store id is stable");
        assert!(reopened.admit(2, "bbbb").is_err(), "remembered durably");
    }

    #[test]
    fn a_removed_member_may_come_back_with_a_new_store() {
        let (_dir, identity) = identity();
        identity.admit(2, "aaaa").unwrap();
        identity.admit(3, "cccc").unwrap();
        identity.retain_members(&[1, 3]);
        identity.admit(2, "bbbb").unwrap();
        assert!(identity.admit(3, "dddd").is_err());
    }
}
