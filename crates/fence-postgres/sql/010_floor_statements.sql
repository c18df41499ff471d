-- Each learned floor kept with the coordinator's signed statement of it (migration 10, P4/P6).
--
-- A floor only rises, so a forged one (2^63-1 from a man in the middle, or one call of
-- palisade_learn_floor by a role that may record floors) refuses a lock's legitimate owner
-- until the row is deleted. The database cannot check an Ed25519 signature; the writers do
-- before they record a floor (the Rust KeyRing, the Python and TypeScript clients), and they
-- now record the statement with it: `palisade audit` verifies every stored statement against
-- the coordinator's keys and reports a floor with no statement that verifies, or one above the
-- coordinator's epoch for that lock, as poisoned (critical), with the command that repairs it
-- (`palisade resource floor --postgres URL --forget LOCK`: the floor is learned again).
--
-- palisade_learn_floor(lock, floor) stays for writers of an earlier version: its floors carry
-- no statement (a floor it raises drops the statement of the lower one), and the audit reports
-- them as unsigned.

ALTER TABLE palisade_lock_floors ADD COLUMN IF NOT EXISTS statement text;

CREATE OR REPLACE FUNCTION palisade_learn_floor(lock_name text, learned bigint, signed text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    floor_now bigint;
BEGIN
    IF learned IS NULL OR learned < 0 THEN
        RAISE EXCEPTION 'palisade guard: a floor is an epoch, not %', learned;
    END IF;
    IF signed IS NULL OR length(signed) > 1024 OR left(signed, 4) <> 'pf1.' THEN
        RAISE EXCEPTION 'palisade guard: a floor is recorded with the coordinator''s statement of it (pf1.…)';
    END IF;
    INSERT INTO palisade_lock_floors AS f (lock, floor, incarnation, statement)
    VALUES (lock_name, learned, palisade_incarnation(), signed)
    ON CONFLICT (lock) DO UPDATE
        SET floor = greatest(f.floor, EXCLUDED.floor),
            statement = CASE WHEN EXCLUDED.floor >= f.floor THEN EXCLUDED.statement
                             ELSE f.statement END,
            incarnation = EXCLUDED.incarnation, learned_at = now()
    RETURNING floor INTO floor_now;
    RETURN floor_now;
END
$$;

CREATE OR REPLACE FUNCTION palisade_learn_floor(lock_name text, learned bigint)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    floor_now bigint;
BEGIN
    IF learned IS NULL OR learned < 0 THEN
        RAISE EXCEPTION 'palisade guard: a floor is an epoch, not %', learned;
    END IF;
    INSERT INTO palisade_lock_floors AS f (lock, floor, incarnation)
    VALUES (lock_name, learned, palisade_incarnation())
    ON CONFLICT (lock) DO UPDATE
        SET floor = greatest(f.floor, EXCLUDED.floor),
            statement = CASE WHEN EXCLUDED.floor > f.floor THEN NULL ELSE f.statement END,
            incarnation = EXCLUDED.incarnation, learned_at = now()
    RETURNING floor INTO floor_now;
    RETURN floor_now;
END
$$;

-- Who may record a floor without a statement may record one with it.
REVOKE EXECUTE ON FUNCTION palisade_learn_floor(text, bigint, text) FROM PUBLIC;
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN SELECT DISTINCT a.grantee::regrole::text
                   FROM pg_proc p, aclexplode(p.proacl) a
                   WHERE p.oid = 'palisade_learn_floor(text, bigint)'::regprocedure
                     AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
                     AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION palisade_learn_floor(text, bigint, text) TO %s',
                       grantee);
    END LOOP;
    EXECUTE format('ALTER FUNCTION palisade_learn_floor(text, bigint, text) '
                   'SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION palisade_learn_floor(text, bigint) '
                   'SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;
