-- The guard against a role that can run SQL, and each guarded table bound to its lock
-- (migration 6).
--
-- Before: TRUNCATE fired no row trigger (every fence and tombstone gone at once);
-- `SET session_replication_role = replica` switched the triggers off; any session could set
-- the "fenced path" marker; and any row accepted a valid token of *any* lock, because epochs
-- come from one counter for all locks.
--
-- Now:
-- * the guard's triggers fire ALWAYS (also under session_replication_role = replica), and a
--   statement-level trigger refuses TRUNCATE (SQLSTATE P5004);
-- * the trigger functions run as their owner (SECURITY DEFINER), so the roles that write a
--   guarded table need no privilege on palisade_row_fences, and the application's role needs
--   none at all: docs/enforcement.md gives it SELECT only, which is what makes the marker,
--   TRUNCATE and a raised last_fence refusals for it (permission denied, SQLSTATE 42501);
-- * palisade_guarded_tables records the lock that guards each table: one lock for the whole
--   table, or a text column in which each row names its lock (never changed by an UPDATE,
--   SQLSTATE P5005). The adapter refuses a token for another lock;
-- * palisade_guard_findings(table, role) lists what would let `role` bypass the guard.

CREATE TABLE IF NOT EXISTS palisade_guarded_tables (
    tbl         oid  PRIMARY KEY,
    key_column  text NOT NULL,
    table_lock  text,
    lock_column text,
    guard_rows  boolean NOT NULL,
    CHECK ((table_lock IS NULL) <> (lock_column IS NULL))
);

ALTER FUNCTION palisade_guard_tombstone() SECURITY DEFINER;
ALTER FUNCTION palisade_guard_insert() SECURITY DEFINER;
-- A SECURITY DEFINER function must not resolve names through the caller's search_path: pin it
-- to the schema these migrations run in.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION palisade_guard_tombstone() SET search_path = pg_catalog, %I',
                   current_schema());
    EXECUTE format('ALTER FUNCTION palisade_guard_insert() SET search_path = pg_catalog, %I',
                   current_schema());
END
$$;

-- BEFORE UPDATE. Any UPDATE must strictly raise last_fence (P5001); with an argument (the
-- lock column's name), the row's lock cannot change (P5005).
CREATE OR REPLACE FUNCTION palisade_guard_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_fence IS NULL OR OLD.last_fence IS NULL OR NEW.last_fence <= OLD.last_fence THEN
        RAISE EXCEPTION 'palisade guard: an update of %.% must raise last_fence (from % to %)',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, OLD.last_fence, NEW.last_fence
            USING ERRCODE = 'P5001',
                  HINT = 'write through the Palisade fence with a current ownership token';
    END IF;
    IF TG_NARGS > 0
       AND (to_jsonb(NEW) ->> TG_ARGV[0]) IS DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0]) THEN
        RAISE EXCEPTION 'palisade guard: the lock guarding a row of %.% cannot change (% to %)',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, to_jsonb(OLD) ->> TG_ARGV[0],
            to_jsonb(NEW) ->> TG_ARGV[0]
            USING ERRCODE = 'P5005',
                  HINT = 'delete the row and re-create it under the other lock, through the fence';
    END IF;
    RETURN NEW;
END
$$;

-- BEFORE TRUNCATE, per statement: a truncate would take every row's fence with it.
CREATE OR REPLACE FUNCTION palisade_guard_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'palisade guard: TRUNCATE of %.% would forget every row''s fence',
        TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'P5004',
              HINT = 'delete rows through the Palisade adapter (their fences stay as tombstones)';
END
$$;

-- Installs the guard on `target` (a non-null bigint last_fence column, key column `id_column`),
-- bound to one lock for the whole table (`table_lock`) or to a text column naming each row's
-- lock (`lock_column`): exactly one of the two. Re-installing with the same binding is a no-op
-- apart from guard_rows; another binding is refused (drop the table's row in
-- palisade_guarded_tables first, knowingly). Every trigger is ENABLE ALWAYS.
CREATE OR REPLACE FUNCTION palisade_install_guard(
    target regclass, id_column text, guard_rows boolean, table_lock text, lock_column text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    known palisade_guarded_tables;
    trig  text;
BEGIN
    IF (table_lock IS NULL) = (lock_column IS NULL) THEN
        RAISE EXCEPTION 'palisade guard: bind % to one lock (table_lock) or to a lock column (lock_column), not both or neither', target;
    END IF;
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
    IF lock_column IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = target AND attname = lock_column AND NOT attisdropped
          AND atttypid = 'text'::regtype AND attnotnull
    ) THEN
        RAISE EXCEPTION 'palisade guard: % needs its lock column % as text NOT NULL', target, lock_column;
    END IF;
    SELECT * INTO known FROM palisade_guarded_tables WHERE tbl = target FOR UPDATE;
    IF FOUND AND (known.key_column, known.table_lock, known.lock_column)
                 IS DISTINCT FROM (id_column, table_lock, lock_column) THEN
        RAISE EXCEPTION 'palisade guard: % is guarded by %, not %', target,
            coalesce('lock ' || known.table_lock, 'the locks in column ' || known.lock_column),
            coalesce('lock ' || table_lock, 'the locks in column ' || lock_column)
            USING ERRCODE = 'P5006';
    END IF;
    INSERT INTO palisade_guarded_tables AS g (tbl, key_column, table_lock, lock_column, guard_rows)
    VALUES (target, id_column, table_lock, lock_column, guard_rows)
    ON CONFLICT (tbl) DO UPDATE SET guard_rows = EXCLUDED.guard_rows;

    FOREACH trig IN ARRAY ARRAY['palisade_guard_update', 'palisade_guard_tombstone',
                                'palisade_guard_insert', 'palisade_guard_rows',
                                'palisade_guard_truncate'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trig, target);
    END LOOP;
    IF lock_column IS NULL THEN
        EXECUTE format('CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_fence()', target);
    ELSE
        EXECUTE format('CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_fence(%L)', target, lock_column);
    END IF;
    EXECUTE format('CREATE TRIGGER palisade_guard_tombstone BEFORE DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_tombstone(%L)', target, id_column);
    EXECUTE format('CREATE TRIGGER palisade_guard_insert BEFORE INSERT ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION palisade_guard_insert(%L)', target, id_column);
    EXECUTE format('CREATE TRIGGER palisade_guard_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION palisade_guard_truncate()', target);
    IF guard_rows THEN
        EXECUTE format('CREATE TRIGGER palisade_guard_rows BEFORE INSERT OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION palisade_guard_rows()', target);
    END IF;
    FOR trig IN SELECT tgname FROM pg_trigger
                WHERE tgrelid = target AND tgname LIKE 'palisade\_guard\_%' LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', target, trig);
    END LOOP;
END
$$;

-- The three-argument form bound the table to no lock: it now refuses, naming the one to use.
CREATE OR REPLACE FUNCTION palisade_install_guard(target regclass, id_column text, guard_rows boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'palisade guard: use palisade_install_guard(%, %, %, TABLE_LOCK, NULL) or (…, NULL, LOCK_COLUMN): a guarded table must know the lock that guards it', target, id_column, guard_rows;
END
$$;

-- What would let `who` write `target` without the fence, one finding per line (none: the
-- guard holds against that role). Checks the role's attributes and privileges as PostgreSQL
-- resolves them (memberships included), and that every guard trigger is installed and fires
-- always.
CREATE OR REPLACE FUNCTION palisade_guard_findings(target regclass, who name)
RETURNS SETOF text LANGUAGE plpgsql STABLE AS $$
DECLARE
    r      pg_roles;
    owner  oid;
    priv   text;
    trig   text;
    helper text;
BEGIN
    SELECT * INTO r FROM pg_roles WHERE rolname = who;
    IF NOT FOUND THEN
        RETURN NEXT format('role %s does not exist', who);
        RETURN;
    END IF;
    IF r.rolsuper THEN
        RETURN NEXT format('%s is a superuser (can drop or disable the triggers)', who);
    END IF;
    SELECT relowner INTO owner FROM pg_class WHERE oid = target;
    IF pg_has_role(who, owner, 'USAGE') THEN
        RETURN NEXT format('%s owns %s (can drop or disable the triggers)', who, target);
    END IF;
    FOREACH priv IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER'] LOOP
        IF has_table_privilege(who, target, priv) THEN
            RETURN NEXT format('%s may %s %s directly', who, priv, target);
        END IF;
    END LOOP;
    FOREACH helper IN ARRAY ARRAY['palisade_row_fences', 'palisade_guarded_tables'] LOOP
        FOREACH priv IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'] LOOP
            IF has_table_privilege(who, helper, priv) THEN
                RETURN NEXT format('%s may %s %s', who, priv, helper);
            END IF;
        END LOOP;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM palisade_guarded_tables WHERE tbl = target) THEN
        RETURN NEXT format('%s is not registered in palisade_guarded_tables (run palisade_install_guard)', target);
    END IF;
    FOREACH trig IN ARRAY ARRAY['palisade_guard_update', 'palisade_guard_tombstone',
                                'palisade_guard_insert', 'palisade_guard_truncate'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgrelid = target AND tgname = trig AND tgenabled = 'A') THEN
            RETURN NEXT format('trigger %s on %s is missing or does not fire always', trig, target);
        END IF;
    END LOOP;
END
$$;

-- Removes the guard from `target` with its binding and its tombstones: for a table about to be
-- dropped (DROP TABLE alone leaves them behind, keyed by an oid PostgreSQL may reuse). Run it as
-- the table's owner, in the transaction that drops the table.
CREATE OR REPLACE FUNCTION palisade_drop_guard(target regclass)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    trig text;
BEGIN
    FOR trig IN SELECT tgname FROM pg_trigger
                WHERE tgrelid = target AND tgname LIKE 'palisade\_guard\_%' LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, target);
    END LOOP;
    DELETE FROM palisade_row_fences WHERE tbl = target;
    DELETE FROM palisade_guarded_tables WHERE tbl = target;
END
$$;

-- Only owners install and remove guards.
REVOKE EXECUTE ON FUNCTION palisade_install_guard(regclass, text, boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION palisade_drop_guard(regclass) FROM PUBLIC;
