//! The example files the repository ships, loaded the way cadre loads them:
//! `examples/cadre.toml` by [`ServerConfig::load`], `examples/mcp.toml` by
//! the MCP config loader, `agents/tools/word_count.yaml` (with its
//! `count.py`) by a server on the repository's `agents/`.
//!
//! "Every key is in the example" is checked against the loaders
//! themselves: the config structs refuse unknown keys, and serde's refusal
//! lists the keys a table accepts, so a probe key per table tells the test
//! which keys the code has, without a list here to keep in step. A key added
//! to the code and not to the example fails the test, naming it.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cadre::mcp::config::{self as mcp_config, McpLimits};
use cadre::server_config::ServerConfig;
use reqwest::StatusCode;
use serde_json::json;
use support::{AppOptions, spawn_app};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The keys a table accepts, from the loader's refusal of an unknown one
/// ("unknown field `__probe`, expected one of `a`, `b`").
fn accepted_keys(error: &str) -> BTreeSet<String> {
    let (_, expected) = error
        .split_once("expected")
        .unwrap_or_else(|| panic!("a refusal listing the keys: {error}"));
    // The list ends its line; the next names the table ("in `api_limit`").
    let list = expected.lines().next().unwrap_or_default();
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The keys `section` of an example sets, or shows commented out
/// (`# max_per_tenant = 5`: a key whose default is "unset").
fn example_keys(text: &str, section: &str) -> BTreeSet<String> {
    let table: toml::Table = toml::from_str(text).expect("the example is TOML");
    let mut keys: BTreeSet<String> = match section.split_once('.') {
        None => table.get(section).and_then(|v| v.as_table()),
        Some((outer, inner)) => table
            .get(outer)
            .and_then(|v| v.get(inner))
            .and_then(|v| v.as_table()),
    }
    .map(|t| t.keys().cloned().collect())
    .unwrap_or_default();
    let header = format!("[{section}]");
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line.starts_with(&header);
        } else if inside
            && let Some(commented) = line.strip_prefix('#')
            && let Some((key, _)) = commented.split_once('=')
        {
            let key = key.trim();
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.insert(key.to_string());
            }
        }
    }
    keys
}

fn missing(code: &BTreeSet<String>, example: &BTreeSet<String>) -> Vec<String> {
    code.difference(example).cloned().collect()
}

fn server_config_refusal(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.toml");
    std::fs::write(&path, text).unwrap();
    ServerConfig::load(Some(&path), Vec::new())
        .expect_err("the probe key is refused")
        .to_string()
}

#[test]
fn the_server_config_example_loads_and_sets_every_key_to_its_default() {
    let path = examples().join("cadre.toml");
    let loaded = ServerConfig::load(Some(&path), Vec::new())
        .unwrap_or_else(|e| panic!("examples/cadre.toml does not load: {e}"));
    // Where it was read from (hidden from sandboxed tools) is no setting.
    assert_eq!(loaded.file.as_deref(), Some(path.as_path()));
    let loaded = ServerConfig {
        file: None,
        ..loaded
    };
    assert_eq!(
        format!("{loaded:?}"),
        format!("{:?}", ServerConfig::default()),
        "examples/cadre.toml must hold the defaults"
    );

    let text = std::fs::read_to_string(&path).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let sections = accepted_keys(&server_config_refusal("__probe = 1\n"));
    assert!(sections.contains("concurrency"), "{sections:?}");
    let written: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(
        missing(&sections, &written),
        Vec::<String>::new(),
        "sections of the server config missing from examples/cadre.toml"
    );
    for section in &sections {
        let keys = accepted_keys(&server_config_refusal(&format!(
            "[{section}]\n__probe = 1\n"
        )));
        assert_eq!(
            missing(&keys, &example_keys(&text, section)),
            Vec::<String>::new(),
            "keys of [{section}] missing from examples/cadre.toml"
        );
    }
}

fn mcp_refusal(text: &str) -> String {
    mcp_config::parse(Path::new("probe.toml"), text, &|_| None)
        .expect_err("the probe key is refused")
        .to_string()
}

#[test]
fn the_mcp_example_loads_and_declares_every_key() {
    // As cadre reads it from an agents folder: servers disabled, none started.
    let servers = mcp_config::load(&examples())
        .unwrap_or_else(|e| panic!("examples/mcp.toml does not load: {e}"));
    assert!(servers.is_empty(), "the example starts no server");

    // Enabled, every server is valid, at the default limits.
    let path = examples().join(mcp_config::FILE_NAME);
    let text = std::fs::read_to_string(&path).unwrap();
    let enabled = text.replace("enabled = false", "enabled = true");
    let env = |var: &str| (var == "SEARCH_TOKEN").then(|| "t0ken".to_string());
    let servers = mcp_config::parse(&path, &enabled, &env)
        .unwrap_or_else(|e| panic!("examples/mcp.toml's servers, enabled: {e}"));
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["files", "search"]);
    for server in &servers {
        assert_eq!(server.limits, McpLimits::default(), "{}", server.name);
    }

    let top = accepted_keys(&mcp_refusal("__probe = 1\n"));
    let table: toml::Table = toml::from_str(&text).unwrap();
    let written: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(missing(&top, &written), Vec::<String>::new());
    let limits = accepted_keys(&mcp_refusal("[limits]\n__probe = 1\n"));
    assert_eq!(
        missing(&limits, &example_keys(&text, "limits")),
        Vec::<String>::new(),
        "keys of [limits] missing from examples/mcp.toml"
    );
    let server_keys = accepted_keys(&mcp_refusal("[servers.x]\n__probe = 1\n"));
    let mut shown = BTreeSet::new();
    for name in table["servers"].as_table().unwrap().keys() {
        shown.extend(example_keys(&text, &format!("servers.{name}")));
    }
    assert_eq!(
        missing(&server_keys, &shown),
        Vec::<String>::new(),
        "server keys shown by no server of examples/mcp.toml"
    );
}

/// The tool file example of `docs/tools.md` is shipped and runs: its command names
/// `count.py` relative to the tool file, and the test runs from the crate
/// root, where there is no `count.py`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_word_count_example_runs_its_script_from_the_tool_files_folder() {
    assert!(!Path::new("count.py").exists());
    let app = spawn_app(AppOptions::offline());
    let text = "the quick brown fox\njumps over the lazy dog";
    let (status, body) = app
        .post(
            "/v1/tools/word_count/invoke",
            &json!({"params": {"text": text}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let output = &body["output"];
    assert_eq!(output["words"], text.split_whitespace().count(), "{body}");
    assert_eq!(output["lines"], text.lines().count(), "{body}");
    assert_eq!(output["characters"], text.chars().count(), "{body}");
}
