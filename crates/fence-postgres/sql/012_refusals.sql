-- Refused writes, where the audit and the console can read them (migration 12).
--
-- A stale owner's write is refused with an error (P5009), so the transaction that tried it
-- rolls back, and with it anything the refusal could have written: PostgreSQL has no
-- autonomous transactions. The writer records the refusal afterwards, in a statement of its
-- own, with palisade_record_refusal(token): the Rust adapter, the Python and the TypeScript
-- clients do; a SQL-only writer runs it after its ROLLBACK.
--
-- What the database can check, it does: the token's epoch must be below what it holds for the
-- token's lock (the greatest token presented, the lock's floor, the adapter's fence or
-- greatest epoch), so a lock it never fenced, or an owner that is not stale, is not recorded.
-- It cannot check a signature: a caller could record a forged token of a real lock. So the
-- token is kept with the record, and `palisade audit` verifies it with the coordinator's keys
-- before it shows it; one that does not verify is counted apart and reported
-- (`forged_refusal`).
--
-- Bounded, and never a wait: the newest 32 refusals per lock and 1,000 in all are kept (a
-- writer flooding one lock pushes out only that lock's older ones); rows another session is
-- deleting are skipped, not waited for, and no row is shared between recorders (the total is
-- the id sequence's), so recording never delays another writer.

CREATE TABLE IF NOT EXISTS palisade_refusals (
    id     bigserial   PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    lock   text        NOT NULL,
    epoch  bigint      NOT NULL,
    fence  bigint      NOT NULL,
    reason text        NOT NULL,
    token  text        NOT NULL
);
CREATE INDEX IF NOT EXISTS palisade_refusals_by_lock ON palisade_refusals (lock, id);

REVOKE ALL ON palisade_refusals FROM PUBLIC;
REVOKE ALL ON SEQUENCE palisade_refusals_id_seq FROM PUBLIC;

-- Records that `token` was refused as stale, if its epoch is below what this database holds
-- for its lock. Returns whether it recorded anything.
CREATE OR REPLACE FUNCTION palisade_record_refusal(token text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    claims record;
    fence  bigint;
BEGIN
    SELECT * INTO claims FROM palisade_token_claims(token);
    SELECT greatest(
               (SELECT p.epoch FROM palisade_presented_tokens p WHERE p.lock = claims.lock),
               (SELECT f.floor FROM palisade_lock_floors f WHERE f.lock = claims.lock),
               (SELECT e.epoch FROM palisade_lock_epochs e WHERE e.lock = claims.lock),
               (SELECT f.fence FROM palisade_fences f WHERE f.lock = claims.lock),
               (SELECT max(k.epoch) FROM palisade_kv k WHERE k.lock = claims.lock))
      INTO fence;
    IF fence IS NULL OR claims.epoch >= fence THEN
        RETURN false;
    END IF;
    INSERT INTO palisade_refusals (lock, epoch, fence, reason, token)
    VALUES (claims.lock, claims.epoch, fence, 'stale_epoch', token);
    DELETE FROM palisade_refusals WHERE id IN (
        SELECT r.id FROM palisade_refusals r WHERE r.lock = claims.lock
         ORDER BY r.id DESC OFFSET 32 FOR UPDATE SKIP LOCKED);
    DELETE FROM palisade_refusals WHERE id IN (
        SELECT r.id FROM palisade_refusals r
         WHERE r.id <= (SELECT max(n.id) FROM palisade_refusals n) - 1000
           FOR UPDATE SKIP LOCKED);
    RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION palisade_record_refusal(text) FROM PUBLIC;

-- What the audit reads: the newest refusals with their tokens (to verify), and the number
-- recorded so far (the id sequence: a recording that rolled back counts too; anyone may
-- read the number).
CREATE OR REPLACE FUNCTION palisade_recent_refusals(max_rows integer)
RETURNS TABLE (at_ms bigint, lock text, epoch bigint, fence bigint, reason text, token text)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT (extract(epoch FROM r.at) * 1000)::bigint, r.lock, r.epoch, r.fence, r.reason, r.token
      FROM palisade_refusals r ORDER BY r.id DESC LIMIT max_rows
$$;
-- A token is a bearer credential at every resource its newer owner has not written yet: only
-- the owner, and the roles it grants this to (the audit's), read them.
REVOKE EXECUTE ON FUNCTION palisade_recent_refusals(integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION palisade_refusal_count() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM palisade_refusals_id_seq s
$$;

-- Pinned like every other Palisade function (migration 9).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname IN ('palisade_record_refusal', 'palisade_recent_refusals',
                                 'palisade_refusal_count')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                       current_schema());
    END LOOP;
END
$$;
