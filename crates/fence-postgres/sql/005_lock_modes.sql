-- Each lock is fenced in one mode (migration 5). The modes' fences mean different things:
-- a lock activated at 9 by an activated-mode adapter, then written at 7 on a fresh key by a
-- strict-mode adapter sharing the tables, would accept an obsolete owner. The first adapter to
-- fence a lock records its mode here; an adapter in another mode is refused for that lock.
CREATE TABLE IF NOT EXISTS palisade_lock_modes (
    lock text PRIMARY KEY,
    mode text NOT NULL CHECK (mode IN ('strict', 'activated', 'sequenced'))
);

-- What the existing tables tell: activations are activated mode's, ledger rows sequenced
-- mode's, the rest of the written locks strict mode's.
INSERT INTO palisade_lock_modes (lock, mode)
SELECT lock, 'activated' FROM palisade_fences
ON CONFLICT (lock) DO NOTHING;
INSERT INTO palisade_lock_modes (lock, mode)
SELECT DISTINCT lock, 'sequenced' FROM palisade_ledger
ON CONFLICT (lock) DO NOTHING;
INSERT INTO palisade_lock_modes (lock, mode)
SELECT DISTINCT lock, 'strict' FROM palisade_kv WHERE seq IS NULL
ON CONFLICT (lock) DO NOTHING;
