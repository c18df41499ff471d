-- Strict mode knows the lock (migration 3): the greatest epoch accepted for each lock on any
-- key. A strict write below it is refused even on a key nobody has written yet, so an old
-- owner cannot create a key the new owner has not touched. Backfilled from the rows already
-- stored; a lock's entry only ever rises.
CREATE TABLE IF NOT EXISTS palisade_lock_epochs (
    lock  text   PRIMARY KEY,
    epoch bigint NOT NULL CHECK (epoch >= 0)
);

INSERT INTO palisade_lock_epochs (lock, epoch)
SELECT lock, max(epoch) FROM palisade_kv GROUP BY lock
ON CONFLICT (lock) DO UPDATE SET epoch = greatest(palisade_lock_epochs.epoch, EXCLUDED.epoch);
