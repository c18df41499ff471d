-- Refused writes, where the audit and the console can read them (migration 12).
--
-- A stale owner's write is refused with an error (P5009), so the transaction that tried it
-- rolls back, and with it anything the refusal could have written: PostgreSQL has no
-- autonomous transactions. The writer records the refusal afterwards, in a transaction of its
-- own, with palisade_record_refusal(token): the Rust adapter, the Python and the TypeScript
-- clients do; a SQL-only writer runs it after its ROLLBACK. The function records only what is
-- true when it runs: a token whose epoch is below what the database already holds for its
-- lock (the greatest token presented, or the lock's floor). A role that may run it can make
-- no refusal up; it can only repeat a real one (each kept row names when it was recorded).
--
-- Bounded: the newest 1,000 refusals are kept (older ones leave as new ones come), and a
-- running count per reason in palisade_refusal_totals. `palisade audit` reads both, like the
-- reference store's GET /v1/rejections.

CREATE TABLE IF NOT EXISTS palisade_refusals (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    lock        text        NOT NULL,
    epoch       bigint      NOT NULL,
    fence       bigint      NOT NULL,
    reason      text        NOT NULL
);

CREATE TABLE IF NOT EXISTS palisade_refusal_totals (
    reason text   PRIMARY KEY,
    n      bigint NOT NULL DEFAULT 0
);

REVOKE ALL ON palisade_refusals FROM PUBLIC;
REVOKE ALL ON palisade_refusal_totals FROM PUBLIC;

-- Records that `token` was refused as stale, if it is: its epoch is below the greatest token
-- presented for its lock, or below the lock's floor. Returns whether it recorded anything.
CREATE OR REPLACE FUNCTION palisade_record_refusal(token text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    claims record;
    fence  bigint;
BEGIN
    SELECT * INTO claims FROM palisade_token_claims(token);
    SELECT greatest(
               (SELECT p.epoch FROM palisade_presented_tokens p WHERE p.lock = claims.lock),
               (SELECT f.floor FROM palisade_lock_floors f WHERE f.lock = claims.lock))
      INTO fence;
    IF fence IS NULL OR claims.epoch >= fence THEN
        RETURN false;
    END IF;
    INSERT INTO palisade_refusals (lock, epoch, fence, reason)
    VALUES (claims.lock, claims.epoch, fence, 'stale_epoch');
    INSERT INTO palisade_refusal_totals AS t (reason, n) VALUES ('stale_epoch', 1)
        ON CONFLICT (reason) DO UPDATE SET n = t.n + 1;
    DELETE FROM palisade_refusals
     WHERE id OPERATOR(pg_catalog.<=) (SELECT max(r.id) FROM palisade_refusals r) - 1000;
    RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION palisade_record_refusal(text) FROM PUBLIC;

-- What the audit reads: the newest refusals, and the totals (a role given EXECUTE on these
-- reads them without reading the tables).
CREATE OR REPLACE FUNCTION palisade_recent_refusals(max_rows integer)
RETURNS TABLE (at_ms bigint, lock text, epoch bigint, fence bigint, reason text)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT (extract(epoch FROM r.at) * 1000)::bigint, r.lock, r.epoch, r.fence, r.reason
      FROM palisade_refusals r ORDER BY r.id DESC LIMIT max_rows
$$;

CREATE OR REPLACE FUNCTION palisade_refusal_counts()
RETURNS TABLE (reason text, n bigint)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT t.reason, t.n FROM palisade_refusal_totals t ORDER BY 1
$$;

-- Pinned like every other Palisade function (migration 9).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname IN ('palisade_record_refusal', 'palisade_recent_refusals',
                                 'palisade_refusal_counts')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                       current_schema());
    END LOOP;
END
$$;
