//! The names the README, ARCHITECTURE.md and the docs cite are real: every file path in
//! backticks exists (`crates/…`, `docs/…`, `scripts/…`, `deploy/…`, `clients/…`, or a crate's
//! `src/`, `tests/`, `sql/`, `examples/`, `ui/` path written without `crates/`), and every test
//! named in backticks (`p1_…`, `p6_p8_…`; a trailing `…` cites a prefix) is defined somewhere
//! in the sources. A page that points a reader at something renamed or gone fails here.

use std::path::Path;

use crate::docs_blocks::{pages, root};

/// The text of every source file a page may cite a test from.
fn sources() -> String {
    let mut text = String::new();
    let mut dirs: Vec<std::path::PathBuf> = ["crates", "clients", "scripts"]
        .iter()
        .map(|d| root().join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !["node_modules", "dist", "build", "target"].contains(&name.as_str()) {
                    dirs.push(path);
                }
            } else if [".rs", ".py", ".ts", ".sql"]
                .iter()
                .any(|e| name.ends_with(e))
            {
                text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                text.push('\n');
            }
        }
    }
    text
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
fn every_file_and_test_the_docs_name_exists() {
    let root = root();
    let sources = sources();
    let (mut paths, mut tests, mut missing) = (0, 0, Vec::new());
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
            }
        }
    }
    assert!(
        paths > 100 && tests > 30,
        "{paths} paths, {tests} tests: the scan broke"
    );
    assert!(
        missing.is_empty(),
        "named in the docs, not in the repository:\n{}",
        missing.join("\n")
    );
    eprintln!("{paths} file paths and {tests} test names in the docs, all real");
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
    assert!(defined("fn p1_x() {}", "p1_x", false));
    assert!(!defined("fn p1_xy() {}", "p1_x", false));
    assert!(defined("fn p1_xy() {}", "p1_x", true));
}
