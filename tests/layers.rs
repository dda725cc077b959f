//! The layers `src/lib.rs` states are the layers the code has.
//!
//! lib.rs `//!` layer table ──parse──▶ rank per module
//! src/**/*.rs `crate::…` paths ──▶ edges between top-level modules ──▶ each points down
//!
//! The table is read from `lib.rs` itself, so the doc and this check
//! cannot drift apart: a module missing from the table, an import that
//! points up, or two modules of one floor importing each other fails.
//! Test code (`#[cfg(test)]` onwards) and comments are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module name -> floor (0 = top), from the ```text block under `# Layers`.
fn floors() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim_start())
        .collect();
    let start = doc
        .iter()
        .position(|l| *l == "# Layers")
        .expect("lib.rs has a # Layers section");
    let open = start + doc[start..].iter().position(|l| *l == "```text").unwrap();
    let close = open + 1 + doc[open + 1..].iter().position(|l| *l == "```").unwrap();
    let mut floors = BTreeMap::new();
    for (floor, line) in doc[open + 1..close].iter().enumerate() {
        let names = line.split("  ").next().unwrap();
        for name in names.split([',', '/']) {
            floors.insert(name.trim().to_string(), floor);
        }
    }
    floors
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a file's non-test code names through `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap();
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap();
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a::X, b};`
                let inner = group.split('}').next().unwrap();
                for item in inner.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    out.insert(name);
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    // Items of lib.rs itself (`crate::Runtime`) are re-exports of `runtime`.
    out.into_iter()
        .map(|n| {
            if n.starts_with(char::is_uppercase) {
                "runtime".to_string()
            } else {
                n
            }
        })
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn every_import_points_down_the_layers_stated_in_lib_rs() {
    let floors = floors();
    assert!(
        floors.len() > 10,
        "the layer table did not parse: {floors:?}"
    );
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    let mut problems = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap();
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
            continue;
        }
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let Some(&here) = floors.get(&module) else {
            problems.push(format!("{module} has no floor in lib.rs's layer table"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for target in imports(&text) {
            if target == module {
                continue;
            }
            let Some(&there) = floors.get(&target) else {
                problems.push(format!("{}: {target} has no floor", rel.display()));
                continue;
            };
            if there < here {
                problems.push(format!(
                    "{} imports {target}, a floor above {module}",
                    rel.display()
                ));
            }
            edges.insert((module.clone(), target));
        }
    }
    for (a, b) in &edges {
        if a < b && edges.contains(&(b.clone(), a.clone())) {
            problems.push(format!("{a} and {b} import each other"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_sees_an_import_that_points_up() {
    let found = imports(
        "use crate::http::ApiError;\nfn f() { crate::store::x(); }\n// crate::runtime\n#[cfg(test)]\nuse crate::cli;",
    );
    assert_eq!(
        found,
        BTreeSet::from(["http".to_string(), "store".to_string()])
    );
    let grouped = imports("use crate::{agents::Agent, tools};\nlet r: &crate::Runtime;");
    assert_eq!(
        grouped,
        BTreeSet::from(["agents".into(), "tools".into(), "runtime".into()])
    );
}

/// Issue #30: the sample domain (trading copilot, brokerage data) lives in
/// `sample/`; the runtime's own code, comments and tests included, names
/// none of it, so an embedder's domain is never second to it (the offline
/// model learns its words from the definitions it is given, the cache
/// from each tool's declaration).
#[test]
fn the_runtime_names_no_word_of_the_sample_domain() {
    const WORDS: [&str; 6] = [
        "trading",
        "brokerage",
        "ticker",
        "portfolio",
        "watchlist",
        "ohlcv",
    ];
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap().to_lowercase();
        for word in WORDS {
            if text.contains(word) {
                found.push(format!("{} names {word}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// Issue #30: cluster mode is an adapter wing. No file outside
/// `src/cluster/` names the PostgreSQL or Redis crates; the layers above
/// it (`runtime`, `server_config`) may pick and configure its adapters.
#[test]
fn postgres_and_redis_are_named_only_in_the_cluster_wing() {
    const CRATES: [&str; 4] = [
        "tokio_postgres",
        "deadpool_postgres",
        "tokio_postgres_rustls",
        "redis::",
    ];
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let cluster = src().join("cluster");
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(&cluster)) {
        let text = std::fs::read_to_string(file).unwrap();
        for name in CRATES {
            if text.contains(name) {
                found.push(format!("{} names {name}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}
