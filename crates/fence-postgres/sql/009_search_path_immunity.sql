-- Every Palisade function immune to the caller's search_path, and an incarnation that does not
-- depend on the session (migration 9, P5/P6).
--
-- A function resolves the names in its body — functions, operators, tables, casts — through
-- the search_path of the session that calls it, unless it sets its own. A DBA who put a schema
-- with a shadow `<` on bigint (really `<>`) ahead of pg_catalog in a writer role's search_path
-- (ALTER ROLE … SET search_path) turned the guard's comparison around; a writer with CREATE on
-- a schema in its path could shadow palisade_check_lock_floor itself. Pinned to
-- `pg_catalog, <this schema>`, every name in every Palisade function resolves to PostgreSQL's
-- own operators and to Palisade's own objects, whoever calls it. pg_temp is named last: left
-- out, the session's temporary schema is searched *first* for tables, and any role may create
-- a temporary `palisade_floor_settings` saying 'off' (functions and operators are never looked
-- up there). The pin is set last, here, over every function: a later migration that re-creates
-- a function (CREATE OR REPLACE drops its settings) pins it again. The audit checks each
-- function's setting exactly, its owner and its body, and who may create objects in this
-- schema (an overload there with the exact argument types, e.g. `to_jsonb(a_table)`, is
-- preferred over pg_catalog's polymorphic one).
--
-- The incarnation was built from pg_postmaster_start_time()::text, rendered in each session's
-- TimeZone and DateStyle: writers with different settings invalidated each other's floors.
-- It is now the start time in microseconds since 1970 (no rendering), the database's oid and
-- the floors table's file. Every lock's floor is learned once more after this migration.

CREATE OR REPLACE FUNCTION palisade_incarnation() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text || ' / '
           || d.oid::text || ' / '
           || coalesce(pg_relation_filenode('palisade_lock_floors')::text, '-')
    FROM pg_database d WHERE d.datname = current_database()
$$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname LIKE 'palisade\_%'
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                       current_schema());
    END LOOP;
END
$$;
