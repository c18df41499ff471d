-- Palisade bypass guard functions (migration 2). Install them on a table with
-- palisade_install_guard (below) or by hand with CREATE TRIGGER.

-- Any UPDATE must strictly raise last_fence. A forgotten code path or an admin script that
-- updates a fenced row without going through the fence (and so without a higher epoch) fails
-- inside the database, with SQLSTATE P5001.
CREATE OR REPLACE FUNCTION palisade_guard_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_fence IS NULL OR OLD.last_fence IS NULL OR NEW.last_fence <= OLD.last_fence THEN
        RAISE EXCEPTION 'palisade guard: an update of %.% must raise last_fence (from % to %)',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, OLD.last_fence, NEW.last_fence
            USING ERRCODE = 'P5001',
                  HINT = 'write through the Palisade fence with a current ownership token';
    END IF;
    RETURN NEW;
END
$$;

-- Opt-in: INSERT and DELETE only on the guarded path, which marks its transaction with
-- SET LOCAL palisade.fenced_path = 'on'.
CREATE OR REPLACE FUNCTION palisade_guard_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('palisade.fenced_path', true), '') <> 'on' THEN
        RAISE EXCEPTION 'palisade guard: % on %.% outside the fenced path',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'P5002',
                  HINT = 'insert and delete fenced rows through the Palisade adapter';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

-- Installs the guard on a table that has a non-null bigint last_fence column. Idempotent.
CREATE OR REPLACE FUNCTION palisade_install_guard(target regclass, guard_rows boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = target AND attname = 'last_fence' AND NOT attisdropped
          AND atttypid = 'bigint'::regtype AND attnotnull
    ) THEN
        RAISE EXCEPTION 'palisade guard: % needs a column last_fence bigint NOT NULL', target;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_update ON %s', target);
    EXECUTE format('CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_fence()', target);
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_rows ON %s', target);
    IF guard_rows THEN
        EXECUTE format('CREATE TRIGGER palisade_guard_rows BEFORE INSERT OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_rows()', target);
    END IF;
END
$$;
