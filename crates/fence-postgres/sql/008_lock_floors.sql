-- Each lock's floor, learned from the coordinator in this incarnation of the database
-- (migration 8, P6/P8).
--
-- A database whose files go back in time — a volume or VM snapshot put back, a point-in-time
-- recovery, a failover to a replica that had not replayed the last commits, a dump restored
-- with --clean — has forgotten the fences it raised since: an owner that those fences refused
-- would be accepted again. Nothing inside the database can tell, so no fence here is trusted
-- across an incarnation. The incarnation is the postmaster's start time, the database's oid
-- and the file of palisade_lock_floors: a physical restore needs a restart, a copy is a new
-- database, a logical restore re-creates (or truncates) this table. Within one incarnation
-- nothing goes back, and the fences are the truth.
--
-- So every fenced row written to Palisade's tables or to a guarded table checks its lock's
-- floor first: a floor learned in another incarnation, or never, refuses the write with
-- SQLSTATE P5008 (DETAIL: the lock) until a writer asks the coordinator
-- (GET /v1/locks/LOCK/floor: every owner below it is superseded) and records the answer with
-- palisade_learn_floor(lock, floor); a row whose epoch is below the floor is refused with
-- P5009 (DETAIL: the floor). The Rust adapter and the Python client do this on their own:
-- no operator step is needed for safety, and none for progress when the coordinator answers.

CREATE TABLE IF NOT EXISTS palisade_lock_floors (
    lock        text        PRIMARY KEY,
    floor       bigint      NOT NULL CHECK (floor >= 0),
    incarnation text        NOT NULL,
    learned_at  timestamptz NOT NULL DEFAULT now()
);

-- Whether this database checks floors: 'coordinator' (the default) or 'off', for writers whose
-- keys come from a file and who have no coordinator to ask (the audit reports it). A restore
-- brings back the setting of its snapshot, which is never 'off' unless an owner set it so.
CREATE TABLE IF NOT EXISTS palisade_floor_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    source    text    NOT NULL DEFAULT 'coordinator' CHECK (source IN ('coordinator', 'off'))
);
INSERT INTO palisade_floor_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION palisade_incarnation() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_postmaster_start_time()::text || ' / ' || d.oid::text || ' / '
           || coalesce(pg_relation_filenode('palisade_lock_floors')::text, '-')
    FROM pg_database d WHERE d.datname = current_database()
$$;

-- Refuses `epoch` for `lock` unless the lock's floor was learned in this incarnation and the
-- epoch is not below it. An epoch of 0 (a row created with no owner yet) is not an owner's.
CREATE OR REPLACE FUNCTION palisade_check_lock_floor(lock_name text, epoch bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    known palisade_lock_floors;
BEGIN
    IF epoch = 0 OR (SELECT source FROM palisade_floor_settings WHERE singleton) = 'off' THEN
        RETURN;
    END IF;
    SELECT * INTO known FROM palisade_lock_floors f WHERE f.lock = lock_name;
    IF NOT FOUND OR known.incarnation <> palisade_incarnation() THEN
        RAISE EXCEPTION 'palisade guard: the floor of lock % is not known since this database started or was restored', lock_name
            USING ERRCODE = 'P5008', DETAIL = lock_name,
                  HINT = 'ask the coordinator (GET /v1/locks/LOCK/floor) and record it with palisade_learn_floor(lock, floor); the Palisade clients do';
    END IF;
    IF epoch IS NULL OR epoch < known.floor THEN
        RAISE EXCEPTION 'palisade guard: epoch % of lock % is superseded: the coordinator''s floor is %', epoch, lock_name, known.floor
            USING ERRCODE = 'P5009', DETAIL = known.floor::text,
                  HINT = 'acquire the lock again';
    END IF;
END
$$;

-- The floor of `lock_name` learned in this incarnation (0 when floors are off); NULL when it
-- must be learned again. For a ledger that weighs epochs itself (the effects ledger).
CREATE OR REPLACE FUNCTION palisade_known_floor(lock_name text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE WHEN (SELECT source FROM palisade_floor_settings WHERE singleton) = 'off' THEN 0
                ELSE (SELECT f.floor FROM palisade_lock_floors f
                      WHERE f.lock = lock_name AND f.incarnation = palisade_incarnation())
           END
$$;

-- Records the coordinator's floor for `lock_name` in this incarnation; a floor never goes down
-- (one from an older incarnation is raised, not trusted). Returns the floor now in force.
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
        SET floor = greatest(f.floor, EXCLUDED.floor), incarnation = EXCLUDED.incarnation,
            learned_at = now()
    RETURNING floor INTO floor_now;
    RETURN floor_now;
END
$$;

-- BEFORE INSERT OR UPDATE, per row. Arguments: the row's epoch column, then either
-- ('column', the column naming the row's lock) or ('lock', the lock of every row).
CREATE OR REPLACE FUNCTION palisade_guard_lock_floor() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    row_json  jsonb := to_jsonb(NEW);
    lock_name text;
BEGIN
    IF TG_ARGV[1] = 'lock' THEN
        lock_name := TG_ARGV[2];
    ELSE
        lock_name := row_json ->> TG_ARGV[2];
    END IF;
    PERFORM palisade_check_lock_floor(lock_name, (row_json ->> TG_ARGV[0])::bigint);
    RETURN NEW;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION palisade_check_lock_floor(text, bigint) SET search_path = pg_catalog, %I',
                   current_schema());
    EXECUTE format('ALTER FUNCTION palisade_learn_floor(text, bigint) SET search_path = pg_catalog, %I',
                   current_schema());
    EXECUTE format('ALTER FUNCTION palisade_known_floor(text) SET search_path = pg_catalog, %I',
                   current_schema());
END
$$;

-- Installs the floor trigger (ENABLE ALWAYS) on `target`.
CREATE OR REPLACE FUNCTION palisade_install_lock_floor(
    target regclass, epoch_column text, lock_kind text, lock_value text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER palisade_guard_lock_floor BEFORE INSERT OR UPDATE '
                   'ON %s FOR EACH ROW EXECUTE FUNCTION palisade_guard_lock_floor(%L, %L, %L)',
                   target, epoch_column, lock_kind, lock_value);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER palisade_guard_lock_floor', target);
END
$$;

SELECT palisade_install_lock_floor(t, e, 'column', 'lock')
FROM (VALUES ('palisade_kv'::regclass, 'epoch'), ('palisade_fences'::regclass, 'fence'),
             ('palisade_lock_epochs'::regclass, 'epoch')) AS own(t, e);

-- The guard of migration 6, then the floor trigger bound to the same lock(s).
ALTER FUNCTION palisade_install_guard(regclass, text, boolean, text, text)
    RENAME TO palisade_install_guard_v6;
CREATE OR REPLACE FUNCTION palisade_install_guard(
    target regclass, id_column text, guard_rows boolean, table_lock text, lock_column text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM palisade_install_guard_v6(target, id_column, guard_rows, table_lock, lock_column);
    IF table_lock IS NOT NULL THEN
        PERFORM palisade_install_lock_floor(target, 'last_fence', 'lock', table_lock);
    ELSE
        PERFORM palisade_install_lock_floor(target, 'last_fence', 'column', lock_column);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION palisade_install_guard_v6(regclass, text, boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION palisade_install_guard(regclass, text, boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION palisade_install_lock_floor(regclass, text, text, text) FROM PUBLIC;
-- A floor only rises, so a role that may record one could stop a lock's writes: only the
-- roles that write fenced rows get it (docs/enforcement.md, "Roles").
REVOKE EXECUTE ON FUNCTION palisade_learn_floor(text, bigint) FROM PUBLIC;

SELECT palisade_install_lock_floor(tbl, 'last_fence',
           CASE WHEN table_lock IS NOT NULL THEN 'lock' ELSE 'column' END,
           coalesce(table_lock, lock_column))
FROM palisade_guarded_tables WHERE to_regclass(tbl::regclass::text) IS NOT NULL;

-- The findings of migration 6, and the floor trigger.
ALTER FUNCTION palisade_guard_findings(regclass, name) RENAME TO palisade_guard_findings_v6;
CREATE OR REPLACE FUNCTION palisade_guard_findings(target regclass, who name)
RETURNS SETOF text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT * FROM palisade_guard_findings_v6(target, who);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = who) THEN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = target
                       AND tgname = 'palisade_guard_lock_floor' AND tgenabled = 'A') THEN
            RETURN NEXT format('trigger palisade_guard_lock_floor on %s is missing or does not fire always (a restored database would re-admit superseded owners)', target);
        END IF;
        IF (SELECT source FROM palisade_floor_settings WHERE singleton) = 'off' THEN
            RETURN NEXT 'palisade_floor_settings.source is off: a restored database re-admits superseded owners';
        END IF;
        IF has_table_privilege(who, 'palisade_lock_floors', 'INSERT')
           OR has_table_privilege(who, 'palisade_lock_floors', 'UPDATE')
           OR has_table_privilege(who, 'palisade_lock_floors', 'DELETE')
           OR has_table_privilege(who, 'palisade_floor_settings', 'UPDATE') THEN
            RETURN NEXT format('%s may change palisade_lock_floors or palisade_floor_settings directly', who);
        END IF;
    END IF;
END
$$;
