//! What a DBA can change around Palisade's functions without touching their bodies: their
//! settings and owners, and the search_path of the roles that call them (migration 9, P5).
//!
//! - Every `palisade_*` function of the guard's schema must set exactly
//!   `search_path = pg_catalog, <schema>, pg_temp`: any other path (a shadow schema first,
//!   none, or one without `pg_temp` last — the session's temporary tables are then searched
//!   first) lets a name in its body resolve to someone else's operator, function or table.
//! - Nobody but the schema's owner (and superusers) may create objects in the guard's schema:
//!   an overload there with exact argument types (`to_jsonb(a_table)`) is preferred over
//!   pg_catalog's polymorphic one, pin or no pin. Functions and operators already there that
//!   are named as pg_catalog's are reported too.
//! - Every one must belong to the owner of Palisade's tables: its owner can change its body
//!   and its settings.
//! - A role's or a database's `search_path` (ALTER ROLE / ALTER DATABASE … SET search_path)
//!   that lists a schema ahead of pg_catalog, where that schema defines an operator or a
//!   function PostgreSQL or Palisade defines under the same name, turns plain SQL of that role
//!   (the fenced `UPDATE … WHERE last_fence < $epoch`) into something else: critical. A schema
//!   ahead of pg_catalog that roles other than its owner may CREATE in is where such a shadow
//!   can appear at any time: a warning.

use tokio_postgres::Client;

use crate::{pg, problem, Problem, Severity};

const FUNCTION_SETTINGS: &str = "SELECT p.oid::regprocedure::text, \
    coalesce(array_to_string(p.proconfig, ','), ''), \
    'search_path=pg_catalog, ' || quote_ident(n.nspname) || ', pg_temp', \
    pg_get_userbyid(p.proowner)::text, \
    coalesce((SELECT pg_get_userbyid(c.relowner)::text FROM pg_class c \
              WHERE c.relname = 'palisade_lock_floors' AND c.relnamespace = n.oid), '') \
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
    WHERE p.pronamespace = $1::oid AND p.proname LIKE 'palisade\\_%' ORDER BY 1";

/// Each Palisade function's `search_path` setting is exactly the pinned one, and its owner
/// is the owner of Palisade's tables.
pub async fn check_function_settings(
    client: &Client,
    schema: u32,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let proof = FUNCTION_SETTINGS.replace("$1", &schema.to_string());
    for row in client
        .query(FUNCTION_SETTINGS, &[&schema])
        .await
        .map_err(pg)?
    {
        let (function, config, pinned): (String, String, String) =
            (row.get(0), row.get(1), row.get(2));
        let (owner, tables_owner): (String, String) = (row.get(3), row.get(4));
        if config != pinned {
            let now = if config.is_empty() { "none" } else { &config };
            problems.push(problem(
                Severity::Critical,
                "function_search_path",
                format!(
                    "function {function} sets {now}, not {pinned}: names in its body can \
                     resolve to another schema's operators, functions or tables (a shadow \
                     `<` turns a fence check around); ALTER FUNCTION {function} SET {}",
                    pinned.replacen('=', " = ", 1)
                ),
                &proof,
            ));
        }
        if owner != tables_owner {
            problems.push(problem(
                Severity::Critical,
                "function_owner",
                format!(
                    "function {function} belongs to {owner}, not to {tables_owner} (the owner \
                     of Palisade's tables): {owner} can change its body or its settings; \
                     ALTER FUNCTION {function} OWNER TO {tables_owner}"
                ),
                &proof,
            ));
        }
    }
    Ok(())
}

/// Who besides its owner may create objects in the schema of oid `$1`, and what is there
/// that is named as pg_catalog's and is not Palisade's.
const GUARD_SCHEMA: &str = "SELECT n.nspname::text, \
    ARRAY(SELECT r.rolname::text FROM pg_roles r WHERE r.oid <> n.nspowner \
          AND NOT r.rolsuper AND r.rolname NOT LIKE 'pg\\_%' \
          AND NOT pg_has_role(r.oid, n.nspowner, 'MEMBER') \
          AND has_schema_privilege(r.oid, n.oid, 'CREATE') ORDER BY 1), \
    ARRAY(SELECT 'operator ' || o.oprname FROM pg_operator o \
          WHERE o.oprnamespace = n.oid AND EXISTS (SELECT 1 FROM pg_operator c \
            WHERE c.oprnamespace = 'pg_catalog'::regnamespace AND c.oprname = o.oprname) \
          UNION SELECT 'function ' || p.proname FROM pg_proc p \
          WHERE p.pronamespace = n.oid AND p.proname NOT LIKE 'palisade\\_%' \
            AND EXISTS (SELECT 1 FROM pg_proc c WHERE c.pronamespace = 'pg_catalog'::regnamespace \
                        AND c.proname = p.proname) ORDER BY 1) \
    FROM pg_namespace n WHERE n.oid = $1::oid";

/// Palisade's schema is its owner's alone: a role that may create objects there can add an
/// overload that PostgreSQL prefers over its own inside Palisade's functions
/// (`to_jsonb(a_table)` beats `pg_catalog.to_jsonb(anyelement)` whatever the search_path), and
/// one already there is reported.
pub async fn check_guard_schema(
    client: &Client,
    schema: u32,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let proof = GUARD_SCHEMA.replace("$1", &schema.to_string());
    let Some(row) = client
        .query_opt(GUARD_SCHEMA, &[&schema])
        .await
        .map_err(pg)?
    else {
        return Ok(());
    };
    let (name, creators, shadows): (String, Vec<String>, Vec<String>) =
        (row.get(0), row.get(1), row.get(2));
    if !creators.is_empty() {
        let listed = creators[..creators.len().min(10)].join(", ");
        problems.push(problem(
            Severity::Critical,
            "guard_schema_writable",
            format!(
                "{} role(s) besides its owner may create objects in schema {name}, where \
                 Palisade's functions live (e.g. {listed}): an overload there with exact \
                 argument types, such as to_jsonb(your_table), is preferred over PostgreSQL's \
                 own inside the guard; REVOKE CREATE ON SCHEMA {name} FROM PUBLIC (and those \
                 roles) — PostgreSQL 14 and earlier grant it to PUBLIC on public",
                creators.len()
            ),
            &proof,
        ));
    }
    if !shadows.is_empty() {
        problems.push(problem(
            Severity::Critical,
            "shadowed_name",
            format!(
                "schema {name}, where Palisade's functions live, defines {} named as \
                 PostgreSQL's own: inside the guard they can be preferred over pg_catalog's; \
                 drop them",
                shadows.join(", ")
            ),
            &proof,
        ));
    }
    Ok(())
}

/// Every `search_path` set for a role or a database (or both) that applies in this database.
const SEARCH_PATHS: &str = "SELECT coalesce(r.rolname::text, 'every role'), \
    coalesce(d.datname::text, 'every database'), substr(c, length('search_path=') + 1) \
    FROM pg_db_role_setting s LEFT JOIN pg_roles r ON r.oid = s.setrole \
    LEFT JOIN pg_database d ON d.oid = s.setdatabase, unnest(s.setconfig) AS c \
    WHERE c LIKE 'search\\_path=%' \
      AND (s.setdatabase = 0 OR d.datname = current_database()) ORDER BY 1, 2";

/// Operators and functions of schema `$1` named as one of pg_catalog's or Palisade's.
const SHADOWS: &str = "SELECT 'operator ' || o.oprname FROM pg_operator o \
    WHERE o.oprnamespace = to_regnamespace($1) AND EXISTS (SELECT 1 FROM pg_operator c \
      WHERE c.oprnamespace = 'pg_catalog'::regnamespace AND c.oprname = o.oprname) \
    UNION SELECT 'function ' || p.proname FROM pg_proc p \
    WHERE p.pronamespace = to_regnamespace($1) AND (p.proname LIKE 'palisade\\_%' \
      OR EXISTS (SELECT 1 FROM pg_proc c WHERE c.pronamespace = 'pg_catalog'::regnamespace \
                 AND c.proname = p.proname)) ORDER BY 1";

/// Roles other than its owner that may create objects in schema `$1`.
const SCHEMA_CREATORS: &str = "SELECT r.rolname::text FROM pg_roles r, pg_namespace n \
    WHERE n.nspname = $1 AND r.oid <> n.nspowner AND NOT r.rolsuper \
      AND r.rolname NOT LIKE 'pg\\_%' AND has_schema_privilege(r.oid, n.oid, 'CREATE') \
    ORDER BY 1";

/// The schemas a `search_path` setting lists ahead of pg_catalog (when it lists pg_catalog
/// at all: otherwise PostgreSQL searches pg_catalog first), unquoted; `$user` stays as it is
/// (the schema named after the role that logs in: see [`user_schemas`]).
pub fn ahead_of_catalog(setting: &str) -> Vec<String> {
    let schemas: Vec<String> = setting
        .split(',')
        .map(|schema| schema.trim().trim_matches('"').replace("\"\"", "\""))
        .filter(|schema| !schema.is_empty())
        .collect();
    match schemas.iter().position(|schema| schema == "pg_catalog") {
        Some(at) => schemas[..at]
            .iter()
            .filter(|schema| *schema != "pg_temp")
            .cloned()
            .collect(),
        None => Vec::new(),
    }
}

/// Every schema named after a role, or only `role`'s (`None`: a setting for every role).
const USER_SCHEMAS: &str = "SELECT n.nspname::text FROM pg_namespace n JOIN pg_roles r \
    ON r.rolname = n.nspname WHERE $1::text IS NULL OR r.rolname = $1 ORDER BY 1";

/// The schemas `$user` stands for in a setting of `role` (`every role`: every schema named
/// after a role, since each such role searches its own).
async fn user_schemas(client: &Client, role: &str) -> Result<Vec<String>, String> {
    let role = (role != "every role").then_some(role);
    Ok(client
        .query(USER_SCHEMAS, &[&role])
        .await
        .map_err(pg)?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// Role and database `search_path` settings that put a schema with shadows (or open to
/// others' CREATE) ahead of pg_catalog, `$user` included.
pub async fn check_role_search_paths(
    client: &Client,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    for row in client.query(SEARCH_PATHS, &[]).await.map_err(pg)? {
        let (role, database, setting): (String, String, String) =
            (row.get(0), row.get(1), row.get(2));
        let mut schemas = Vec::new();
        for schema in ahead_of_catalog(&setting) {
            match schema.as_str() {
                "$user" => schemas.extend(user_schemas(client, &role).await?),
                _ => schemas.push(schema),
            }
        }
        for schema in schemas {
            let shadows: Vec<String> = client
                .query(SHADOWS, &[&schema])
                .await
                .map_err(pg)?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let creators: Vec<String> = client
                .query(SCHEMA_CREATORS, &[&schema])
                .await
                .map_err(pg)?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let whose = format!("the search_path of {role} in {database} ({setting})");
            if !shadows.is_empty() {
                problems.push(problem(
                    Severity::Critical,
                    "shadowed_name",
                    format!(
                        "{whose} puts schema {schema} ahead of pg_catalog, and {schema} \
                         defines {}: plain SQL of that role (the fenced UPDATE … WHERE \
                         last_fence < $epoch) resolves to them; drop them or the setting",
                        shadows.join(", ")
                    ),
                    &SHADOWS.replace("$1", &format!("'{}'", schema.replace('\'', "''"))),
                ));
            } else if !creators.is_empty() {
                problems.push(problem(
                    Severity::Warning,
                    "search_path_writable_schema",
                    format!(
                        "{whose} puts schema {schema} ahead of pg_catalog, and {} may create \
                         objects in it: a shadow operator or function there would change that \
                         role's plain SQL",
                        creators.join(", ")
                    ),
                    &SCHEMA_CREATORS.replace("$1", &format!("'{}'", schema.replace('\'', "''"))),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ahead_of_catalog;

    #[test]
    fn the_schemas_ahead_of_pg_catalog_are_the_ones_that_can_shadow_it() {
        assert_eq!(
            ahead_of_catalog("shadowops, pg_catalog, public"),
            vec!["shadowops"]
        );
        assert_eq!(
            ahead_of_catalog("\"$user\", \"Odd\"\"Name\", pg_catalog"),
            vec!["$user", "Odd\"Name"]
        );
        // Not listed: PostgreSQL searches pg_catalog first.
        assert!(ahead_of_catalog("shadowops, public").is_empty());
        assert!(ahead_of_catalog("pg_catalog, shadowops").is_empty());
    }
}
