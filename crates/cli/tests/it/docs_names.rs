//! The names the README, ARCHITECTURE.md and the docs cite are real: every file path in
//! backticks exists (`crates/…`, `docs/…`, `scripts/…`, `deploy/…`, `clients/…`, or a crate's
//! `src/`, `tests/`, `sql/`, `examples/`, `ui/` path written without `crates/`), and every test
//! named in backticks (`p1_…`, `p6_p8_…`; a trailing `…` cites a prefix) is defined somewhere
//! in the sources, and every Rust item named in backticks (`Type::method`, `module::function`,
//! `CONSTANT_NAME`, `a_function()`, `CamelCaseType`, `snake_case_name`) is an identifier of the
//! sources — for a path, its last two segments in one file. A page that points a reader at
//! something renamed or gone fails here.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use crate::docs_blocks::{pages, root};

/// Every source file a page may cite a name from, one text per file: the code, the SQL, the
/// proto, the console, the scripts and the deployment files.
fn source_files() -> Vec<String> {
    let mut files = Vec::new();
    let root = root();
    let mut dirs: Vec<std::path::PathBuf> = ["crates", "clients", "scripts", "proto", "deploy"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        let whole = dir.ends_with("scripts") || dir.starts_with(root.join("deploy"));
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !["node_modules", "dist", "build", "target"].contains(&name.as_str()) {
                    dirs.push(path);
                }
            } else if whole
                || [
                    ".rs", ".py", ".ts", ".sql", ".proto", ".js", ".html", ".toml",
                ]
                .iter()
                .any(|e| name.ends_with(e))
            {
                files.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    files
}

/// The identifiers of one text: its runs of letters, digits and underscores.
fn identifiers(text: &str) -> HashSet<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
        .collect()
}

fn is_identifier(word: &str) -> bool {
    word.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The segments of a token that names a Rust item (or a field, column or metric the code
/// spells the same way): `a::b::c` and `f()` (two or more segments, or a call), `UPPER_CASE`,
/// `CamelCase` with two humps, and `snake_case` with an underscore. `None` for anything else:
/// prose, commands, flags, paths, numbers.
fn rust_item(token: &str) -> Option<Vec<&str>> {
    let bare = token.strip_suffix("()").unwrap_or(token);
    let segments: Vec<&str> = bare.split("::").collect();
    if !segments.iter().all(|s| is_identifier(s)) {
        return None;
    }
    let word = segments[0];
    let constant = word.contains('_')
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    let camel = word.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && word.chars().skip(1).any(|c| c.is_ascii_lowercase())
        && word.chars().skip(1).any(|c| c.is_ascii_uppercase());
    let snake = word.contains('_')
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let item = segments.len() > 1 || bare.len() < token.len() || constant || camel || snake;
    // A property's tests are checked as tests (`p1_…`); `_seconds`, `_int_free`: a suffix or
    // a C library's private name, not one of ours.
    (item && test_name(token).is_none() && !word.starts_with('_')).then_some(segments)
}

/// Names the docs use that are not Palisade's: the kernel's, glibc's, tokio's, openraft's,
/// PostgreSQL's, and the owner role the PostgreSQL setup suggests (each checked by hand to be
/// spelled as its owner spells it).
const FOREIGN_NAMES: [&str; 7] = [
    "epoll_wait",
    "malloc_consolidate",
    "unlink_chunk",
    "block_in_place",
    "client_write_ff",
    "pg_write_all_data",
    "palisade_owner",
];

/// Whether a metric name is real: documented (and so exported), or a counter the docs tell
/// an application to export from the Rust client's `Stats` field of the same name.
fn metric_exists(metrics: &BTreeSet<String>, all: &HashSet<&str>, name: &str) -> bool {
    metrics.contains(name)
        || name
            .strip_prefix("palisade_client_")
            .and_then(|rest| rest.strip_suffix("_total"))
            .is_some_and(|field| all.contains(field))
}

/// Whether the sources hold an item: every segment an identifier somewhere, and the last two
/// segments together in one file (a method of its type, a function of its module).
fn item_exists(files: &[HashSet<&str>], all: &HashSet<&str>, segments: &[&str]) -> bool {
    if segments.len() == 1 && FOREIGN_NAMES.contains(&segments[0]) {
        return true;
    }
    let tail = &segments[segments.len().saturating_sub(2)..];
    segments.iter().all(|s| all.contains(s))
        && files
            .iter()
            .any(|file| tail.iter().all(|s| file.contains(s)))
}

/// A token that names a file of the repository.
fn is_path(token: &str) -> bool {
    const ROOTS: [&str; 6] = [
        "crates/", "docs/", "scripts/", "deploy/", "clients/", "proto/",
    ];
    const CRATE_DIRS: [&str; 5] = ["/src/", "/tests/", "/sql/", "/examples/", "/ui/"];
    let plain = token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
    plain
        && !token.ends_with('/')
        && (ROOTS.iter().any(|r| token.starts_with(r))
            || CRATE_DIRS.iter().any(|d| {
                token.find(d).is_some_and(|at| {
                    !token[..at].contains('/') && token[..at].chars().all(|c| c != '.')
                })
            }))
}

/// A token that names a test: `p1_…` (properties, then words), with a trailing `…` for a prefix.
fn test_name(token: &str) -> Option<(&str, bool)> {
    let token = token.rsplit("::").next().unwrap_or(token);
    let (name, prefix) = match token.strip_suffix('…') {
        Some(name) => (name, true),
        None => (token, false),
    };
    let mut chars = name.chars();
    let starts = chars.next() == Some('p') && chars.next().is_some_and(|c| c.is_ascii_digit());
    let word = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    (starts && word && name.contains('_')).then_some((name, prefix))
}

fn defined(sources: &str, name: &str, prefix: bool) -> bool {
    ["fn ", "def ", "test(\""].iter().any(|intro| {
        let needle = format!("{intro}{name}");
        sources.match_indices(&needle).any(|(at, _)| {
            prefix || {
                let next = sources[at + needle.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            }
        })
    })
}

#[test]
fn every_file_test_and_item_the_docs_name_exists() {
    let root = root();
    let texts = source_files();
    let sources = texts.join("\n");
    let files: Vec<HashSet<&str>> = texts.iter().map(|t| identifiers(t)).collect();
    let all: HashSet<&str> = files.iter().flatten().copied().collect();
    // `metrics_docs.rs` keeps this list equal to what the processes export, whose names the
    // sources assemble from a prefix and a suffix.
    let metrics = crate::metrics_docs::documented();
    let (mut paths, mut tests, mut items, mut missing) = (0, 0, 0, Vec::new());
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        // Inside backticks: the odd pieces of a split on '`'.
        for token in text.split('`').skip(1).step_by(2).map(str::trim) {
            if is_path(token) {
                paths += 1;
                let found = [
                    Path::new(token).to_path_buf(),
                    Path::new("crates").join(token),
                ]
                .iter()
                .any(|p| root.join(p).exists());
                if !found {
                    missing.push(format!("{name}: file {token}"));
                }
            } else if let Some((test, prefix)) = test_name(token) {
                tests += 1;
                if !defined(&sources, test, prefix) {
                    missing.push(format!("{name}: test {token}"));
                }
            } else if let Some(segments) = rust_item(token) {
                items += 1;
                let metric = segments[0].starts_with("palisade_")
                    && metric_exists(&metrics, &all, segments[0]);
                if !metric && !item_exists(&files, &all, &segments) {
                    missing.push(format!("{name}: name {token}"));
                }
            }
        }
    }
    assert!(
        paths > 100 && tests > 30 && items > 200,
        "{paths} paths, {tests} tests, {items} names: the scan broke"
    );
    assert!(
        missing.is_empty(),
        "named in the docs, not in the repository:\n{}",
        missing.join("\n")
    );
    eprintln!(
        "{paths} file paths, {tests} test names and {items} item names in the docs, all real"
    );
}

#[test]
fn the_name_scanner_recognises_what_the_docs_write() {
    assert!(is_path("crates/fence-postgres/sql/008_lock_floors.sql"));
    assert!(is_path("coordinator/src/engine.rs"));
    assert!(is_path("docs/operations.md"));
    assert!(!is_path("palisade serve"));
    assert!(!is_path("DIR.high-water"));
    assert!(!is_path("http://127.0.0.1:7420/ui/"));
    assert_eq!(
        test_name("p6_p8_members_copied_back…"),
        Some(("p6_p8_members_copied_back", true))
    );
    assert_eq!(
        test_name("restore.rs::p8_a_lease_log_cut_short_is_refused"),
        Some(("p8_a_lease_log_cut_short_is_refused", false))
    );
    assert_eq!(test_name("palisade_lock_floors"), None);
    assert_eq!(test_name("P5008"), None);
    assert_eq!(
        rust_item("LogLeaseStore::commit"),
        Some(vec!["LogLeaseStore", "commit"])
    );
    assert_eq!(rust_item("read_counter()"), Some(vec!["read_counter"]));
    assert_eq!(rust_item("MAX_MEMBERS"), Some(vec!["MAX_MEMBERS"]));
    assert_eq!(rust_item("RaftLeaseStore"), Some(vec!["RaftLeaseStore"]));
    assert_eq!(rust_item("applied_watch"), Some(vec!["applied_watch"]));
    for prose in [
        "palisade serve",
        "--wipe",
        "CI",
        "Raft",
        "SIGSTOP",
        "_seconds",
        "p1_x",
    ] {
        assert_eq!(rust_item(prose), None, "{prose}");
    }
    let files = vec![
        identifiers("struct LogLeaseStore; fn commit() {}"),
        identifiers("fn x()"),
    ];
    let all: HashSet<&str> = files.iter().flatten().copied().collect();
    assert!(item_exists(&files, &all, &["LogLeaseStore", "commit"]));
    assert!(
        !item_exists(&files, &all, &["LogLeaseStore", "x"]),
        "not in one file"
    );
    assert!(!item_exists(&files, &all, &["RedbLeaseStore", "commit"]));
    assert!(defined("fn p1_x() {}", "p1_x", false));
    assert!(!defined("fn p1_xy() {}", "p1_x", false));
    assert!(defined("fn p1_xy() {}", "p1_x", true));
}
