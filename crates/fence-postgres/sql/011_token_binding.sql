-- Writers that pass the token, not a bare epoch (migration 11, P4/P5).
--
-- Before, a guarded table took `last_fence = $epoch` from any statement: an epoch of a
-- `report/8` lease was accepted on a `report/7` row (epochs come from one counter for every
-- lock), and `last_fence = 9000000000000000000` fenced the row against every later owner. Only
-- the Rust adapter checked a token's lock. Now a table may require a token for every write:
--
--     UPDATE reports SET payload = $2, last_fence = t.epoch
--     FROM palisade_present_token($1) AS t(epoch)
--     WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch
--
-- palisade_present_token reads the lock and the epoch from the token itself, remembers them
-- for the rest of the transaction, and records the greatest token presented for each lock in
-- palisade_presented_tokens. On a table where palisade_require_token(table) was run, the
-- trigger palisade_guard_token refuses a row whose last_fence is not the epoch of a token
-- presented in the same transaction for the row's own lock:
--   P5010  no token was presented for the row's lock (a bare epoch, or the transaction's
--          record of presented tokens set by hand: each entry carries a MAC only
--          palisade_present_token can make);
--   P5011  the tokens presented are for other locks (DETAIL: the row's lock);
--   P5012  last_fence is not the presented token's epoch (DETAIL: the token's epoch);
--   P5013  not a token at all (or not in its one canonical text).
-- A token below the greatest presented for its lock is superseded (P5009, DETAIL: that
-- epoch), on every table: its owner is refused even on rows the newer owner has not written.
--
-- The database cannot check an Ed25519 signature: a role that may present a token may present
-- a forged one. What it can no longer do is write an epoch no token names, or a token's epoch
-- on another lock's row. Every fence such a table accepts is backed by a token recorded in
-- palisade_presented_tokens, and `palisade audit` verifies that token with the coordinator's
-- keys: one that does not verify, or a fence above any verified token and above anything the
-- coordinator issued for that lock, is `poisoned_fence` (critical), repaired with
-- `palisade resource repair-fence`.

CREATE TABLE IF NOT EXISTS palisade_presented_tokens (
    lock         text        PRIMARY KEY,
    epoch        bigint      NOT NULL CHECK (epoch >= 0),
    token        text        NOT NULL,
    presented_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE palisade_guarded_tables
    ADD COLUMN IF NOT EXISTS require_token boolean NOT NULL DEFAULT false;

-- What a transaction presented is kept in the setting palisade.presented_tokens, which any
-- session can set: each entry carries a MAC under this secret, bound to the lock, the epoch,
-- the transaction and the backend. Only the owner reads the secret (through the SECURITY
-- DEFINER functions below), so only palisade_present_token can make an entry the trigger
-- accepts.
CREATE TABLE IF NOT EXISTS palisade_token_secret (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    secret    bytea   NOT NULL CHECK (length(secret) >= 32)
);
INSERT INTO palisade_token_secret (secret)
SELECT decode(replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', ''), 'hex')
ON CONFLICT DO NOTHING;
REVOKE ALL ON palisade_token_secret FROM PUBLIC;

CREATE OR REPLACE FUNCTION palisade_presented_mac(lock_name text, epoch bigint) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT encode(sha256(s.secret || sha256(s.secret || convert_to(
               lock_name || E'\n' || epoch::text || E'\n' || txid_current()::text || E'\n'
               || pg_backend_pid()::text, 'UTF8'))), 'hex')
    FROM palisade_token_secret s WHERE s.singleton
$$;
REVOKE EXECUTE ON FUNCTION palisade_presented_mac(text, bigint) FROM PUBLIC;

-- The lock, the epoch and the key id a token (`pt1.` + base64url of payload ‖ signature) states,
-- read without verifying its signature (the database has no Ed25519). Payload: version 2,
-- key id (8), epoch (8), issued at (8), lock length (2) and lock, holder length (1) and
-- holder, principal length (1) and principal; integers big-endian.
CREATE OR REPLACE FUNCTION palisade_token_claims(
    token text, OUT lock text, OUT epoch bigint, OUT key_id text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    body     text;
    raw      bytea;
    payload  integer;
    lock_len integer;
    at       integer;
BEGIN
    body := substr(token, 5);
    IF token IS NULL OR left(token, 4) <> 'pt1.' OR length(token) > 2048
       OR body !~ '^[A-Za-z0-9_-]+$' OR length(body) % 4 = 1 THEN
        RAISE EXCEPTION 'palisade guard: not an ownership token'
            USING ERRCODE = 'P5013', HINT = 'pass the token palisade lock acquire printed';
    END IF;
    raw := decode(translate(body, '-_', '+/') || repeat('=', (4 - length(body) % 4) % 4), 'base64');
    -- One text per token: base64 with non-zero unused bits decodes to the same bytes, and Rust
    -- refuses it.
    IF rtrim(translate(replace(encode(raw, 'base64'), E'\n', ''), '+/', '-_'), '=') <> body THEN
        RAISE EXCEPTION 'palisade guard: not an ownership token (not canonical base64url)'
            USING ERRCODE = 'P5013';
    END IF;
    payload := length(raw) - 64;
    IF payload < 29 OR get_byte(raw, 0) <> 2 THEN
        RAISE EXCEPTION 'palisade guard: not an ownership token (version or length)'
            USING ERRCODE = 'P5013';
    END IF;
    key_id := encode(substring(raw FROM 2 FOR 8), 'hex');
    epoch := ('x' || encode(substring(raw FROM 10 FOR 8), 'hex'))::bit(64)::bigint;
    lock_len := get_byte(raw, 25) * 256 + get_byte(raw, 26);
    at := 27 + lock_len;
    IF epoch < 0 OR lock_len = 0 OR at + 2 > payload THEN
        RAISE EXCEPTION 'palisade guard: not an ownership token (fields)' USING ERRCODE = 'P5013';
    END IF;
    at := at + 1 + get_byte(raw, at);
    IF at + 1 > payload OR at + 1 + get_byte(raw, at) <> payload THEN
        RAISE EXCEPTION 'palisade guard: not an ownership token (fields)' USING ERRCODE = 'P5013';
    END IF;
    lock := convert_from(substring(raw FROM 28 FOR lock_len), 'UTF8');
END
$$;

-- What this transaction presented, as the setting holds it: an object lock -> 'epoch:mac'
-- (anything else, as a session may set it, is nothing presented; text that is not JSON fails).
CREATE OR REPLACE FUNCTION palisade_presented() RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    setting text := current_setting('palisade.presented_tokens', true);
    presented jsonb;
BEGIN
    IF setting IS NULL OR setting !~ '^\s*\{' THEN
        RETURN '{}'::jsonb;
    END IF;
    presented := setting::jsonb;
    IF jsonb_typeof(presented) IS DISTINCT FROM 'object' THEN
        RETURN '{}'::jsonb;
    END IF;
    RETURN presented;
END
$$;

-- Presents `token` for the rest of the transaction: its lock and epoch become the only ones a
-- token-requiring table accepts for rows of that lock. Records the greatest token presented for
-- each lock (for the audit). Returns the epoch, to write as last_fence.
CREATE OR REPLACE FUNCTION palisade_present_token(token text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    claims    record;
    presented jsonb;
    greatest  bigint;
BEGIN
    SELECT * INTO claims FROM palisade_token_claims(token);
    SELECT p.epoch INTO greatest FROM palisade_presented_tokens p WHERE p.lock = claims.lock;
    IF greatest > claims.epoch THEN
        RAISE EXCEPTION 'palisade guard: epoch % of lock % is superseded: a token of epoch % was presented', claims.epoch, claims.lock, greatest
            USING ERRCODE = 'P5009', DETAIL = greatest::text, HINT = 'acquire the lock again';
    END IF;
    presented := palisade_presented();
    PERFORM set_config('palisade.presented_tokens',
                       (presented || jsonb_build_object(claims.lock, claims.epoch::text || ':'
                           || palisade_presented_mac(claims.lock, claims.epoch)))::text,
                       true);
    IF greatest IS NULL OR greatest < claims.epoch THEN
        INSERT INTO palisade_presented_tokens AS p (lock, epoch, token)
        VALUES (claims.lock, claims.epoch, token)
        ON CONFLICT (lock) DO UPDATE
            SET epoch = EXCLUDED.epoch, token = EXCLUDED.token, presented_at = now()
            WHERE p.epoch < EXCLUDED.epoch;
    END IF;
    RETURN claims.epoch;
END
$$;

-- BEFORE INSERT OR UPDATE, per row, on a table that requires tokens. Arguments as the floor
-- trigger's: the row's epoch column, then ('lock', the table's lock) or ('column', the column
-- naming the row's lock).
CREATE OR REPLACE FUNCTION palisade_guard_token() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    row_json  jsonb := to_jsonb(NEW);
    lock_name text;
    row_epoch bigint;
    presented jsonb;
    entry     text;
BEGIN
    IF TG_ARGV[1] = 'lock' THEN
        lock_name := TG_ARGV[2];
    ELSE
        lock_name := row_json ->> TG_ARGV[2];
    END IF;
    row_epoch := (row_json ->> TG_ARGV[0])::bigint;
    IF TG_OP = 'INSERT' AND row_epoch = 0 THEN
        RETURN NEW;  -- a row created with no owner yet
    END IF;
    presented := palisade_presented();
    IF presented = '{}'::jsonb THEN
        RAISE EXCEPTION 'palisade guard: a write of %.% (lock %) names no token', TG_TABLE_SCHEMA, TG_TABLE_NAME, lock_name
            USING ERRCODE = 'P5010', DETAIL = lock_name,
                  HINT = 'pass the owner''s token: … FROM palisade_present_token($token) AS t(epoch) … last_fence = t.epoch';
    END IF;
    entry := presented ->> lock_name;
    IF entry IS NULL THEN
        RAISE EXCEPTION 'palisade guard: a row of %.% is guarded by lock %, and the token presented is for %', TG_TABLE_SCHEMA, TG_TABLE_NAME, lock_name,
            (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(presented) AS k)
            USING ERRCODE = 'P5011', DETAIL = lock_name;
    END IF;
    -- The entry is palisade_present_token's only when its MAC is: a session that set the
    -- setting by hand has none.
    IF entry !~ '^[0-9]{1,19}:[0-9a-f]{64}$'
       OR split_part(entry, ':', 2) IS DISTINCT FROM
          palisade_presented_mac(lock_name, split_part(entry, ':', 1)::bigint) THEN
        RAISE EXCEPTION 'palisade guard: no token of lock % was presented through palisade_present_token in this transaction', lock_name
            USING ERRCODE = 'P5010', DETAIL = lock_name;
    END IF;
    IF row_epoch IS DISTINCT FROM split_part(entry, ':', 1)::bigint THEN
        RAISE EXCEPTION 'palisade guard: last_fence % of a row of %.% is not the epoch % of the token presented for lock %', row_epoch, TG_TABLE_SCHEMA, TG_TABLE_NAME, split_part(entry, ':', 1), lock_name
            USING ERRCODE = 'P5012', DETAIL = split_part(entry, ':', 1),
                  HINT = 'write last_fence = the epoch palisade_present_token returned';
    END IF;
    RETURN NEW;
END
$$;

-- A deleted row's tombstone names its lock too, so that a fence raised by a forged token and
-- then deleted can be found (the audit) and repaired (palisade_repair_fence) on a table whose
-- rows name their locks. Tombstones written before this migration have none.
ALTER TABLE palisade_row_fences ADD COLUMN IF NOT EXISTS lock text;

-- BEFORE DELETE, argument: the key column's name (migration 4), now recording the row's lock.
CREATE OR REPLACE FUNCTION palisade_guard_tombstone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    key       text := to_jsonb(OLD) ->> TG_ARGV[0];
    lock_name text;
BEGIN
    SELECT coalesce(g.table_lock, to_jsonb(OLD) ->> g.lock_column) INTO lock_name
    FROM palisade_guarded_tables g WHERE g.tbl = TG_RELID;
    PERFORM pg_advisory_xact_lock(TG_RELID::integer, hashtext(key));
    INSERT INTO palisade_row_fences AS r (tbl, id, fence, lock)
    VALUES (TG_RELID, key, OLD.last_fence, lock_name)
    ON CONFLICT (tbl, id) DO UPDATE
        SET fence = greatest(r.fence, EXCLUDED.fence), lock = EXCLUDED.lock;
    RETURN OLD;
END
$$;

-- Makes `target` (already guarded) require a token for every fenced write, or not.
CREATE OR REPLACE FUNCTION palisade_require_token(target regclass, required boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    known palisade_guarded_tables;
BEGIN
    SELECT * INTO known FROM palisade_guarded_tables WHERE tbl = target FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'palisade guard: % is not guarded (run palisade_install_guard first)', target;
    END IF;
    UPDATE palisade_guarded_tables SET require_token = required WHERE tbl = target;
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_token ON %s', target);
    IF required THEN
        EXECUTE format('CREATE TRIGGER palisade_guard_token BEFORE INSERT OR UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_token(%L, %L, %L)',
                       target, 'last_fence',
                       CASE WHEN known.table_lock IS NOT NULL THEN 'lock' ELSE 'column' END,
                       coalesce(known.table_lock, known.lock_column));
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER palisade_guard_token', target);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION palisade_require_token(regclass, boolean) FROM PUBLIC;
-- Presenting records a token for the audit: only the roles that write fenced rows may
-- (docs/enforcement.md, "Roles"; the audit reports any other).
REVOKE EXECUTE ON FUNCTION palisade_present_token(text) FROM PUBLIC;

-- The repair of a row fenced above anything the coordinator issued for its lock (a forged
-- token, or a bare `last_fence = 9000000000000000000` before the table required tokens):
-- every row of `lock_name` above `floor` — the coordinator's floor for the lock, asked by
-- `palisade resource repair-fence` — goes back to floor - 1, where every owner below the floor
-- is still refused and the owner at it may write; the tombstones of a table bound to that one
-- lock likewise, and a presented token above the floor is forgotten. The guard's own triggers
-- are switched off for this one statement, inside this transaction, under the table's
-- ACCESS EXCLUSIVE lock: no other session ever sees them off. Run as the table's owner.
CREATE OR REPLACE FUNCTION palisade_repair_fence(target regclass, lock_name text, floor bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    known    palisade_guarded_tables;
    repaired bigint;
    trig     text;
    triggers text[] := ARRAY['palisade_guard_update', 'palisade_guard_lock_floor',
                             'palisade_guard_token'];
BEGIN
    SELECT * INTO known FROM palisade_guarded_tables WHERE tbl = target FOR UPDATE;
    IF NOT FOUND OR floor IS NULL OR floor < 1 THEN
        RAISE EXCEPTION 'palisade guard: % is not guarded, or % is not a floor', target, floor;
    END IF;
    IF known.table_lock IS DISTINCT FROM lock_name AND known.lock_column IS NULL THEN
        RAISE EXCEPTION 'palisade guard: % is guarded by lock %, not %', target, known.table_lock, lock_name;
    END IF;
    FOREACH trig IN ARRAY triggers LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = target AND tgname = trig) THEN
            EXECUTE format('ALTER TABLE %s DISABLE TRIGGER %I', target, trig);
        END IF;
    END LOOP;
    IF known.lock_column IS NULL THEN
        EXECUTE format('UPDATE %s SET last_fence = $1 - 1 WHERE last_fence > $1', target)
            USING floor;
        GET DIAGNOSTICS repaired = ROW_COUNT;
        UPDATE palisade_row_fences SET fence = floor - 1 WHERE tbl = target AND fence > floor;
    ELSE
        EXECUTE format('UPDATE %s SET last_fence = $1 - 1 WHERE last_fence > $1 AND %I = $2',
                       target, known.lock_column) USING floor, lock_name;
        GET DIAGNOSTICS repaired = ROW_COUNT;
        UPDATE palisade_row_fences SET fence = floor - 1
        WHERE tbl = target AND lock = lock_name AND fence > floor;
    END IF;
    FOREACH trig IN ARRAY triggers LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = target AND tgname = trig) THEN
            EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', target, trig);
        END IF;
    END LOOP;
    DELETE FROM palisade_presented_tokens p WHERE p.lock = lock_name AND p.epoch > floor;
    RETURN repaired;
END
$$;
REVOKE EXECUTE ON FUNCTION palisade_repair_fence(regclass, text, bigint) FROM PUBLIC;

-- Pinned like every other Palisade function (migration 9).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname IN ('palisade_token_claims', 'palisade_present_token',
                                 'palisade_presented', 'palisade_presented_mac',
                                 'palisade_guard_tombstone',
                                 'palisade_guard_token', 'palisade_require_token',
                                 'palisade_repair_fence')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                       current_schema());
    END LOOP;
END
$$;
