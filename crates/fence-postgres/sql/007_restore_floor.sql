-- The restore floor (migration 7, P6). A database restored from a backup has forgotten every
-- fence it raised after that backup: an old owner whose token those fences refused would be
-- accepted again. `palisade resource restore --postgres URL` records here an epoch the
-- coordinator issued after the restore (so above every token issued before it) and installs
-- the floor trigger on Palisade's tables and on every guarded table: from then on a row written
-- with an epoch at or below the floor fails, through the adapter or in plain SQL (SQLSTATE
-- P5007, DETAIL the floor). Until a restore applies a floor, no trigger is installed and writes
-- cost nothing more.
CREATE TABLE IF NOT EXISTS palisade_restore_floor (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    floor      bigint      NOT NULL CHECK (floor >= 0),
    token      text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- BEFORE INSERT OR UPDATE, argument: the name of the row's epoch column.
CREATE OR REPLACE FUNCTION palisade_guard_floor() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    restore_floor bigint;
    epoch         bigint := (to_jsonb(NEW) ->> TG_ARGV[0])::bigint;
BEGIN
    SELECT f.floor INTO restore_floor FROM palisade_restore_floor f WHERE f.singleton;
    IF restore_floor IS NOT NULL AND (epoch IS NULL OR epoch <= restore_floor) THEN
        RAISE EXCEPTION 'palisade guard: %.% was restored from a backup; epoch % is not above the restore floor %',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, epoch, restore_floor
            USING ERRCODE = 'P5007', DETAIL = restore_floor::text,
                  HINT = 'acquire the lock again: every token issued before the restore is refused';
    END IF;
    RETURN NEW;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION palisade_guard_floor() SET search_path = pg_catalog, %I',
                   current_schema());
END
$$;

-- Installs the floor trigger (ENABLE ALWAYS) on Palisade's tables and on every table carrying
-- the guard. Idempotent; run by the restore, and again after a guard is installed once a floor
-- exists.
CREATE OR REPLACE FUNCTION palisade_install_floor() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    target regclass;
    col    text;
BEGIN
    FOR target, col IN
        SELECT 'palisade_kv'::regclass, 'epoch'
        UNION ALL SELECT 'palisade_fences'::regclass, 'fence'
        UNION ALL SELECT 'palisade_lock_epochs'::regclass, 'epoch'
        UNION ALL SELECT DISTINCT tgrelid::regclass, 'last_fence' FROM pg_trigger
                  WHERE tgname = 'palisade_guard_update'
    LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER palisade_guard_floor BEFORE INSERT OR UPDATE '
                       'ON %s FOR EACH ROW EXECUTE FUNCTION palisade_guard_floor(%L)', target, col);
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER palisade_guard_floor', target);
    END LOOP;
END
$$;
