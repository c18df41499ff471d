//! Every code block in the README and the docs is compiled or run, so what a newcomer copies
//! works:
//!
//! - `rust`: the block is, line for line, part of an example the workspace compiles
//!   (`crates/*/examples/*.rs`);
//! - `toml`: a lock policy that `palisade serve --policy` accepts;
//! - `sql`: run, in order, against the test PostgreSQL (the Python client's README's by its tests);
//! - `python`: run by the Python client's tests (`clients/python/tests`);
//! - `ts`: line for line, part of an example the TypeScript client's tests compile and run
//!   (`clients/typescript/examples/*.ts`);
//! - `sh`: run as written by [`shell_blocks_run_as_written`], each command's exit status
//!   checked (0, or the one its comment names: `# exits 3`), unless its info string says
//!   `no-run:` and why (a production host, the test command itself, minutes of drills) and
//!   where the same thing is tested instead;
//! - `text`: diagrams and output.
//!
//! The shell blocks run with the test build of `palisade` first on `PATH`, in a fresh
//! directory per page, against a coordinator on a free port of the test's own: the docs' default
//! ports (7420, the store 7421) are rewritten to it in each block (where a block names them, and
//! `--listen` where it starts a server on its default address), and `PALISADE_ENDPOINT` and
//! `PALISADE_RESOURCE` name them, so a coordinator the reader left running on 7420
//! (`cargo run --release -- serve`) does not collide with the tests. What the harness does between blocks is what
//! the reader is told to do: start the coordinator, kill it with -9 and start it again, stop it,
//! and fill in the `LEASE_ID` the first acquire printed.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every Markdown page with code: the root's, the docs', the Python and TypeScript clients'.
pub(crate) fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("clients/python/README.md"),
        root.join("clients/typescript/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

#[derive(Debug, Clone)]
struct Block {
    page: String,
    line: usize,
    info: String,
    text: String,
}

impl Block {
    fn lang(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }

    fn runs(&self) -> bool {
        self.lang() == "sh" && !self.info.contains("no-run:")
    }
}

fn blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(page).unwrap();
    let name = page
        .strip_prefix(root())
        .unwrap_or(page)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (index, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((index + 1, info.trim().to_owned(), String::new())),
            (Some(_), Some("")) => {
                let (line, info, text) = open.take().unwrap();
                out.push(Block {
                    page: name.clone(),
                    line,
                    info,
                    text,
                });
            }
            (Some((_, _, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{name}: a code block is not closed");
    out
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|page| blocks(page)).collect()
}

/// The TypeScript client's examples (compiled and run by its tests), each as its lines with
/// the indentation removed.
fn typescript_examples() -> Vec<Vec<String>> {
    let dir = root().join("clients/typescript/examples");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .map(|text| text.lines().map(|l| l.trim().to_owned()).collect())
        .collect()
}

/// The compiled examples, each as its lines with the indentation removed.
fn examples() -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = krate.unwrap().path().join("examples");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path, text.lines().map(|l| l.trim().to_owned()).collect()));
        }
    }
    out
}

#[test]
fn every_block_is_compiled_run_or_says_why_not() {
    let blocks = all_blocks();
    assert!(blocks.len() >= 20, "found only {} blocks", blocks.len());
    let examples = examples();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for block in &blocks {
        let at = format!("{}:{}", block.page, block.line);
        match block.lang() {
            "rust" => {
                let lines: Vec<String> = block.text.lines().map(|l| l.trim().to_owned()).collect();
                let found = examples.iter().any(|(_, example)| {
                    example
                        .windows(lines.len())
                        .any(|window| window == lines.as_slice())
                });
                assert!(
                    found,
                    "{at}: this Rust block is in no example under crates/*/examples"
                );
            }
            "toml" => {
                palisade_audit::Policy::parse(&block.text)
                    .unwrap_or_else(|e| panic!("{at}: the policy is refused: {e}"));
            }
            "sh" if !block.runs() => {
                let why = block.info.split("no-run:").nth(1).unwrap_or("").trim();
                assert!(
                    why.len() > 10,
                    "{at}: say why this block is not run, and where it is tested"
                );
            }
            "sh" | "sql" | "text" => {}
            "ts" => {
                let lines: Vec<String> = block.text.lines().map(|l| l.trim().to_owned()).collect();
                let found = typescript_examples().iter().any(|example| {
                    example
                        .windows(lines.len())
                        .any(|window| window == lines.as_slice())
                });
                assert!(
                    found,
                    "{at}: this TypeScript block is in no example under clients/typescript/examples"
                );
            }
            "python" => assert_eq!(
                block.page, "clients/python/README.md",
                "{at}: Python blocks are run by the Python client's tests, which read its README"
            ),
            other => {
                panic!("{at}: a block tagged {other:?}: tag it rust, toml, sh, sql, python, ts or text")
            }
        }
        *counts.entry(block.lang()).or_default() += 1;
    }
    eprintln!("code blocks by kind: {counts:?}");
}

/// `docs/enforcement.md`'s SQL, run as the page says: after the table exists, the column is
/// added (block 1), the adapter's migrations and guard are installed, the seed statement (block
/// 2) writes a newer epoch and refuses an older one, the token statement (block 3) does the same
/// once the table requires tokens, and the grants (block 4) leave the application's role
/// nothing to write with and let the SQL-only writer's login run the token statement.
#[test]
fn sql_blocks_run_in_postgresql() {
    let blocks: Vec<Block> = blocks(&root().join("docs/enforcement.md"))
        .into_iter()
        .filter(|b| b.lang() == "sql")
        .collect();
    assert_eq!(
        blocks.len(),
        4,
        "the test knows four SQL blocks: {blocks:?}"
    );
    let maintenance = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .expect("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
    let name = format!("docs_sql_{}", std::process::id());
    let (server, _) = maintenance.rsplit_once('/').unwrap();
    let url = format!("{server}/{name}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = common::pg_connect(&maintenance).await;
        a_fresh_database_and_the_roles(&admin, &name).await;
        let db = common::pg_connect(&url).await;
        db.batch_execute(
            "CREATE TABLE reports (id bigint PRIMARY KEY, payload text NOT NULL);
             INSERT INTO reports VALUES (7, 'first');",
        )
        .await
        .unwrap();
        db.batch_execute(&blocks[0].text).await.unwrap();
        let fence = the_guard_installed_on_reports(&url).await;
        // The lock's floor in this database incarnation, as the clients learn it (P5008).
        db.execute("SELECT palisade_learn_floor('report/7', 0)", &[])
            .await
            .unwrap();
        let seed = db.prepare(&blocks[1].text).await.unwrap();
        let newer = db
            .query(&seed, &[&7i64, &5i64, &"from epoch 5"])
            .await
            .unwrap();
        assert_eq!(newer.len(), 1, "the newer epoch writes");
        let older = db
            .query(&seed, &[&7i64, &3i64, &"from epoch 3"])
            .await
            .unwrap();
        assert!(older.is_empty(), "the older epoch is refused: zero rows");
        the_token_statement_binds_the_write(&db, &blocks[1].text, &blocks[2].text).await;
        let findings = db.simple_query(&blocks[3].text).await.unwrap();
        let rows = findings
            .iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
            .count();
        assert_eq!(rows, 0, "palisade_guard_findings must return no rows");
        the_sql_only_writer_writes_with_its_grants(&url, &blocks[2].text).await;
        drop(db);
        drop(fence);
        admin
            .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .await
            .unwrap();
    });
}

/// Once `reports` requires tokens, the bare seed statement (`bare`) is refused and the token
/// statement (`bound`) writes a newer owner's token and refuses an older one's.
async fn the_token_statement_binds_the_write(db: &tokio_postgres::Client, bare: &str, bound: &str) {
    db.batch_execute("SELECT palisade_require_token('reports', true)")
        .await
        .unwrap();
    let refused = db
        .query(bare, &[&7i64, &6i64, &"bare epoch 6"])
        .await
        .unwrap_err();
    assert_eq!(refused.code().unwrap().code(), "P5010", "{refused}");
    let statement = db.prepare(bound).await.unwrap();
    let newer = db
        .query(&statement, &[&token(6), &"from epoch 6", &7i64])
        .await
        .unwrap();
    assert_eq!(newer.len(), 1, "the newer owner's token writes");
    let older = db
        .query(&statement, &[&token(4), &"from epoch 4", &7i64])
        .await
        .unwrap_err();
    // A newer owner's token was presented for the lock: the older one is superseded.
    assert_eq!(older.code().unwrap().code(), "P5009", "{older}");
}

/// A token of lock `report/7` at `epoch`, signed by the docs' test key.
fn token(epoch: u64) -> String {
    palisade_core::TokenSigner::from_secret_bytes(&[8; 32]).sign(
        &palisade_core::LockName::new("report/7").unwrap(),
        palisade_core::Epoch(epoch),
        &palisade_core::HolderId::new("docs").unwrap(),
        &palisade_core::Principal::anonymous(),
        0,
    )
}

/// Logged in as `report_writer` with block 4's grants, the token statement (`bound`) writes
/// the next owner's token, and a plain UPDATE is refused.
async fn the_sql_only_writer_writes_with_its_grants(url: &str, bound: &str) {
    let url = url.replacen("postgres://postgres@", "postgres://report_writer@", 1);
    let writer = common::pg_connect(&url).await;
    let written = writer
        .query(bound, &[&token(7), &"by the SQL-only writer", &7i64])
        .await
        .unwrap();
    assert_eq!(written.len(), 1, "the writer role's token statement writes");
    let plain = writer
        .batch_execute("UPDATE reports SET payload = 'plain' WHERE id = 7")
        .await
        .unwrap_err();
    assert_eq!(plain.code().unwrap().code(), "P5010", "{plain}");
}

/// Database `name` created empty, and the roles the page names (cluster-wide: made once).
async fn a_fresh_database_and_the_roles(admin: &tokio_postgres::Client, name: &str) {
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    admin
        .batch_execute(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'palisade_fence') THEN
                 CREATE ROLE palisade_fence; END IF;
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app') THEN
                 CREATE ROLE app; END IF;
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'report_writer') THEN
                 CREATE ROLE report_writer LOGIN; END IF;
             END $$",
        )
        .await
        .unwrap();
}

/// The adapter's migrations and guard installed on `reports` (lock `report/7`, strict) in the
/// database at `url`; the fence that installed them.
async fn the_guard_installed_on_reports(url: &str) -> palisade_fence_postgres::PostgresFence {
    let verifier = std::sync::Arc::new(palisade_fence::Verifier::new(
        palisade_core::TokenVerifier::new([]),
    ));
    let fence = palisade_fence_postgres::PostgresFence::connect(
        url,
        2,
        palisade_fence::FenceMode::Strict,
        verifier,
    )
    .await
    .unwrap()
    .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()));
    palisade_fence_postgres::GuardedTable::new(
        "reports",
        "id",
        "payload",
        palisade_fence_postgres::RowLock::Table(palisade_core::LockName::new("report/7").unwrap()),
    )
    .unwrap()
    .install_guard(&fence, false)
    .await
    .unwrap();
    fence
}

/// The coordinator the harness runs where a page says "with the server running".
struct Coordinator {
    child: Child,
}

impl Coordinator {
    fn start(dir: &Path, ports: Ports) -> Self {
        let listen = format!("127.0.0.1:{}", ports.coordinator);
        let mut child = Command::new(common::BINARY)
            .args(["serve", "--listen", &listen])
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines
                .next()
                .expect("the coordinator listens before exiting")
                .unwrap();
            if line.starts_with(&format!("palisade coordinator listening on {listen}")) {
                break;
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        Self { child }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The block with a status report after every command, so each command's exit status is
/// checked: `__status $? LINE` after each complete command (not inside a heredoc, not after a
/// continued line).
fn instrument(text: &str) -> String {
    let mut out = String::from("__status() { echo \"$2 $1\" >> \"$PALISADE_DOCS_STATUS\"; }\n");
    let mut heredoc: Option<String> = None;
    for (index, line) in text.lines().enumerate() {
        out.push_str(line);
        out.push('\n');
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
                out.push_str(&format!("__status $? {}\n", index + 1));
            }
            continue;
        }
        let code = line.split(" #").next().unwrap_or("").trim();
        if code.is_empty() || code.starts_with('#') || code.ends_with('\\') {
            continue;
        }
        if let Some(rest) = code.split("<<").nth(1) {
            heredoc = Some(rest.trim().trim_matches(['\'', '"', '-']).to_owned());
            continue;
        }
        out.push_str(&format!("__status $? {}\n", index + 1));
    }
    out
}

/// The exit status a line's comment promises (`exits 3`, `exit 7`), else 0.
fn promised_status(line: &str) -> i32 {
    let Some(comment) = line.split(" #").nth(1) else {
        return 0;
    };
    let words: Vec<&str> = comment
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .find(|w| w[0] == "exit" || w[0] == "exits")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(0)
}

/// Runs one block in `dir`; returns its stdout. Its processes (a store or coordinator started
/// with `&`) stay up until `groups` are killed.
/// The ports a page's blocks use instead of the docs' defaults (7420 and 7421).
#[derive(Debug, Clone, Copy)]
struct Ports {
    coordinator: u16,
    store: u16,
}

impl Ports {
    fn new() -> Self {
        Self {
            coordinator: common::free_port(),
            store: common::free_port(),
        }
    }

    /// `text` with the docs' default ports replaced by these: where they are named, and where
    /// a server is started on its default address.
    fn rewrite(self, text: &str) -> String {
        let (coordinator, store) = (
            format!("127.0.0.1:{}", self.coordinator),
            format!("127.0.0.1:{}", self.store),
        );
        text.lines()
            .map(|line| {
                let line = line
                    .replace(":7420", &format!(":{}", self.coordinator))
                    .replace(":7421", &format!(":{}", self.store));
                // A cluster member listens on its --cluster entry.
                if ["--listen", "--cluster", "--node-id"]
                    .iter()
                    .any(|flag| line.contains(flag))
                {
                    line
                } else {
                    line.replace(
                        "palisade serve",
                        &format!("palisade serve --listen {coordinator}"),
                    )
                    .replace(
                        "palisade resource serve",
                        &format!("palisade resource serve --listen {store}"),
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn run_block(
    block: &Block,
    text: &str,
    (dir, ports): (&Path, Ports),
    groups: &mut Vec<i32>,
) -> String {
    let status_file = dir.join(".statuses");
    let _ = std::fs::remove_file(&status_file);
    let debug = Path::new(common::BINARY).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", debug.display(), std::env::var("PATH").unwrap());
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(instrument(&ports.rewrite(text)))
        .current_dir(dir)
        .env("PATH", path)
        .env("PALISADE_DOCS_STATUS", &status_file)
        .env("RUST_LOG", "warn")
        .env(
            "PALISADE_ENDPOINT",
            format!("http://127.0.0.1:{}", ports.coordinator),
        )
        .env(
            "PALISADE_RESOURCE",
            format!("http://127.0.0.1:{}", ports.store),
        )
        .env(
            "PALISADE_LISTEN",
            format!("127.0.0.1:{}", ports.coordinator),
        )
        .env(
            "PALISADE_RESOURCE_LISTEN",
            format!("127.0.0.1:{}", ports.store),
        )
        .env_remove("PALISADE_TOKEN")
        .stdin(Stdio::null())
        // Files, not pipes: a server the block starts with `&` keeps its output open.
        .stdout(std::fs::File::create(dir.join(".stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join(".stderr")).unwrap());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().unwrap();
    groups.push(child.id() as i32);
    child.wait().unwrap();
    let stdout = std::fs::read_to_string(dir.join(".stdout")).unwrap();
    let stderr = std::fs::read_to_string(dir.join(".stderr")).unwrap();
    let statuses = std::fs::read_to_string(&status_file).unwrap_or_default();
    let seen: BTreeMap<usize, i32> = statuses
        .lines()
        .map(|l| {
            let (line, status) = l.split_once(' ').unwrap();
            (line.parse().unwrap(), status.parse().unwrap())
        })
        .collect();
    for (index, line) in text.lines().enumerate() {
        let Some(&status) = seen.get(&(index + 1)) else {
            continue;
        };
        assert_eq!(
            status,
            promised_status(line),
            "{}:{}: `{}` exited {status}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            block.page,
            block.line + 1 + index,
            line.trim()
        );
    }
    assert!(
        !seen.is_empty() || text.trim().is_empty(),
        "{}:{}: nothing ran\nstderr:\n{stderr}",
        block.page,
        block.line
    );
    stdout
}

fn kill_groups(groups: &[i32]) {
    for &group in groups {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// What the pages' runnable blocks must print, beyond their exit statuses.
const PRINTS: [(&str, &str, &str); 6] = [
    ("README.md", "palisade resource get report/9", "from B"),
    (
        "README.md",
        "palisade cluster add 4",
        "voters now [1,2,3,4]",
    ),
    (
        "README.md",
        "palisade cluster remove 4",
        "voters now [1,2,3]",
    ),
    ("README.md", "jq .class", "\"efficiency\""),
    ("README.md", "palisade audit --probe", "refused after epoch"),
    (
        "docs/enforcement.md",
        "palisade resource get report/7",
        "hello",
    ),
];

#[test]
fn shell_blocks_run_as_written() {
    let mut pages: BTreeMap<String, Vec<Block>> = BTreeMap::new();
    for block in all_blocks().into_iter().filter(Block::runs) {
        pages.entry(block.page.clone()).or_default().push(block);
    }
    assert!(
        pages.contains_key("README.md"),
        "the README's tour is not run"
    );
    let mut ran = 0;
    for (page, blocks) in pages {
        let dir = tempfile::tempdir().unwrap();
        let ports = Ports::new();
        let mut groups = Vec::new();
        // "With the server running".
        let mut coordinator = Some(Coordinator::start(dir.path(), ports));
        let mut lease_id: Option<String> = None;
        for block in &blocks {
            let mut text = block.text.clone();
            if text.contains("palisade lock show report/7") {
                // "Now kill the server hard … Start it again."
                let mut running = coordinator.take().unwrap();
                running.kill9();
                coordinator = Some(Coordinator::start(dir.path(), ports));
                let id = lease_id
                    .clone()
                    .expect("the first acquire printed a lease id");
                text = text.replace("LEASE_ID", &id);
            }
            if text.contains("palisade serve --policy") {
                // "Stop the coordinator of the tour".
                if let Some(mut running) = coordinator.take() {
                    running.stop();
                }
            }
            let stdout = run_block(block, &text, (dir.path(), ports), &mut groups);
            if lease_id.is_none() {
                lease_id = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("lease_id"))
                    .map(|rest| rest.trim().to_owned());
            }
            for (on, marker, expect) in PRINTS {
                if page == on && text.contains(marker) {
                    assert!(
                        stdout.contains(expect),
                        "{page}:{}: expected {expect:?} in\n{stdout}",
                        block.line
                    );
                }
            }
            ran += 1;
        }
        drop(coordinator);
        kill_groups(&groups);
    }
    eprintln!("{ran} shell blocks ran as written");
}

#[test]
fn the_instrumentation_checks_each_command() {
    let text = "A=$(true)\ncat > f <<'X'\nbody\nX\nfalse   # exits 1\nlong \\\n  line\n";
    let script = instrument(text);
    assert!(script.contains("A=$(true)\n__status $? 1\n"), "{script}");
    assert!(script.contains("body\nX\n__status $? 4\n"), "{script}");
    assert!(!script.contains("long \\\n__status"), "{script}");
    assert_eq!(promised_status("false   # exits 1"), 1);
    assert_eq!(
        promised_status("palisade x   # refused by the policy: exit 7"),
        7
    );
    assert_eq!(promised_status("curl … # 409 lock_held"), 0);
}
