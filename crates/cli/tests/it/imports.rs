//! ARCHITECTURE.md says no file of any crate imports one that imports it back: the crates are
//! layered by Cargo, and within each crate this test keeps the files layered. A file's imports
//! are the `crate::NAME` paths (and, in a crate's top-level files, `super::NAME`) outside
//! comments and test modules; `NAME` is a top-level module of the same crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::docs_blocks::root;

/// A crate's top-level modules and the modules each imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The import graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let Some(relative) = relative.strip_suffix(".rs") else {
                continue;
            };
            let module = relative.split('/').next().unwrap().to_owned();
            if ["lib", "main"].contains(&module.as_str()) || module.ends_with("_tests") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let top_level = !relative.contains('/');
            let imports = graph.entry(module.clone()).or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                imports.extend(imported(line, "crate::"));
                if top_level {
                    imports.extend(imported(line, "super::"));
                }
            }
            imports.remove(&module);
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for imports in graph.values_mut() {
        imports.retain(|m| modules.contains(m));
    }
    graph
}

/// The module names `line` imports through `prefix` (`crate::NAME`, `super::NAME`).
fn imported(line: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + prefix.len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') && !name.is_empty()
        {
            found.push(name);
        }
        rest = after;
    }
    found
}

/// A circle of `graph`, if it has one: its modules in import order.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn walk(graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> bool {
        let last = path.last().unwrap().clone();
        for next in &graph[&last] {
            if let Some(at) = path.iter().position(|m| m == next) {
                path.drain(..at);
                path.push(next.clone());
                return true;
            }
            if done.contains(next) {
                continue;
            }
            path.push(next.clone());
            if walk(graph, path, done) {
                return true;
            }
            path.pop();
        }
        done.insert(last);
        false
    }
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        let mut path = vec![start.clone()];
        if !done.contains(start) && walk(graph, &mut path, &mut done) {
            return Some(path);
        }
    }
    None
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let mut circles = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        if let Some(found) = circle(&graph(&src)) {
            circles.push(format!("{}: {}", src.display(), found.join(" -> ")));
        }
    }
    assert!(crates >= 20, "only {crates} crates found");
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_finder_finds_a_planted_circle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(
        dir.path().join("a.rs"),
        "use crate::b::B;\n// crate::c::C\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b.rs"), "use super::c;").unwrap();
    std::fs::write(
        dir.path().join("c.rs"),
        "pub struct C;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
    )
    .unwrap();
    assert_eq!(
        circle(&graph(dir.path())),
        None,
        "comments and tests do not count"
    );
    std::fs::write(dir.path().join("c.rs"), "fn f() { crate::a::g() }").unwrap();
    let found = circle(&graph(dir.path())).expect("a -> b -> c -> a");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4, "{found:?}");
}
