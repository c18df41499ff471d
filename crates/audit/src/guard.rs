//! What PostgreSQL's own catalogs say about a guarded table (issue 26): who may write it
//! without the fence, whether every one of the guard's triggers is the one Palisade installs
//! and fires always, what else could rewrite its rows, and whether the database keeps a
//! commit.
//!
//! Every check is a query the audit sends itself over `pg_catalog`, never a function in the
//! audited database (whoever owns that could replace it with one that answers "none"), and
//! every problem carries that query so an operator can run it again.
//!
//! Trusted, by design (docs/enforcement.md): superusers, the owners of the table and of
//! Palisade's functions and tables, the role the audit connects as, and the roles the policy
//! names in `writers` (the fence role). Everyone else who can write is a finding.

use std::fmt::Write as _;

use palisade_fence_postgres::migrations::MIGRATIONS;
use tokio_postgres::Client;

use crate::{pg, problem, Problem, Severity};

/// How a guarded table is bound, as `palisade_guarded_tables` records it.
pub struct Binding {
    /// The one lock guarding the whole table.
    pub table_lock: Option<String>,
    /// The text column naming each row's lock.
    pub lock_column: Option<String>,
    /// The key column (tombstones are keyed by it).
    pub key_column: String,
    /// Whether INSERT and DELETE are allowed only on the fenced path.
    pub guard_rows: bool,
    /// Whether every fenced write must present its token (migration 11).
    pub require_token: bool,
    /// The schema Palisade's functions and tables live in.
    pub schema: u32,
}

/// Most problems one check reports (the rest are counted, not listed).
const MAX_LISTED: usize = 20;

/// One trigger the guard installs: its name, function, `tgtype` bits and arguments.
struct Expected {
    name: &'static str,
    function: &'static str,
    tgtype: i32,
    args: Vec<String>,
}

// pg_trigger.tgtype bits (PostgreSQL's trigger.h).
const ROW: i32 = 1;
const BEFORE: i32 = 2;
const INSERT: i32 = 4;
const DELETE: i32 = 8;
const UPDATE: i32 = 16;
const TRUNCATE: i32 = 32;

fn expected_triggers(binding: &Binding) -> Vec<Expected> {
    let key = vec![binding.key_column.clone()];
    let mut expected = vec![
        Expected {
            name: "palisade_guard_update",
            function: "palisade_guard_fence",
            tgtype: ROW | BEFORE | UPDATE,
            args: binding.lock_column.iter().cloned().collect(),
        },
        Expected {
            name: "palisade_guard_tombstone",
            function: "palisade_guard_tombstone",
            tgtype: ROW | BEFORE | DELETE,
            args: key.clone(),
        },
        Expected {
            name: "palisade_guard_insert",
            function: "palisade_guard_insert",
            tgtype: ROW | BEFORE | INSERT,
            args: key,
        },
        Expected {
            name: "palisade_guard_truncate",
            function: "palisade_guard_truncate",
            tgtype: BEFORE | TRUNCATE,
            args: Vec::new(),
        },
    ];
    let lock = match (&binding.table_lock, &binding.lock_column) {
        (Some(lock), _) => ["lock", lock.as_str()],
        (None, column) => ["column", column.as_deref().unwrap_or_default()],
    };
    expected.push(Expected {
        name: "palisade_guard_lock_floor",
        function: "palisade_guard_lock_floor",
        tgtype: ROW | BEFORE | INSERT | UPDATE,
        args: ["last_fence", lock[0], lock[1]].map(str::to_owned).to_vec(),
    });
    if binding.require_token {
        expected.push(Expected {
            name: "palisade_guard_token",
            function: "palisade_guard_token",
            tgtype: ROW | BEFORE | INSERT | UPDATE,
            args: ["last_fence", lock[0], lock[1]].map(str::to_owned).to_vec(),
        });
    }
    if binding.guard_rows {
        expected.push(Expected {
            name: "palisade_guard_rows",
            function: "palisade_guard_rows",
            tgtype: ROW | BEFORE | INSERT | DELETE,
            args: Vec::new(),
        });
    }
    expected
}

/// The body Palisade's migrations give `function` (its last definition), as PostgreSQL
/// stores it in `pg_proc.prosrc`: the text between the `$$` quotes.
pub fn expected_body(function: &str) -> Option<String> {
    expected_body_of(function, None)
}

/// [`expected_body`] of the form of `function` that takes `arguments` arguments (`None`: any).
pub fn expected_body_of(function: &str, arguments: Option<usize>) -> Option<String> {
    let header = format!("CREATE OR REPLACE FUNCTION {function}(");
    let mut body = None;
    for (_, _, sql) in MIGRATIONS {
        let mut rest = *sql;
        while let Some(at) = rest.find(&header) {
            rest = &rest[at + header.len()..];
            let signature = &rest[..rest.find(')')?];
            // pg_proc.pronargs counts no OUT parameters.
            let count = signature
                .split(',')
                .filter(|a| !a.trim().is_empty() && !a.trim_start().starts_with("OUT "))
                .count();
            let start = rest.find("$$")? + 2;
            let end = start + rest[start..].find("$$")?;
            if arguments.is_none_or(|wanted| wanted == count) {
                body = Some(rest[start..end].replace("\r\n", "\n"));
            }
            rest = &rest[end + 2..];
        }
    }
    body
}

/// Every problem found with `table` (already known to be registered as guarded).
pub async fn check(
    client: &Client,
    table: &str,
    binding: &Binding,
    writers: &[String],
) -> Result<Vec<Problem>, String> {
    let mut problems = Vec::new();
    check_triggers(client, table, binding, &mut problems).await?;
    check_functions(client, binding, &mut problems).await?;
    crate::search_path::check_function_settings(client, binding.schema, &mut problems).await?;
    crate::search_path::check_role_search_paths(client, &mut problems).await?;
    crate::search_path::check_guard_schema(client, binding.schema, &mut problems).await?;
    check_rewrites(client, table, &mut problems).await?;
    check_writers(client, table, binding, writers, &mut problems).await?;
    check_durability(client, &mut problems).await?;
    check_floor_source(client, &mut problems).await?;
    check_unguarded(client, &mut problems).await?;
    if !binding.require_token {
        problems.push(bare_epochs(table));
    }
    Ok(problems)
}

/// A table that takes a bare epoch: any writer may set `last_fence` to another lock's epoch
/// or to any number (migration 11 binds it to a presented token).
fn bare_epochs(table: &str) -> Problem {
    problem(
        Severity::Warning,
        "bare_epochs",
        format!(
            "{table} accepts a bare epoch: a SQL writer may write another lock's epoch, or any \
             number, as last_fence (the Rust adapter checks tokens; the database does not). \
             Make it require tokens: palisade resource guard --table {table} … (again), or \
             SELECT palisade_require_token('{table}', true), and write with \
             palisade_present_token(token)"
        ),
        "SELECT require_token FROM palisade_guarded_tables WHERE tbl = 'TABLE'::regclass",
    )
}

const TRIGGERS: &str = "SELECT t.tgname::text, t.tgenabled::text, p.proname::text, \
    p.pronamespace::oid = $2::oid, t.tgtype::int, t.tgqual IS NOT NULL, t.tgattr::text, \
    encode(t.tgargs, 'escape') FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid \
    WHERE t.tgrelid = $1::text::regclass AND NOT t.tgisinternal ORDER BY t.tgname";

/// Each trigger the guard installs is there, fires always, and is exactly Palisade's: its
/// function, events, timing, arguments, no `WHEN` and no column list. Any other `BEFORE` row
/// trigger on INSERT or UPDATE could rewrite a row after the guard checked it.
async fn check_triggers(
    client: &Client,
    table: &str,
    binding: &Binding,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let proof = TRIGGERS
        .replace("$1", &format!("'{}'", table.replace('\'', "''")))
        .replace("$2", &binding.schema.to_string());
    let rows = client
        .query(TRIGGERS, &[&table, &binding.schema])
        .await
        .map_err(pg)?;
    let expected = expected_triggers(binding);
    for want in &expected {
        let Some(row) = rows.iter().find(|r| r.get::<_, String>(0) == want.name) else {
            problems.push(problem(
                Severity::Critical,
                "guard_trigger_missing",
                format!(
                    "trigger {} on {table} is missing: re-run install_guard (`palisade \
                     resource guard`)",
                    want.name
                ),
                &proof,
            ));
            continue;
        };
        if let Some(how) = not_always_enabled(&row.get::<_, String>(1)) {
            problems.push(problem(
                Severity::Critical,
                "guard_trigger_disabled",
                format!(
                    "trigger {} on {table} is {how}: ALTER TABLE {table} ENABLE ALWAYS TRIGGER {}",
                    want.name, want.name
                ),
                &proof,
            ));
        }
        let differs = trigger_differences(row, want);
        if !differs.is_empty() {
            problems.push(problem(
                Severity::Critical,
                "guard_trigger_altered",
                format!(
                    "trigger {} on {table} is not the one Palisade installs: it {}; re-run \
                     install_guard (`palisade resource guard`)",
                    want.name,
                    differs.join("; ")
                ),
                &proof,
            ));
        }
    }
    foreign_triggers(&rows, &expected, table, &proof, problems);
    Ok(())
}

/// Any other enabled `BEFORE` row trigger on INSERT or UPDATE of `table`: it could rewrite a
/// row (`last_fence` included) after the guard checked it.
fn foreign_triggers(
    rows: &[tokio_postgres::Row],
    expected: &[Expected],
    table: &str,
    proof: &str,
    problems: &mut Vec<Problem>,
) {
    for row in rows {
        let name: String = row.get(0);
        let (enabled, tgtype): (String, i32) = (row.get(1), row.get(4));
        let rewrites = tgtype & ROW != 0 && tgtype & BEFORE != 0 && tgtype & (INSERT | UPDATE) != 0;
        if rewrites && enabled != "D" && !expected.iter().any(|e| e.name == name) {
            problems.push(problem(
                Severity::Critical,
                "foreign_trigger",
                format!(
                    "trigger {name} on {table} runs BEFORE each INSERT or UPDATE and can rewrite \
                     a row (last_fence included) after Palisade's guard checked it: drop it, or \
                     make it an AFTER trigger"
                ),
                proof,
            ));
        }
    }
}

/// How a trigger whose `tgenabled` is `enabled` fails to fire always, or `None` (`A`).
fn not_always_enabled(enabled: &str) -> Option<&'static str> {
    match enabled {
        "A" => None,
        "D" => Some("disabled"),
        "R" => Some("enabled for replica sessions only"),
        _ => Some(
            "enabled for origin sessions only (SET session_replication_role = replica skips it)",
        ),
    }
}

/// How the trigger of `row` (a row of [`TRIGGERS`]) differs from Palisade's `want`: its
/// function, events and timing, `WHEN` condition, column list and arguments.
fn trigger_differences(row: &tokio_postgres::Row, want: &Expected) -> Vec<String> {
    let (function, in_schema): (String, bool) = (row.get(2), row.get(3));
    let (tgtype, has_when, columns): (i32, bool, String) = (row.get(4), row.get(5), row.get(6));
    let args: Vec<String> = row
        .get::<_, String>(7)
        .split("\\000")
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect();
    let mut differs = Vec::new();
    if function != want.function || !in_schema {
        differs.push(format!("runs {function}, not Palisade's {}", want.function));
    }
    if tgtype != want.tgtype {
        differs.push(format!("fires on tgtype {tgtype}, not {}", want.tgtype));
    }
    if has_when {
        differs.push("has a WHEN condition (it can exempt a role or a row)".to_owned());
    }
    if !columns.trim().is_empty() {
        differs.push(format!("fires only on UPDATE OF columns {columns}"));
    }
    if args != want.args {
        differs.push(format!("has arguments {args:?}, not {:?}", want.args));
    }
    differs
}

const FUNCTION: &str = "SELECT p.prosrc, p.prosecdef \
    FROM pg_proc p WHERE p.proname = $1 AND p.pronamespace = $2::oid AND p.pronargs = $3";

/// The functions the guard of `binding` runs: (name, runs as its owner, arguments).
fn guard_functions(binding: &Binding) -> Vec<(&'static str, bool, i16)> {
    let mut functions = vec![
        ("palisade_guard_fence", false, 0),
        ("palisade_guard_tombstone", true, 0),
        ("palisade_guard_insert", true, 0),
        ("palisade_guard_truncate", false, 0),
        // A restored database must not keep the floors of its past (migration 8).
        ("palisade_guard_lock_floor", false, 0),
        ("palisade_check_lock_floor", true, 2),
        ("palisade_learn_floor", true, 2),
        ("palisade_learn_floor", true, 3),
        ("palisade_known_floor", true, 1),
        ("palisade_incarnation", false, 0),
    ];
    if binding.guard_rows {
        functions.push(("palisade_guard_rows", false, 0));
    }
    if binding.require_token {
        // The lock and epoch of every write come from the token (migration 11).
        functions.push(("palisade_guard_token", true, 0));
        functions.push(("palisade_present_token", true, 1));
        functions.push(("palisade_token_claims", false, 1));
    }
    functions
}

/// Each guard function's body is the one Palisade's migrations define (a body re-created with
/// an exemption passes every trigger check), and the tombstone functions still run as their
/// owner with a pinned `search_path`.
async fn check_functions(
    client: &Client,
    binding: &Binding,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let functions = guard_functions(binding);
    for (function, definer, arguments) in functions {
        let proof = FUNCTION
            .replace("$1", &format!("'{function}'"))
            .replace("$2", &binding.schema.to_string())
            .replace("$3", &arguments.to_string());
        let row = client
            .query_opt(FUNCTION, &[&function, &binding.schema, &arguments])
            .await
            .map_err(pg)?;
        let Some(row) = row else {
            problems.push(problem(
                Severity::Critical,
                "guard_function_missing",
                format!("function {function}() is missing: re-apply Palisade's migrations"),
                &proof,
            ));
            continue;
        };
        // Its search_path and owner: `search_path::check_function_settings`.
        let (body, secdef): (String, bool) = (row.get(0), row.get(1));
        let expected = expected_body_of(function, Some(usize::from(arguments.unsigned_abs())));
        let mut differs = Vec::new();
        if expected.as_deref() != Some(body.replace("\r\n", "\n").as_str()) {
            differs.push("its body differs from Palisade's");
        }
        if definer && !secdef {
            differs.push("it no longer runs as its owner (SECURITY DEFINER)");
        }
        if !differs.is_empty() {
            problems.push(problem(
                Severity::Critical,
                "guard_function_altered",
                format!(
                    "function {function}() is not the one Palisade installs: {}; re-create it \
                     from crates/fence-postgres/sql/",
                    differs.join(", ")
                ),
                &proof,
            ));
        }
    }
    Ok(())
}

const RULES: &str = "SELECT rulename::text FROM pg_rewrite \
    WHERE ev_class = $1::text::regclass AND rulename <> '_RETURN' ORDER BY rulename";
const CHILDREN: &str = "SELECT inhrelid::regclass::text FROM pg_inherits \
    WHERE inhparent = $1::text::regclass ORDER BY 1";
const VIEWS: &str = "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d \
    JOIN pg_rewrite w ON w.oid = d.objid JOIN pg_class v ON v.oid = w.ev_class \
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = $1::text::regclass \
    AND v.oid <> $1::text::regclass AND v.relkind = 'v' ORDER BY 1";

/// Rules on the table (a `DO INSTEAD` can turn a write into anything) and child tables (a
/// write to a child never fires the parent's triggers, yet its rows read as the parent's).
async fn check_rewrites(
    client: &Client,
    table: &str,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let quoted = format!("'{}'", table.replace('\'', "''"));
    for row in client.query(RULES, &[&table]).await.map_err(pg)? {
        let rule: String = row.get(0);
        problems.push(problem(
            Severity::Critical,
            "rule_on_table",
            format!("rule {rule} on {table} can rewrite writes before the guard sees them"),
            &RULES.replace("$1", &quoted),
        ));
    }
    for row in client.query(CHILDREN, &[&table]).await.map_err(pg)? {
        let child: String = row.get(0);
        problems.push(problem(
            Severity::Critical,
            "unguarded_child_table",
            format!(
                "{child} inherits from {table}: its rows read as {table}'s, but writes to it \
                 never fire {table}'s guard"
            ),
            &CHILDREN.replace("$1", &quoted),
        ));
    }
    Ok(())
}

const OWNERS: &str = "SELECT rolname::text FROM pg_roles WHERE oid IN ( \
    SELECT relowner FROM pg_class WHERE oid = $1::text::regclass \
    UNION SELECT relowner FROM pg_class WHERE relnamespace = $2::oid \
      AND relname IN ('palisade_guarded_tables', 'palisade_row_fences') \
    UNION SELECT proowner FROM pg_proc WHERE pronamespace = $2::oid \
      AND proname LIKE 'palisade\\_guard\\_%') ORDER BY 1";

/// Which of `relation`'s write privileges each role outside `trusted` holds: column grants
/// count (`has_any_column_privilege`), memberships are resolved as PostgreSQL resolves them,
/// and `public` stands for every role, present and future.
const WRITERS: &str = "SELECT r.name, array_remove(ARRAY[ \
    CASE WHEN has_any_column_privilege(r.name, $1::text::regclass, 'INSERT') THEN 'INSERT' END, \
    CASE WHEN has_any_column_privilege(r.name, $1::text::regclass, 'UPDATE') THEN 'UPDATE' END, \
    CASE WHEN has_table_privilege(r.name, $1::text::regclass, 'DELETE') THEN 'DELETE' END, \
    CASE WHEN has_table_privilege(r.name, $1::text::regclass, 'TRUNCATE') THEN 'TRUNCATE' END, \
    CASE WHEN has_table_privilege(r.name, $1::text::regclass, 'TRIGGER') THEN 'TRIGGER' END], NULL) \
    FROM (SELECT rolname::text AS name FROM pg_roles WHERE NOT rolsuper \
          AND rolname NOT LIKE 'pg\\_%' UNION ALL SELECT 'public') r \
    WHERE r.name <> ALL($2::text[]) ORDER BY r.name";

/// Roles outside the trusted ones that are members of one (they can `SET ROLE` to it).
const MEMBERS: &str = "SELECT r.rolname::text, t.name FROM pg_roles r \
    CROSS JOIN unnest($1::text[]) AS t(name) \
    WHERE NOT r.rolsuper AND r.rolname NOT LIKE 'pg\\_%' AND r.rolname <> ALL($1::text[]) \
    AND pg_has_role(r.oid, (SELECT oid FROM pg_roles WHERE rolname = t.name), 'MEMBER') \
    ORDER BY 1, 2";

/// Who may write the table, its views and Palisade's tables without the fence.
async fn check_writers(
    client: &Client,
    table: &str,
    binding: &Binding,
    writers: &[String],
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let (owners, trusted) = trusted_roles(client, table, binding, writers).await?;
    let views: Vec<String> = client
        .query(VIEWS, &[&table])
        .await
        .map_err(pg)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut relations = vec![(table.to_owned(), trusted.clone(), "directly")];
    for view in &views {
        relations.push((view.clone(), trusted.clone(), "through a view"));
    }
    // Palisade's own tables: nobody but their owner writes them, the fence role included.
    let mut helpers = vec!["palisade_row_fences", "palisade_guarded_tables"];
    if binding.require_token {
        // A role that may write it may back any fence with a token nobody presented.
        helpers.push("palisade_presented_tokens");
    }
    for helper in helpers {
        relations.push((helper.to_owned(), owners.clone(), "(Palisade's table)"));
    }
    if binding.require_token {
        check_presenters(client, &trusted, problems).await?;
    }
    let mut listed = 0;
    for (relation, allowed, how) in relations {
        let rows = client
            .query(WRITERS, &[&relation, &allowed])
            .await
            .map_err(pg)?;
        for row in rows {
            let (role, privileges): (String, Vec<String>) = (row.get(0), row.get(1));
            if privileges.is_empty() {
                continue;
            }
            listed += 1;
            if listed <= MAX_LISTED {
                let writer = (role.as_str(), privileges.as_slice());
                problems.push(unfenced_writer(table, &relation, &allowed, how, writer));
            }
        }
    }
    if listed > MAX_LISTED {
        problems.push(problem(
            Severity::Critical,
            "unfenced_writer",
            format!(
                "{} more role/relation pairs may write without the fence",
                listed - MAX_LISTED
            ),
            &WRITERS.replace("$1", &sql_text(table)),
        ));
    }
    check_members(client, table, &trusted, problems).await
}

/// A quoted SQL string literal.
fn sql_text(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// An SQL array of role names, for a proof.
fn sql_roles(roles: &[String]) -> String {
    let items: Vec<String> = roles.iter().map(|r| sql_text(r)).collect();
    format!("ARRAY[{}]", items.join(", "))
}

/// The table's owners, and every role trusted to write it: the owners, the role the audit
/// connects as, and the boundary's declared writers.
async fn trusted_roles(
    client: &Client,
    table: &str,
    binding: &Binding,
    writers: &[String],
) -> Result<(Vec<String>, Vec<String>), String> {
    let owners: Vec<String> = client
        .query(OWNERS, &[&table, &binding.schema])
        .await
        .map_err(pg)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let me: String = client
        .query_one("SELECT current_user::text", &[])
        .await
        .map_err(pg)?
        .get(0);
    let mut trusted: Vec<String> = owners.clone();
    trusted.push(me);
    trusted.extend(writers.iter().cloned());
    trusted.sort();
    trusted.dedup();
    Ok((owners, trusted))
}

/// Roles outside the trusted ones that may run `palisade_present_token` (PUBLIC included).
const PRESENTERS: &str = "SELECT r.name FROM (SELECT rolname::text AS name FROM pg_roles \
    WHERE NOT rolsuper AND rolname NOT LIKE 'pg\\_%' UNION ALL SELECT 'public') r \
    WHERE r.name <> ALL($1::text[]) AND to_regprocedure('palisade_present_token(text)') IS NOT NULL \
    AND has_function_privilege(r.name, 'palisade_present_token(text)', 'EXECUTE') ORDER BY 1";

/// A role that may present tokens records them for the audit and the witnesses: one that does
/// not write fenced rows could fill the record with forgeries (false alarms, proofs crowded
/// out), so only the trusted roles may.
async fn check_presenters(
    client: &Client,
    trusted: &[String],
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let rows = client.query(PRESENTERS, &[&trusted]).await.map_err(pg)?;
    for row in rows.iter().take(MAX_LISTED) {
        let role: String = row.get(0);
        problems.push(problem(
            Severity::Critical,
            "unfenced_writer",
            format!(
                "role {role} may run palisade_present_token, recording tokens it did not get \
                 from the coordinator: REVOKE EXECUTE ON FUNCTION palisade_present_token(text) \
                 FROM {role}"
            ),
            &PRESENTERS.replace("$1::text[]", &sql_roles(trusted)),
        ));
    }
    Ok(())
}

/// The finding for a role (`writer`: its name and privileges) that may write `relation`
/// around the fence.
fn unfenced_writer(
    table: &str,
    relation: &str,
    allowed: &[String],
    how: &str,
    (role, privileges): (&str, &[String]),
) -> Problem {
    let mut message = format!(
        "role {role} may {} {relation} {how} without the fence",
        privileges.join(", ")
    );
    if relation == table {
        let _ = write!(
            message,
            " (e.g. UPDATE {table} SET last_fence = last_fence + 1, …): revoke it, or \
             name the role in the boundary's writers if it is the fence role"
        );
    }
    let proof = WRITERS
        .replace("$1", &sql_text(relation))
        .replace("$2::text[]", &sql_roles(allowed));
    problem(Severity::Critical, "unfenced_writer", message, &proof)
}

/// Roles that can become a trusted role (SET ROLE) write as it does.
async fn check_members(
    client: &Client,
    table: &str,
    trusted: &[String],
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let trusted_vec = trusted.to_vec();
    for row in client.query(MEMBERS, &[&trusted_vec]).await.map_err(pg)? {
        let (role, of): (String, String) = (row.get(0), row.get(1));
        problems.push(problem(
            Severity::Critical,
            "member_of_trusted_role",
            format!(
                "role {role} is a member of {of} and can SET ROLE {of}: it writes {table} (or \
                 drops its guard) as {of} does"
            ),
            &MEMBERS.replace("$1::text[]", &sql_roles(trusted)),
        ));
    }
    Ok(())
}

const SETTINGS: &str = "SELECT name::text, setting FROM pg_settings \
    WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes') ORDER BY name";
const ROLE_SETTINGS: &str = "SELECT coalesce(setrole::regrole::text, 'every role'), \
    coalesce((SELECT datname::text FROM pg_database WHERE oid = setdatabase), 'every database') \
    FROM pg_db_role_setting \
    WHERE array_to_string(setconfig, ',') ~* 'synchronous_commit=(off|false|no|0)(,|$)'";

/// Whether the database keeps what it acknowledged: `fsync` off loses commits on a crash;
/// `synchronous_commit` off (for the audit's role, or set for a role or database) loses the
/// last ones. Palisade's adapters turn it on for their own connections; other writers of the
/// same database are not protected.
const FLOOR_SOURCE: &str = "SELECT source FROM palisade_floor_settings WHERE singleton";

/// The database learns each lock's floor from the coordinator after it restarted or was
/// restored (migration 8): `off` re-admits superseded owners after a restore.
async fn check_floor_source(client: &Client, problems: &mut Vec<Problem>) -> Result<(), String> {
    let source: Option<String> = client
        .query_opt(FLOOR_SOURCE, &[])
        .await
        .map_err(pg)?
        .map(|row| row.get(0));
    if source.as_deref() != Some("coordinator") {
        problems.push(problem(
            Severity::Critical,
            "lock_floors_off",
            format!(
                "palisade_floor_settings.source is {}: a database put back from a snapshot or \
                 restored re-admits owners the coordinator superseded; UPDATE \
                 palisade_floor_settings SET source = 'coordinator'",
                source.as_deref().unwrap_or("missing")
            ),
            FLOOR_SOURCE,
        ));
    }
    Ok(())
}

async fn check_durability(client: &Client, problems: &mut Vec<Problem>) -> Result<(), String> {
    for row in client.query(SETTINGS, &[]).await.map_err(pg)? {
        let (name, setting): (String, String) = (row.get(0), row.get(1));
        let (severity, why) = match (name.as_str(), setting.as_str()) {
            ("fsync", "off") => (
                Severity::Critical,
                "a crash loses committed fences: an obsolete owner's write can be accepted again",
            ),
            ("full_page_writes", "off") => (
                Severity::Warning,
                "a crash mid-write can leave torn pages that recovery cannot repair",
            ),
            ("synchronous_commit", "off") => (
                Severity::Warning,
                "a crash loses the last acknowledged commits of writers other than Palisade's \
                 adapters (which turn it on for their own connections)",
            ),
            _ => continue,
        };
        problems.push(problem(
            severity,
            "durability_off",
            format!("{name} = {setting}: {why}"),
            SETTINGS,
        ));
    }
    for row in client.query(ROLE_SETTINGS, &[]).await.map_err(pg)? {
        let (role, database): (String, String) = (row.get(0), row.get(1));
        problems.push(problem(
            Severity::Warning,
            "durability_off",
            format!(
                "synchronous_commit is off for {role} in {database} (ALTER ROLE/DATABASE … SET): \
                 Palisade's adapters turn it on for their own connections; other writers lose \
                 their last commits in a crash"
            ),
            ROLE_SETTINGS,
        ));
    }
    Ok(())
}

const UNGUARDED: &str = "SELECT c.oid::regclass::text FROM pg_attribute a \
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
    WHERE a.attname = 'last_fence' AND NOT a.attisdropped AND c.relkind IN ('r', 'p') \
    AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
    AND c.oid NOT IN (SELECT tbl FROM palisade_guarded_tables) ORDER BY 1 LIMIT 21";

/// Tables with a `last_fence` column that no guard protects (a copy of a guarded table's rows
/// is one). The audit cannot know which tables an application reads: this is a warning, and
/// a shadow copy without that column is not seen at all (docs/policy.md).
async fn check_unguarded(client: &Client, problems: &mut Vec<Problem>) -> Result<(), String> {
    let rows = client.query(UNGUARDED, &[]).await.map_err(pg)?;
    for row in rows.iter().take(MAX_LISTED) {
        let table: String = row.get(0);
        problems.push(problem(
            Severity::Warning,
            "unguarded_fenced_table",
            format!(
                "{table} has a last_fence column but no Palisade guard: if it holds fenced \
                 rows (a copy of a guarded table's), plain SQL writes it without the fence"
            ),
            UNGUARDED,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guard_function_has_a_body_in_the_migrations() {
        for function in [
            "palisade_guard_fence",
            "palisade_guard_tombstone",
            "palisade_guard_insert",
            "palisade_guard_truncate",
            "palisade_guard_rows",
        ] {
            let body = expected_body(function).unwrap_or_else(|| panic!("{function}"));
            assert!(body.contains("BEGIN") && body.contains("END"), "{body}");
        }
        // The last definition wins: migration 6 gave the fence function its lock check.
        assert!(expected_body("palisade_guard_fence")
            .unwrap()
            .contains("P5005"));
        assert!(expected_body("no_such_function").is_none());
    }
}
