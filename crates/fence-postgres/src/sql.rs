//! The statements of each mode. Each write is one statement, so the comparison and the
//! mutation are atomic inside PostgreSQL (P3): `ON CONFLICT … DO UPDATE … WHERE` locks the
//! conflicting row and evaluates the condition on its latest version, and the activated write
//! holds a share lock on the fence row until it commits, so an activation waits for it.
//! Each is equivalent to the rule of the same name in `palisade_fence::rules`.

/// Strict: iff the epoch is at least the lock's greatest accepted epoch (raising it), insert,
/// or update iff the key's stored epoch is lower. The lock's row is locked first by every
/// strict write of the lock, so they serialize on it (one lock order: no deadlock).
/// `$1 lock, $2 key, $3 value, $4 epoch`.
pub const STRICT_WRITE: &str = "
    WITH lock_epoch AS (
        INSERT INTO palisade_lock_epochs AS l (lock, epoch) VALUES ($1, $4)
        ON CONFLICT (lock) DO UPDATE SET epoch = EXCLUDED.epoch WHERE l.epoch <= EXCLUDED.epoch
        RETURNING epoch
    )
    INSERT INTO palisade_kv AS t (lock, key, value, epoch)
    SELECT $1, $2, $3, $4 FROM lock_epoch
    ON CONFLICT (lock, key) DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch
    WHERE t.epoch < EXCLUDED.epoch
    RETURNING epoch";

/// Strict, after a refusal: the lock's greatest epoch and the key's. Both only rise (nothing
/// deletes them), so they are at least what refused the write. `$1 lock, $2 key`.
pub const READ_STRICT_FENCES: &str = "
    SELECT (SELECT epoch FROM palisade_lock_epochs WHERE lock = $1),
           (SELECT epoch FROM palisade_kv WHERE lock = $1 AND key = $2)";

/// Strict: the lock's greatest accepted epoch. `$1 lock`.
pub const READ_LOCK_EPOCH: &str = "SELECT epoch FROM palisade_lock_epochs WHERE lock = $1";

/// Activated: write iff the lock's fence equals the epoch, holding the fence row. Same params.
pub const ACTIVATED_WRITE: &str = "
    WITH fence AS (
        SELECT fence FROM palisade_fences WHERE lock = $1 AND fence = $4 FOR SHARE
    )
    INSERT INTO palisade_kv AS t (lock, key, value, epoch)
    SELECT $1, $2, $3, $4 FROM fence
    ON CONFLICT (lock, key) DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch
    RETURNING epoch";

/// Sequenced: write iff `(epoch, seq)` is above the stored pair, record the pair in the ledger
/// and forget the key's older epochs there. `$5 seq, $6 digest`.
pub const SEQUENCED_WRITE: &str = "
    WITH up AS (
        INSERT INTO palisade_kv AS t (lock, key, value, epoch, seq) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (lock, key) DO UPDATE
            SET value = EXCLUDED.value, epoch = EXCLUDED.epoch, seq = EXCLUDED.seq
        WHERE (t.epoch, t.seq) < (EXCLUDED.epoch, EXCLUDED.seq)
        RETURNING lock, key, epoch, seq
    ), pruned AS (
        DELETE FROM palisade_ledger l USING up
        WHERE l.lock = up.lock AND l.key = up.key AND l.epoch < up.epoch
    )
    INSERT INTO palisade_ledger (lock, key, epoch, seq, digest)
    SELECT lock, key, epoch, seq, $6 FROM up
    RETURNING epoch";

/// Activate: advance the fence iff higher. `$1 lock, $2 epoch`.
pub const ACTIVATE: &str = "
    INSERT INTO palisade_fences AS f (lock, fence) VALUES ($1, $2)
    ON CONFLICT (lock) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence < EXCLUDED.fence
    RETURNING fence";

pub const READ_FENCE: &str = "SELECT fence FROM palisade_fences WHERE lock = $1";
pub const READ_PAIR: &str = "SELECT epoch, seq FROM palisade_kv WHERE lock = $1 AND key = $2";
pub const READ_VALUE: &str =
    "SELECT value, epoch, seq FROM palisade_kv WHERE lock = $1 AND key = $2";
pub const READ_MAX_EPOCH: &str = "SELECT max(epoch) FROM palisade_kv WHERE lock = $1";
pub const READ_LEDGER: &str = "
    SELECT digest FROM palisade_ledger WHERE lock = $1 AND key = $2 AND epoch = $3 AND seq = $4";

/// Records `$2` as the mode of lock `$1` unless it has one, and returns the lock's mode.
pub const CLAIM_LOCK_MODE: &str = "
    WITH claimed AS (
        INSERT INTO palisade_lock_modes (lock, mode) VALUES ($1, $2)
        ON CONFLICT (lock) DO NOTHING
        RETURNING mode
    )
    SELECT mode FROM claimed
    UNION ALL
    SELECT mode FROM palisade_lock_modes WHERE lock = $1
    LIMIT 1";

/// The recorded mode of lock `$1`.
pub const READ_LOCK_MODE: &str = "SELECT mode FROM palisade_lock_modes WHERE lock = $1";
