//! Each lock's floor as the coordinator signed it since this process started (P6), shared by
//! the store's writes and the embedded effects ledger.
//!
//! A store's memory — its fences, its ledger's fences, the witnesses beside them — may have
//! been put back from a snapshot of the whole volume; nothing on that volume can tell. So at
//! the first write, activation or ledger request of each lock after a start, the store asks
//! the coordinator which owners are superseded (`GET /v1/locks/{lock}/floor`, signed), and
//! refuses every epoch below that from then on, whatever its own fences say. The current owner
//! is at or above the floor and goes on. A store whose keys come from a file has no
//! coordinator to ask and checks nothing here (documented). A coordinator that cannot be
//! asked refuses the request: safety before progress.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use palisade_core::{Epoch, LockName};
use palisade_effects::http::{Admission, Host};

use crate::keys::KeyRing;

/// Locks whose floor a store keeps in memory; past this the memory is emptied and floors are
/// asked again (safe: a floor only ever refuses more).
pub const MAX_FLOORS: usize = 100_000;

/// What the floor says of an owner's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorCheck {
    /// At or above the floor, or nothing to weigh (a token that does not verify is refused by
    /// the store or the ledger itself; keys from a file: nobody to ask).
    Admitted,
    /// Superseded: the coordinator has issued `floor` for the lock since.
    Below {
        /// The token's epoch.
        epoch: Epoch,
        /// The lock's floor.
        floor: Epoch,
    },
    /// The coordinator could not be asked (the message says so, and to retry).
    Unavailable(String),
}

/// The floors learned since this process started.
pub struct Floors {
    keys: Arc<KeyRing>,
    known: Mutex<HashMap<LockName, Epoch>>,
}

impl Floors {
    /// No floor known yet; they are asked through `keys`.
    pub fn new(keys: Arc<KeyRing>) -> Self {
        Self {
            keys,
            known: Mutex::default(),
        }
    }

    /// Weighs `token`, an owner's token for `lock`, against the lock's floor (asked at the
    /// first check of the lock since this process started).
    pub async fn check(&self, lock: &LockName, token: &str) -> FloorCheck {
        let Some(claims) = self.keys.verified(token, lock) else {
            return FloorCheck::Admitted;
        };
        let known = self.known.lock().expect("not poisoned").get(lock).copied();
        let floor = match known {
            Some(floor) => floor,
            None => match self.keys.lock_floor(lock).await {
                None => return FloorCheck::Admitted,
                Some(Ok((floor, _statement))) => self.learn(lock, floor),
                Some(Err(why)) => {
                    tracing::warn!(%lock, %why, "cannot learn the lock's floor");
                    return FloorCheck::Unavailable(format!(
                        "this store cannot tell whether epoch {} of {lock} is superseded until \
                         the coordinator answers ({why}); retry",
                        claims.epoch
                    ));
                }
            },
        };
        if claims.epoch >= floor {
            FloorCheck::Admitted
        } else {
            FloorCheck::Below {
                epoch: claims.epoch,
                floor,
            }
        }
    }

    fn learn(&self, lock: &LockName, floor: Epoch) -> Epoch {
        let mut known = self.known.lock().expect("not poisoned");
        if known.len() >= MAX_FLOORS {
            known.clear();
        }
        let floor = *known
            .entry(lock.clone())
            .and_modify(|known| *known = (*known).max(floor))
            .or_insert(floor);
        tracing::info!(%lock, %floor, "the coordinator's floor for this lock");
        floor
    }
}

/// What the embedded effects ledger asks of the store that hosts it: the coordinator's keys,
/// fetched on demand, and each lock's floor, shared with the store's writes, so an owner the
/// coordinator superseded is refused even when the ledger's own fences went back with its
/// volume.
pub struct LedgerHost {
    /// The trusted keys.
    pub keys: Arc<KeyRing>,
    /// The floors, shared with the store's writes.
    pub floors: Arc<Floors>,
}

impl Host for LedgerHost {
    fn refresh_for<'a>(
        &'a self,
        token: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.keys.refresh_for(token))
    }

    fn admit<'a>(
        &'a self,
        token: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Admission> + Send + 'a>> {
        Box::pin(async move {
            let Ok(claims) = palisade_core::token::decode_unverified(token) else {
                return Admission::Admitted; // the ledger refuses it as invalid
            };
            match self.floors.check(&claims.lock, token).await {
                FloorCheck::Admitted => Admission::Admitted,
                FloorCheck::Below { epoch, floor } => Admission::Superseded {
                    epoch: epoch.0,
                    floor: floor.0,
                },
                FloorCheck::Unavailable(why) => Admission::Unavailable(why),
            }
        })
    }
}
