//! The house rule ARCHITECTURE.md states: no function outside tests is longer than 70 lines
//! and no test longer than 100, so each reads as the steps it takes. Every Rust file of every
//! crate is parsed (`syn`, with line numbers); a function's length runs from `fn` to its closing
//! brace (its doc comment and attributes not counted). Tests are the files under `tests/`,
//! `*_tests.rs` files, `#[cfg(test)]` modules and functions marked `#[test]` or `#[…::test]`.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::docs_blocks::root;

/// Longest function outside tests, in lines.
const MAX_FUNCTION_LINES: usize = 70;
/// Longest test, in lines.
const MAX_TEST_LINES: usize = 100;

/// One function: where it is, its length, and whether it is test code.
#[derive(Debug)]
struct Function {
    at: String,
    lines: usize,
    test: bool,
}

struct Finder {
    file: String,
    /// Inside a `#[cfg(test)]` module, or a test file.
    in_tests: bool,
    found: Vec<Function>,
}

fn is_test_attr(attr: &syn::Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "test")
}

fn is_cfg_test(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("cfg")
        && attr
            .meta
            .require_list()
            .is_ok_and(|list| list.tokens.to_string() == "test")
}

impl Finder {
    fn record(&mut self, name: &syn::Ident, attrs: &[syn::Attribute], from: usize, to: usize) {
        self.found.push(Function {
            at: format!("{}:{from} {name}", self.file),
            lines: to - from + 1,
            test: self.in_tests || attrs.iter().any(is_test_attr),
        });
    }
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let outer = self.in_tests;
        self.in_tests |= item.attrs.iter().any(is_cfg_test);
        syn::visit::visit_item_mod(self, item);
        self.in_tests = outer;
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let from = item.sig.fn_token.span.start().line;
        let to = item.block.span().end().line;
        self.record(&item.sig.ident, &item.attrs, from, to);
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        let from = item.sig.fn_token.span.start().line;
        let to = item.block.span().end().line;
        self.record(&item.sig.ident, &item.attrs, from, to);
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            let from = item.sig.fn_token.span.start().line;
            self.record(&item.sig.ident, &item.attrs, from, block.span().end().line);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

/// Every `.rs` file of the crates, and whether it is test code by its place.
fn rust_files() -> Vec<(PathBuf, bool)> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("crates")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !["target", "node_modules"].contains(&name.as_str()) {
                    dirs.push(path);
                }
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let in_tests_dir = path.components().any(|c| c.as_os_str() == "tests");
                files.push((path, in_tests_dir || stem.ends_with("_tests")));
            }
        }
    }
    files
}

fn functions(path: &Path, test_file: bool) -> Vec<Function> {
    let text = std::fs::read_to_string(path).unwrap();
    let file = syn::parse_file(&text)
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}", path.display()));
    let mut finder = Finder {
        file: path
            .strip_prefix(root())
            .unwrap_or(path)
            .display()
            .to_string(),
        in_tests: test_file,
        found: Vec::new(),
    };
    finder.visit_file(&file);
    finder.found
}

#[test]
fn no_function_outside_tests_is_over_70_lines_and_no_test_over_100() {
    let mut all = Vec::new();
    for (path, test_file) in rust_files() {
        all.extend(functions(&path, test_file));
    }
    let tests = all.iter().filter(|f| f.test).count();
    assert!(
        all.len() > 2_000 && tests > 500,
        "{} functions, {tests} tests: the scan broke",
        all.len()
    );
    let over: Vec<String> = all
        .iter()
        .filter(|f| {
            let limit = if f.test {
                MAX_TEST_LINES
            } else {
                MAX_FUNCTION_LINES
            };
            f.lines > limit
        })
        .map(|f| {
            format!(
                "{} ({} lines{})",
                f.at,
                f.lines,
                if f.test { ", a test" } else { "" }
            )
        })
        .collect();
    assert!(
        over.is_empty(),
        "over {MAX_FUNCTION_LINES} lines (tests: {MAX_TEST_LINES}); split them by step:\n{}",
        over.join("\n")
    );
}

#[test]
fn the_length_scan_sees_functions_methods_and_tests() {
    let source = "
/// A doc comment is not counted.
fn free() {
    let _ = 1;
}
struct S;
impl S {
    fn method(&self) {}
}
#[cfg(test)]
mod tests {
    fn helper() {}
}
#[tokio::test]
async fn a_test() {
    let s = \"}\";
}
";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.rs");
    std::fs::write(&path, source).unwrap();
    let found = functions(&path, false);
    let summary: Vec<(String, usize, bool)> = found
        .iter()
        .map(|f| (f.at.rsplit(' ').next().unwrap().to_owned(), f.lines, f.test))
        .collect();
    assert_eq!(
        summary,
        [
            ("free".to_owned(), 3, false),
            ("method".to_owned(), 1, false),
            ("helper".to_owned(), 1, true),
            ("a_test".to_owned(), 3, true),
        ]
    );
}
