-- A row's fence outlives the row (migration 4). Before, deleting a fenced row forgot its
-- last_fence: the new owner (epoch 7) deleted row 7, the old owner (5) re-inserted it with
-- last_fence 0 and then updated it, accepted below a fence of 7.
--
-- Every delete of a guarded table records the row's last_fence here (a tombstone, only ever
-- raised); re-creating the row needs a last_fence above it. Both sides take the same
-- transaction-level advisory lock on (table, key) before they look, so a delete and a
-- re-insert of one key cannot pass each other unseen.
CREATE TABLE IF NOT EXISTS palisade_row_fences (
    tbl   oid    NOT NULL,
    id    text   NOT NULL,
    fence bigint NOT NULL CHECK (fence >= 0),
    PRIMARY KEY (tbl, id)
);

-- BEFORE DELETE, argument: the key column's name.
CREATE OR REPLACE FUNCTION palisade_guard_tombstone() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    key text := to_jsonb(OLD) ->> TG_ARGV[0];
BEGIN
    PERFORM pg_advisory_xact_lock(TG_RELID::integer, hashtext(key));
    INSERT INTO palisade_row_fences AS r (tbl, id, fence)
    VALUES (TG_RELID, key, OLD.last_fence)
    ON CONFLICT (tbl, id) DO UPDATE SET fence = greatest(r.fence, EXCLUDED.fence);
    RETURN OLD;
END
$$;

-- BEFORE INSERT, argument: the key column's name. A row deleted at fence F comes back only
-- with last_fence > F (SQLSTATE P5003; DETAIL is F).
CREATE OR REPLACE FUNCTION palisade_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    key  text := to_jsonb(NEW) ->> TG_ARGV[0];
    tomb bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(TG_RELID::integer, hashtext(key));
    SELECT fence INTO tomb FROM palisade_row_fences WHERE tbl = TG_RELID AND id = key;
    IF tomb IS NOT NULL AND (NEW.last_fence IS NULL OR NEW.last_fence <= tomb) THEN
        RAISE EXCEPTION 'palisade guard: row % of %.% was deleted at fence %; re-creating it needs a higher epoch than % (got %)',
            key, TG_TABLE_SCHEMA, TG_TABLE_NAME, tomb, tomb, NEW.last_fence
            USING ERRCODE = 'P5003', DETAIL = tomb::text,
                  HINT = 'create fenced rows through the Palisade adapter with a current token';
    END IF;
    RETURN NEW;
END
$$;

-- Installs the guard on a table with a non-null bigint last_fence column and the key column
-- `id_column`: updates must raise last_fence, deletes leave a tombstone, inserts respect it;
-- with guard_rows, INSERT and DELETE only on the fenced path. Idempotent.
CREATE OR REPLACE FUNCTION palisade_install_guard(target regclass, id_column text, guard_rows boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = target AND attname = 'last_fence' AND NOT attisdropped
          AND atttypid = 'bigint'::regtype AND attnotnull
    ) THEN
        RAISE EXCEPTION 'palisade guard: % needs a column last_fence bigint NOT NULL', target;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = target AND attname = id_column AND NOT attisdropped
    ) THEN
        RAISE EXCEPTION 'palisade guard: % has no column %', target, id_column;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_update ON %s', target);
    EXECUTE format('CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_fence()', target);
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_tombstone ON %s', target);
    EXECUTE format('CREATE TRIGGER palisade_guard_tombstone BEFORE DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_tombstone(%L)', target, id_column);
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_insert ON %s', target);
    EXECUTE format('CREATE TRIGGER palisade_guard_insert BEFORE INSERT ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_insert(%L)', target, id_column);
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard_rows ON %s', target);
    IF guard_rows THEN
        EXECUTE format('CREATE TRIGGER palisade_guard_rows BEFORE INSERT OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_rows()', target);
    END IF;
END
$$;

-- The two-argument form installed no tombstones: it now refuses, naming the one to use.
CREATE OR REPLACE FUNCTION palisade_install_guard(target regclass, guard_rows boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'palisade guard: use palisade_install_guard(%, KEY_COLUMN, %): a guarded table needs its key column so that a deleted row keeps its fence', target, guard_rows;
END
$$;
