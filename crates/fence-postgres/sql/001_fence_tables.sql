-- Palisade fence tables (migration 1). Applied by the adapter; safe to run by hand, and to run
-- again (every statement is idempotent).

-- Activated mode: the fence of each lock, advanced by activate() iff the new epoch is higher.
CREATE TABLE IF NOT EXISTS palisade_fences (
    lock  text   PRIMARY KEY,
    fence bigint NOT NULL CHECK (fence >= 0)
);

-- Palisade's own fenced key-value rows (all modes): the value and the epoch (and, in sequenced
-- mode, the sequence number) of the write that stored it.
CREATE TABLE IF NOT EXISTS palisade_kv (
    lock  text   NOT NULL,
    key   text   NOT NULL,
    value bytea  NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 0),
    seq   bigint CHECK (seq >= 0),
    PRIMARY KEY (lock, key)
);

-- Sequenced mode: every applied (epoch, seq) of the key's current epoch, with the SHA-256 of
-- its value, so a replay returns the recorded outcome and applies nothing.
CREATE TABLE IF NOT EXISTS palisade_ledger (
    lock       text        NOT NULL,
    key        text        NOT NULL,
    epoch      bigint      NOT NULL,
    seq        bigint      NOT NULL,
    digest     bytea       NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lock, key, epoch, seq)
);
