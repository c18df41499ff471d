//! The README's Rust snippet is the compiled example `examples/quickstart.rs`: every line of
//! the README's block must appear, in order, between the example's `README:` markers.

#[test]
fn the_readme_rust_snippet_is_the_compiled_example() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let block: Vec<&str> = readme
        .split("```rust\n")
        .nth(1)
        .expect("the README has a rust block")
        .split("```")
        .next()
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let compiled: Vec<&str> = example
        .split("// README: begin")
        .nth(1)
        .unwrap()
        .split("// README: end")
        .next()
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        block, compiled,
        "README.md's Rust block differs from examples/quickstart.rs"
    );
}
