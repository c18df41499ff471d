//! Audit mutants (issue 26, P5): each weakness that lets a role write a guarded table without
//! the fence is planted in a real PostgreSQL, and the audit must report it as critical (so
//! `palisade audit` exits non-zero), naming it. A clean setup — the three roles
//! docs/enforcement.md describes — must have no critical finding, or the audit would cry wolf.
//!
//! The test runs in its own database, so replacing a guard function cannot touch the tables
//! other tests guard at the same time.

use std::sync::Arc;

use palisade_audit::observe::observe;
use palisade_audit::policy::Boundary;
use palisade_audit::{BoundaryReport, Severity};
use palisade_core::{LockName, TokenVerifier};
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
        "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a throwaway \
         PostgreSQL on loopback and sets it",
    )
}

/// The test's database, roles and an adapter connected to it (migrations applied).
struct Setup {
    admin: tokio_postgres::Client,
    db: tokio_postgres::Client,
    fence: PostgresFence,
    url: String,
    name: String,
    app: String,
    writer: String,
    owner: String,
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

async fn setup() -> Setup {
    let base = postgres_url();
    let name = format!("audit_mutants_{}", std::process::id());
    let (app, writer, owner) = (
        format!("{name}_app"),
        format!("{name}_fence"),
        format!("{name}_owner"),
    );
    let admin = connect(&base).await;
    // One statement per call: DROP and CREATE DATABASE refuse a transaction block.
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
        format!("DROP ROLE IF EXISTS {app}"),
        format!("DROP ROLE IF EXISTS {writer}"),
        format!("DROP ROLE IF EXISTS {owner}"),
        format!("CREATE ROLE {app} LOGIN"),
        format!("CREATE ROLE {writer} LOGIN"),
        format!("CREATE ROLE {owner}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let url = format!("{prefix}/{name}");
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([])));
    let fence = PostgresFence::connect(&url, 1, FenceMode::Strict, verifier)
        .await
        .unwrap()
        .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()));
    let db = connect(&url).await;
    Setup {
        admin,
        db,
        fence,
        url,
        name,
        app,
        writer,
        owner,
    }
}

impl Setup {
    /// A guarded table set up as docs/enforcement.md says: owned by the owner role, the fence
    /// role may write it, the application role may only read it.
    async fn table(&self, table: &str) {
        self.db
            .batch_execute(&format!(
                "CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL,
                                       last_fence bigint NOT NULL DEFAULT 0);
                 INSERT INTO {table} VALUES (1, 'a', 7);"
            ))
            .await
            .unwrap();
        let lock = LockName::new(format!("report/{table}")).unwrap();
        let guarded = GuardedTable::new(table, "id", "payload", RowLock::Table(lock)).unwrap();
        guarded.install_guard(&self.fence, false).await.unwrap();
        // As `palisade resource guard` does: every write presents its token (migration 11).
        guarded.require_token(&self.fence, true).await.unwrap();
        self.db
            .batch_execute(&format!(
                "ALTER TABLE {table} OWNER TO {owner};
                 GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {writer};
                 GRANT EXECUTE ON FUNCTION palisade_present_token(text) TO {writer};
                 GRANT SELECT ON {table} TO {app};",
                owner = self.owner,
                writer = self.writer,
                app = self.app,
            ))
            .await
            .unwrap();
    }

    async fn audit(&self, table: &str) -> BoundaryReport {
        let boundary = Boundary::Postgres {
            table: table.to_owned(),
            url: self.url.clone(),
            writers: vec![self.writer.clone()],
        };
        let http = palisade_audit::observe::http_client();
        let report = observe(&http, &boundary, vec!["report/*".into()], &[]).await;
        assert!(report.reachable, "{report:?}");
        report
    }

    async fn drop(self) {
        let Setup {
            admin,
            db,
            fence,
            name,
            app,
            writer,
            owner,
            ..
        } = self;
        drop(db);
        drop(fence);
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {app}"),
            format!("DROP ROLE IF EXISTS {writer}"),
            format!("DROP ROLE IF EXISTS {owner}"),
        ] {
            admin.batch_execute(&statement).await.unwrap();
        }
    }
}

fn critical(report: &BoundaryReport) -> Vec<(&str, &str)> {
    report
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Critical)
        .map(|p| (p.code.as_str(), p.message.as_str()))
        .collect()
}

/// The weaknesses: (name, SQL that plants it in table `{t}`, the finding's code). `{app}`,
/// `{fence}` and `{owner}` are the roles.
const MUTANTS: &[(&str, &str, &str)] = &[
    (
        "table grant",
        "GRANT INSERT, UPDATE, DELETE ON {t} TO {app}",
        "unfenced_writer",
    ),
    (
        "column grant",
        "GRANT UPDATE (payload, last_fence) ON {t} TO {app}",
        "unfenced_writer",
    ),
    ("grant to public", "GRANT UPDATE ON {t} TO PUBLIC", "unfenced_writer"),
    ("trigger privilege", "GRANT TRIGGER ON {t} TO {app}", "unfenced_writer"),
    (
        "tombstone trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER palisade_guard_tombstone",
        "guard_trigger_disabled",
    ),
    (
        "insert trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER palisade_guard_insert",
        "guard_trigger_disabled",
    ),
    (
        "truncate trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER palisade_guard_truncate",
        "guard_trigger_disabled",
    ),
    (
        "every trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER ALL",
        "guard_trigger_disabled",
    ),
    (
        "update trigger for replicas only",
        "ALTER TABLE {t} ENABLE REPLICA TRIGGER palisade_guard_update",
        "guard_trigger_disabled",
    ),
    (
        "update trigger for origin sessions only",
        "ALTER TABLE {t} ENABLE TRIGGER palisade_guard_update",
        "guard_trigger_disabled",
    ),
    (
        "truncate trigger dropped",
        "DROP TRIGGER palisade_guard_truncate ON {t}",
        "guard_trigger_missing",
    ),
    (
        "update trigger exempts a role",
        "DROP TRIGGER palisade_guard_update ON {t};
         CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON {t} FOR EACH ROW
           WHEN (current_user <> '{app}') EXECUTE FUNCTION palisade_guard_fence();
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER palisade_guard_update",
        "guard_trigger_altered",
    ),
    (
        "update trigger on one column only",
        "DROP TRIGGER palisade_guard_update ON {t};
         CREATE TRIGGER palisade_guard_update BEFORE UPDATE OF last_fence ON {t} FOR EACH ROW
           EXECUTE FUNCTION palisade_guard_fence();
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER palisade_guard_update",
        "guard_trigger_altered",
    ),
    (
        "update trigger runs another function",
        "CREATE FUNCTION {t}_allow() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
         DROP TRIGGER palisade_guard_update ON {t};
         CREATE TRIGGER palisade_guard_update BEFORE UPDATE ON {t} FOR EACH ROW
           EXECUTE FUNCTION {t}_allow();
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER palisade_guard_update",
        "guard_trigger_altered",
    ),
    (
        "a BEFORE trigger that rewrites last_fence after the guard",
        "CREATE FUNCTION {t}_rewrite() RETURNS trigger LANGUAGE plpgsql AS
           $$BEGIN NEW.last_fence := OLD.last_fence; RETURN NEW; END$$;
         CREATE TRIGGER zz_rewrite BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_rewrite()",
        "foreign_trigger",
    ),
    (
        "a rule on the table",
        "CREATE RULE {t}_instead AS ON INSERT TO {t} DO INSTEAD NOTHING",
        "rule_on_table",
    ),
    (
        "a writable view granted to the application",
        "CREATE VIEW {t}_view AS SELECT * FROM {t}; ALTER VIEW {t}_view OWNER TO {owner};
         GRANT UPDATE ON {t}_view TO {app}",
        "unfenced_writer",
    ),
    (
        "the application is a member of the owner role",
        "GRANT {owner} TO {app}",
        "member_of_trusted_role",
    ),
    (
        "the application is a member of the fence role",
        "GRANT {fence} TO {app}",
        "member_of_trusted_role",
    ),
    (
        "the fence role may write the tombstones",
        "GRANT INSERT, UPDATE, DELETE ON palisade_row_fences TO {fence}",
        "unfenced_writer",
    ),
    (
        "the application may rebind the table",
        "GRANT UPDATE ON palisade_guarded_tables TO {app}",
        "unfenced_writer",
    ),
    (
        "a child table inherits the rows",
        "CREATE TABLE {t}_child () INHERITS ({t})",
        "unguarded_child_table",
    ),
    (
        "lock floor trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER palisade_guard_lock_floor",
        "guard_trigger_disabled",
    ),
    (
        "lock floor trigger dropped",
        "DROP TRIGGER palisade_guard_lock_floor ON {t}",
        "guard_trigger_missing",
    ),
    (
        "lock floor trigger asks another lock's floor",
        "DROP TRIGGER palisade_guard_lock_floor ON {t};
         CREATE TRIGGER palisade_guard_lock_floor BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW
           EXECUTE FUNCTION palisade_guard_lock_floor('last_fence', 'lock', 'nobody/uses');
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER palisade_guard_lock_floor",
        "guard_trigger_altered",
    ),
    (
        "lock floors switched off",
        "UPDATE palisade_floor_settings SET source = 'off'",
        "lock_floors_off",
    ),
    (
        "token trigger disabled",
        "ALTER TABLE {t} DISABLE TRIGGER palisade_guard_token",
        "guard_trigger_disabled",
    ),
    (
        "token trigger dropped",
        "DROP TRIGGER palisade_guard_token ON {t}",
        "guard_trigger_missing",
    ),
    (
        "token trigger checks another lock's tokens",
        "DROP TRIGGER palisade_guard_token ON {t};
         CREATE TRIGGER palisade_guard_token BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW
           EXECUTE FUNCTION palisade_guard_token('last_fence', 'lock', 'nobody/uses');
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER palisade_guard_token",
        "guard_trigger_altered",
    ),
    (
        "the application may present tokens",
        "GRANT EXECUTE ON FUNCTION palisade_present_token(text) TO {app}",
        "unfenced_writer",
    ),
    (
        "the fence role may write the presented tokens",
        "GRANT INSERT, UPDATE ON palisade_presented_tokens TO {fence}",
        "unfenced_writer",
    ),
];

fn plant(sql: &str, table: &str, setup: &Setup) -> String {
    sql.replace("{app}", &setup.app)
        .replace("{fence}", &setup.writer)
        .replace("{owner}", &setup.owner)
        .replace("{t}", table)
}

#[tokio::test]
async fn p5_every_planted_bypass_of_a_guarded_table_is_a_critical_finding() {
    let setup = setup().await;

    // The setup the docs describe passes: no critical finding at all.
    setup.table("clean").await;
    let clean = setup.audit("clean").await;
    assert!(critical(&clean).is_empty(), "{:#?}", clean.problems);
    assert!(!clean.problems.iter().any(|p| p.code == "bare_epochs"));
    // A table that takes bare epochs is a warning, naming the way out.
    setup.table("bare").await;
    setup
        .db
        .batch_execute("SELECT palisade_require_token('bare', false)")
        .await
        .unwrap();
    let bare = setup.audit("bare").await;
    assert!(
        bare.problems.iter().any(|p| p.code == "bare_epochs"
            && p.severity == Severity::Warning
            && p.message.contains("palisade_require_token")),
        "{:#?}",
        bare.problems
    );

    let found = table_mutants_found(&setup).await;
    guard_functions_altered_are_found(&setup).await;
    restore_checks_disabled_are_found(&setup).await;
    search_path_changes_are_found(&setup).await;
    temp_tables_user_schemas_and_overloads_are_found(&setup).await;
    a_decoy_schema_is_not_what_the_audit_sees(&setup).await;
    durability_off_is_reported(&setup).await;
    println!(
        "audit mutants: {found} planted in tables, 5 in function bodies, 6 in search_paths, \
         owners and Palisade's schema, 1 decoy schema, all found as critical"
    );
    setup.drop().await;
}

/// Each mutant of [`MUTANTS`] planted in a table of its own is a critical finding with its
/// proof; returns how many were found.
async fn table_mutants_found(setup: &Setup) -> usize {
    let mut found = 0;
    for (i, (name, sql, code)) in MUTANTS.iter().enumerate() {
        let table = format!("m{i}");
        setup.table(&table).await;
        setup
            .db
            .batch_execute(&plant(sql, &table, setup))
            .await
            .unwrap_or_else(|e| panic!("planting {name}: {e:?}"));
        let report = setup.audit(&table).await;
        let critical = critical(&report);
        assert!(
            critical.iter().any(|(c, _)| c == code),
            "{name}: expected a critical {code}, got {critical:#?}"
        );
        for problem in &report.problems {
            assert!(!problem.proof.is_empty(), "{name}: {problem:?}");
        }
        found += 1;
        // Undo what reaches beyond the table, so the next mutant starts clean.
        setup
            .db
            .batch_execute(&format!(
                "REVOKE ALL ON palisade_row_fences FROM {writer};
                 REVOKE ALL ON palisade_presented_tokens FROM {writer};
                 REVOKE EXECUTE ON FUNCTION palisade_present_token(text) FROM {app};
                 REVOKE ALL ON palisade_guarded_tables FROM {app};
                 REVOKE {owner} FROM {app}; REVOKE {writer} FROM {app};
                 REVOKE ALL ON {table} FROM PUBLIC;
                 UPDATE palisade_floor_settings SET source = 'coordinator';",
                writer = setup.writer,
                app = setup.app,
                owner = setup.owner,
            ))
            .await
            .unwrap();
    }
    assert_eq!(found, MUTANTS.len());

    found
}

/// A guard function re-created with an exemption passes every trigger check, but its body
/// does not match Palisade's; a tombstone function no longer running as its owner.
async fn guard_functions_altered_are_found(setup: &Setup) {
    let original = palisade_audit::guard::expected_body("palisade_guard_fence").unwrap();
    let exempting = original.replacen(
        "BEGIN",
        &format!(
            "BEGIN\n    IF current_user = '{}' THEN RETURN NEW; END IF;",
            setup.app
        ),
        1,
    );
    let recreate = |body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION palisade_guard_fence() RETURNS trigger \
             LANGUAGE plpgsql AS $palisade${body}$palisade$"
        )
    };
    setup.db.batch_execute(&recreate(&exempting)).await.unwrap();
    let report = setup.audit("clean").await;
    assert!(
        critical(&report)
            .iter()
            .any(|(c, m)| *c == "guard_function_altered" && m.contains("palisade_guard_fence")),
        "{:#?}",
        report.problems
    );
    setup.db.batch_execute(&recreate(&original)).await.unwrap();
    // The token's epoch presented without remembering it: the trigger would see none.
    let present = palisade_audit::guard::expected_body("palisade_present_token").unwrap();
    let forgetful = present.replacen("PERFORM set_config", "PERFORM length", 1);
    let recreate_present = |body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION palisade_present_token(token text) RETURNS bigint \
             LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $palisade${body}$palisade$"
        )
    };
    assert_ne!(forgetful, present);
    setup
        .db
        .batch_execute(&recreate_present(&forgetful))
        .await
        .unwrap();
    let report = setup.audit("clean").await;
    assert!(
        critical(&report)
            .iter()
            .any(|(c, m)| *c == "guard_function_altered" && m.contains("palisade_present_token")),
        "{:#?}",
        report.problems
    );
    setup
        .db
        .batch_execute(&recreate_present(&present))
        .await
        .unwrap();
    setup
        .db
        .batch_execute(
            "ALTER FUNCTION palisade_present_token(text) \
             SET search_path = pg_catalog, public, pg_temp",
        )
        .await
        .unwrap();
    // CREATE OR REPLACE dropped its pinned search_path with the rest (migration 9).
    setup
        .db
        .batch_execute(
            "ALTER FUNCTION palisade_guard_fence() SET search_path = pg_catalog, public, pg_temp",
        )
        .await
        .unwrap();
    // The tombstone function no longer running as its owner.
    setup
        .db
        .batch_execute("ALTER FUNCTION palisade_guard_tombstone() SECURITY INVOKER")
        .await
        .unwrap();
    let report = setup.audit("clean").await;
    assert!(
        critical(&report)
            .iter()
            .any(|(c, m)| *c == "guard_function_altered" && m.contains("SECURITY DEFINER")),
        "{:#?}",
        report.problems
    );
    setup
        .db
        .batch_execute("ALTER FUNCTION palisade_guard_tombstone() SECURITY DEFINER")
        .await
        .unwrap();
    assert!(critical(&setup.audit("clean").await).is_empty());
}

/// A database that never notices its own restore: the incarnation made constant, or the
/// floor check made a no-op.
async fn restore_checks_disabled_are_found(setup: &Setup) {
    for (function, signature, returns, planted) in [
        (
            "palisade_incarnation",
            "()",
            "text LANGUAGE sql STABLE",
            "SELECT 'always'::text",
        ),
        (
            "palisade_check_lock_floor",
            "(lock_name text, epoch bigint)",
            "void LANGUAGE plpgsql SECURITY DEFINER",
            "BEGIN RETURN; END",
        ),
    ] {
        let create = |body: &str| {
            format!(
                "CREATE OR REPLACE FUNCTION {function}{signature} RETURNS {returns} \
                 AS $palisade${body}$palisade$"
            )
        };
        setup.db.batch_execute(&create(planted)).await.unwrap();
        let report = setup.audit("clean").await;
        assert!(
            critical(&report)
                .iter()
                .any(|(c, m)| *c == "guard_function_altered" && m.contains(function)),
            "{function}: {:#?}",
            report.problems
        );
        let original = palisade_audit::guard::expected_body(function).unwrap();
        setup.db.batch_execute(&create(&original)).await.unwrap();
        // CREATE OR REPLACE dropped the pinned search_path with the rest (migration 9).
        let arguments = if signature == "()" {
            "()"
        } else {
            "(text, bigint)"
        };
        let pin = format!(
            "ALTER FUNCTION {function}{arguments} SET search_path = pg_catalog, public, pg_temp"
        );
        setup.db.batch_execute(&pin).await.unwrap();
    }
    assert!(critical(&setup.audit("clean").await).is_empty());
}

/// The README's statement on table `sp` with the token of an owner older than the row's
/// fence (7): the database reads lock `report/sp` and epoch 5 from it.
fn stale_update() -> String {
    let token = palisade_core::TokenSigner::from_secret_bytes(&[4; 32]).sign(
        &LockName::new("report/sp").unwrap(),
        palisade_core::Epoch(5),
        &palisade_core::HolderId::new("stale").unwrap(),
        &palisade_core::Principal::anonymous(),
        0,
    );
    format!(
        "UPDATE sp SET payload = 'stale', last_fence = t.epoch \
         FROM palisade_present_token('{token}') AS t(epoch) WHERE id = 1 AND last_fence < t.epoch"
    )
}

/// A DBA's plain SQL around Palisade's functions (P5, migration 9): a fence role whose
/// search_path puts shadow `<` and `<=` on bigint ahead of pg_catalog; the guard function
/// unpinned (the shadow then turns its check around: a stale write is accepted — what the pin
/// prevents); a shadow schema in a function's own setting; a function handed to another role.
/// Each is a critical finding; each is undone and the audit is clean again.
async fn search_path_changes_are_found(setup: &Setup) {
    let (db, fence) = (&setup.db, &setup.writer);
    setup.table("sp").await;
    db.batch_execute(&format!(
        "CREATE SCHEMA shadowops;
         CREATE FUNCTION shadowops.ne(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE
             AS 'SELECT $1 <> $2';
         CREATE FUNCTION shadowops.never(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE
             AS 'SELECT false';
         CREATE OPERATOR shadowops.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = shadowops.ne);
         CREATE OPERATOR shadowops.<= (LEFTARG = bigint, RIGHTARG = bigint,
                                       FUNCTION = shadowops.never);
         GRANT USAGE ON SCHEMA shadowops TO PUBLIC;
         ALTER ROLE {fence} IN DATABASE {name} SET search_path = shadowops, pg_catalog, public;
         SELECT palisade_learn_floor('report/sp', 1);",
        name = setup.name
    ))
    .await
    .unwrap();
    let found = |report: &BoundaryReport, code: &str, about: &str| {
        critical(report)
            .iter()
            .any(|(c, m)| *c == code && m.contains(about))
    };
    let report = setup.audit("sp").await;
    assert!(found(&report, "shadowed_name", "operator <"), "{report:#?}");
    // The README's statement with a stale epoch, as the fence role: its shadow `<` lets the
    // row through to the trigger, and the pinned guard refuses it.
    let as_fence = setup
        .url
        .replacen("://postgres@", &format!("://{fence}@"), 1);
    let stale = &stale_update();
    let writer = connect(&as_fence).await;
    let path: String = writer
        .query_one("SHOW search_path", &[])
        .await
        .unwrap()
        .get(0);
    assert!(path.starts_with("shadowops"), "{path}");
    let refused = writer.execute(stale.as_str(), &[]).await.unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("P5001"),
        "{refused:?}"
    );
    // Unpinned, the guard compares with the shadow `<=`: the same statement is accepted.
    db.batch_execute("ALTER FUNCTION palisade_guard_fence() RESET search_path")
        .await
        .unwrap();
    let writer = connect(&as_fence).await;
    assert_eq!(
        writer.execute(stale.as_str(), &[]).await.unwrap(),
        1,
        "the mutant is real"
    );
    let report = setup.audit("sp").await;
    assert!(
        found(&report, "function_search_path", "palisade_guard_fence"),
        "{report:#?}"
    );
    // A shadow schema in a function's own setting; a function handed to the application role.
    db.batch_execute(&format!(
        "CREATE SCHEMA shadowfloor;
         ALTER FUNCTION palisade_check_lock_floor(text, bigint)
             SET search_path = pg_catalog, shadowfloor, public;
         ALTER FUNCTION palisade_learn_floor(text, bigint) OWNER TO {app};",
        app = setup.app
    ))
    .await
    .unwrap();
    let report = setup.audit("sp").await;
    assert!(
        found(&report, "function_search_path", "palisade_check_lock_floor"),
        "{report:#?}"
    );
    assert!(
        found(&report, "function_owner", "palisade_learn_floor"),
        "{report:#?}"
    );
    db.batch_execute(&format!(
        "ALTER FUNCTION palisade_learn_floor(text, bigint) OWNER TO CURRENT_USER;
         ALTER FUNCTION palisade_check_lock_floor(text, bigint)
             SET search_path = pg_catalog, public, pg_temp;
         ALTER FUNCTION palisade_guard_fence() SET search_path = pg_catalog, public, pg_temp;
         ALTER ROLE {fence} IN DATABASE {name} RESET search_path;
         DROP SCHEMA shadowops CASCADE; DROP SCHEMA shadowfloor CASCADE;",
        name = setup.name
    ))
    .await
    .unwrap();
    let report = setup.audit("sp").await;
    assert!(critical(&report).is_empty(), "{report:#?}");
}

/// What an adversarial review found past the pin (P5): a temporary table named as Palisade's
/// (the session's temporary schema is searched first for tables unless `pg_temp` is named
/// last: the pin names it, and the stale write is refused), a `$user` schema with a shadow
/// `<` ahead of pg_catalog, and Palisade's schema open to another role's CREATE with an
/// overload of `to_jsonb` for the table in it. Each is found, undone, and the audit is clean.
async fn temp_tables_user_schemas_and_overloads_are_found(setup: &Setup) {
    let (db, fence) = (&setup.db, &setup.writer);
    setup.table("tt").await;
    db.batch_execute("SELECT palisade_learn_floor('report/tt', 10)")
        .await
        .unwrap();
    let as_fence = setup
        .url
        .replacen("://postgres@", &format!("://{fence}@"), 1);
    let writer = connect(&as_fence).await;
    writer
        .batch_execute(
            "CREATE TEMP TABLE palisade_floor_settings (singleton boolean, source text);
             INSERT INTO palisade_floor_settings VALUES (true, 'off');",
        )
        .await
        .unwrap();
    let below = "UPDATE tt SET payload = 'stale', last_fence = 8 WHERE id = 1";
    let refused = writer.execute(below, &[]).await.unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("P5009"),
        "{refused:?}"
    );
    db.batch_execute(&format!(
        "CREATE SCHEMA {fence} AUTHORIZATION {fence};
         CREATE FUNCTION {fence}.ne(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE
             AS 'SELECT $1 <> $2';
         CREATE OPERATOR {fence}.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = {fence}.ne);
         ALTER ROLE {fence} IN DATABASE {name} SET search_path = \"$user\", pg_catalog, public;
         GRANT CREATE ON SCHEMA public TO {fence};
         CREATE FUNCTION public.to_jsonb(r public.tt) RETURNS jsonb LANGUAGE sql
             AS 'SELECT pg_catalog.to_jsonb(r)';",
        name = setup.name
    ))
    .await
    .unwrap();
    let report = setup.audit("tt").await;
    let found = |code: &str, about: &str| {
        critical(&report)
            .iter()
            .any(|(c, m)| *c == code && m.contains(about))
    };
    assert!(found("shadowed_name", "operator <"), "{report:#?}");
    assert!(found("shadowed_name", "function to_jsonb"), "{report:#?}");
    assert!(found("guard_schema_writable", fence), "{report:#?}");
    db.batch_execute(&format!(
        "DROP FUNCTION public.to_jsonb(public.tt); REVOKE CREATE ON SCHEMA public FROM {fence};
         ALTER ROLE {fence} IN DATABASE {name} RESET search_path;
         DROP SCHEMA {fence} CASCADE;",
        name = setup.name
    ))
    .await
    .unwrap();
    let report = setup.audit("tt").await;
    assert!(critical(&report).is_empty(), "{report:#?}");
}

/// A decoy (P5): the audit's role is given `search_path = decoy, public`, where `decoy` has a
/// guarded copy of the table, while the real table's trigger is disabled and the application
/// role may update it. The audit sets its own search_path: it sees the real table (named,
/// schema-qualified, in its report), and the bypass is critical.
async fn a_decoy_schema_is_not_what_the_audit_sees(setup: &Setup) {
    let db = &setup.db;
    setup.table("dk").await;
    db.batch_execute(&format!(
        "CREATE SCHEMA decoy;
         CREATE TABLE decoy.dk (LIKE public.dk INCLUDING ALL);
         INSERT INTO decoy.dk SELECT * FROM public.dk;
         SELECT palisade_install_guard('decoy.dk'::regclass, 'id', false, 'report/dk', NULL);
         ALTER TABLE public.dk DISABLE TRIGGER palisade_guard_update;
         GRANT UPDATE ON public.dk TO {app};
         ALTER ROLE CURRENT_USER IN DATABASE {name} SET search_path = decoy, public;",
        app = setup.app,
        name = setup.name
    ))
    .await
    .unwrap();
    let report = setup.audit("dk").await;
    assert_eq!(
        report.resolved_table.as_deref(),
        Some("public.dk"),
        "{report:#?}"
    );
    let found: Vec<&str> = critical(&report).iter().map(|(code, _)| *code).collect();
    assert!(found.contains(&"guard_trigger_disabled"), "{found:?}");
    assert!(found.contains(&"unfenced_writer"), "{found:?}");
    db.batch_execute(&format!(
        "ALTER ROLE CURRENT_USER IN DATABASE {name} RESET search_path;
         SELECT palisade_drop_guard('decoy.dk'); DROP SCHEMA decoy CASCADE;
         REVOKE UPDATE ON public.dk FROM {app};",
        app = setup.app,
        name = setup.name
    ))
    .await
    .unwrap();
}

/// Durability: synchronous_commit off for the fence role is reported (a warning: the adapter
/// turns it on for its own connections), and so is a shadow table.
async fn durability_off_is_reported(setup: &Setup) {
    setup
        .db
        .batch_execute(&format!(
            "ALTER ROLE {} IN DATABASE {} SET synchronous_commit = off;
             CREATE TABLE shadow (LIKE clean);",
            setup.writer, setup.name
        ))
        .await
        .unwrap();
    let report = setup.audit("clean").await;
    let warnings: Vec<_> = report
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Warning)
        .map(|p| p.code.as_str())
        .collect();
    assert!(warnings.contains(&"durability_off"), "{report:#?}");
    assert!(warnings.contains(&"unguarded_fenced_table"), "{report:#?}");
}
