//! The contract, tested from outside: schemathesis (a property-based API
//! tester, from PyPI) reads `/openapi.json` from the real `cadre serve`
//! binary and sends it what the document allows and what it forbids, with
//! `--checks all`: no 5xx; every status, content type, header and body
//! (SSE events included) as documented; what the document allows is
//! accepted, what it forbids refused, a missing required header refused;
//! undocumented methods are 405 with `Allow`; without a valid key, 401.
//! Twice: against an open server (no keys: no auth is documented or
//! checked) and against a keyed one with a tenant's (non-admin) key.
//!
//! Exclusions, each as narrow as the document's blind spot:
//! - `invoke_tool` and `start_run`: `positive_data_acceptance` also takes a
//!   422. Their `params` / `input` is an object the document cannot
//!   describe further: each tool and workflow has its own schema (loaded
//!   from files, changed at runtime), and an object that fails it is the
//!   tool's or workflow's `VALIDATION_ERROR`. Every other check still runs
//!   on them.
//! - `session_websocket`: `not_a_server_error` and
//!   `positive_data_acceptance` also take a 101. A WebSocket upgrade that
//!   fits the document succeeds with 101 Switching Protocols (documented);
//!   the checks expect a 2xx from HTTP.
//!
//! - `create_key` and `show_usage`: `positive_data_acceptance` also takes
//!   a 422: an `expires_at` in the past, `admin` with `metrics`, a usage
//!   range over 366 days or ending before it starts (`to` defaults to
//!   today) are refused, rules between a value and the clock or between two
//!   fields that the document states in words only. In open mode `create_key` is not run at all: the
//!   first key ends open mode (by design), and every later request of the
//!   run would then be a 401 the open document does not describe.
//!
//! - `create_schedule` and `update_schedule`: `positive_data_acceptance`
//!   also takes a 422: the agent, workflow and session must exist, the
//!   cron expression parse and the time zone be known, and exactly one of
//!   `cron` and `interval_s` be given (rules against the server's state
//!   and between fields, stated in words).
//!
//! - `create_session`, `send_message`, `decide_confirmation`, `fork_session`:
//!   `positive_data_acceptance` also takes a 422. They take an
//!   `Idempotency-Key` (so do `invoke_tool` and `start_run`, above), and
//!   a key the run already sent with another body is 422
//!   `IDEMPOTENCY_KEY_REUSED`: whether a key was used before is state of
//!   the server, not something a request's schema can say. Generated keys
//!   repeat (the shortest example is the same for every operation).
//!
//! - `put_memory_item`: `positive_data_acceptance` also takes a 422: a
//!   value is at most 64 KiB of JSON, a bound the document states in
//!   words (a JSON Schema has no size of an object).
//!
//! - `erase_tenant_sessions` is not run in open mode: there every caller
//!   is an admin of tenant `default`, which owns every session the run
//!   creates, so one erase would take the sessions later checks follow
//!   (keyed, a tenant's key gets its documented 403). `delete_session` runs
//!   in both: it deletes only the session it names, and what follows a
//!   delete (404 on that id) is documented.
//!
//! - `replace_tenant_config`, `patch_tenant_config` and `stream_message`:
//!   `positive_data_acceptance` also takes a 422. A tenant config's
//!   `guardrails` must compile (a regex, a JSON Schema, unique names, the
//!   fields of each `kind` and `stage`), and a message's
//!   `response_format` schema must compile: rules the document states in
//!   words. (`send_message` takes a 422 already, above.)
//!
//! Nothing else is excluded, and no other operation is skipped.
//!
//! Test data: path parameters that name something (a tool, a workflow, an
//! agent) draw from a dictionary of names the repository's `agents/`
//! folder ships most of the time, so the tests reach past "not found";
//! ids (sessions, runs) come from schemathesis' stateful phase, which
//! follows what creating them returns.
//!
//! Installing schemathesis: the pinned version ([`SCHEMATHESIS`]) goes
//! into a venv under `target/` ([`CARGO_TARGET_TMPDIR`]), made with the
//! machine's Python (3.10 or later: `python3.11`, else `python3`, or
//! `CADRE_CONTRACT_PYTHON`) and PyPI on the first run and reused after.
//! If it cannot be installed the test fails: it never skips. Bounded for
//! CI: [`MAX_EXAMPLES`] examples per operation and phase, 3 s per request
//! (an event stream that does not end is read that long); the two runs
//! (in parallel) take 70 s on 2 cores, plus 20 s for the first install. `CADRE_CONTRACT_EXAMPLES` and
//! `CADRE_CONTRACT_SEED` change the bound and the seed for a longer or
//! different exploration.
//!
//! [`CARGO_TARGET_TMPDIR`]: https://doc.rust-lang.org/cargo/reference/environment-variables.html#environment-variables-cargo-sets-for-crates

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

use support::repo_agents;
use support::server::Server;

/// The one schemathesis version the contract is checked with.
const SCHEMATHESIS: &str = "4.32.5";

/// Examples per operation and phase (schemathesis `--max-examples`).
const MAX_EXAMPLES: u32 = 100;

/// A fixed seed: the same run each time, unless `CADRE_CONTRACT_SEED` says.
const SEED: u64 = 1913;

/// The schemathesis config: the exclusions (see the module doc) and the
/// dictionaries of names that exist.
const CONFIG: &str = r#"
[dictionaries.tools]
values = ["calculator", "echo", "get_price", "create_alert"]

[dictionaries.workflows]
values = ["market-brief", "account-review"]

[dictionaries.agents]
values = ["assistant", "analyst"]

[[operations]]
include-operation-id = ["show_tool", "invoke_tool", "validate_tool_params"]
parameters = { "path.name" = { dictionary = "tools", probability = 0.8 } }

[[operations]]
include-operation-id = "show_quota"
parameters = { "query.tool" = { dictionary = "tools", probability = 0.8 } }

[[operations]]
include-operation-id = ["show_workflow", "start_run"]
parameters = { "path.name" = { dictionary = "workflows", probability = 0.8 } }

[[operations]]
include-operation-id = ["create_session", "improve_text"]
parameters = { "body.agent" = { dictionary = "agents", probability = 0.8 } }

# A tool's or a workflow's own parameter schema is not in the document.
[[operations]]
include-operation-id = ["invoke_tool", "start_run"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# A key's `expires_at` must lie in the future and `admin` excludes `metrics`;
# a usage range is at most 366 days, `to` (default today) not before `from`:
# rules between a value and the clock, or between two fields, that the
# document states in words but not in its schema.
[[operations]]
include-operation-id = ["create_key", "show_usage"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "409", "422", "429", "5xx"]

# A tenant config's `guardrails` (issue #39): a `pattern` must compile as a
# Rust regex and a `schema` as a JSON Schema, names are unique in the list,
# and which fields go with which `kind` and `stage` are rules between
# fields: the document states them in words (docs/guardrails.md), and a
# config that breaks one is 422 naming the guardrail.
[[operations]]
include-operation-id = ["replace_tenant_config", "patch_tenant_config"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# A message's `response_format` schema must compile as a JSON Schema (a
# rule the document states in words); `stream_message` also takes an
# Idempotency-Key, as below.
[[operations]]
include-operation-id = "stream_message"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# A schedule names an agent, a workflow or a session that must exist, a
# cron expression that must parse and a time zone that must be known, and
# one of `cron` and `interval_s`: rules against the server's state and
# between fields, stated in words.
[[operations]]
include-operation-id = ["create_schedule", "update_schedule"]
parameters = { "body.agent" = { dictionary = "agents", probability = 0.8 } }
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# A memory item's value is at most 64 KiB of JSON, a bound the document
# states in words (a JSON Schema has no size of an object).
[[operations]]
include-operation-id = "put_memory_item"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# An Idempotency-Key sent again with another body is 422
# IDEMPOTENCY_KEY_REUSED: the key's earlier use is state, not schema (the
# other two keyed operations already take a 422 above).
[[operations]]
include-operation-id = ["create_session", "send_message", "decide_confirmation", "fork_session"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

# A WebSocket upgrade's success is 101.
[[operations]]
include-operation-id = "session_websocket"
checks.not_a_server_error.expected-statuses = ["101", "2xx", "3xx", "4xx"]
checks.positive_data_acceptance.expected-statuses = ["101", "2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
"#;

/// Server settings for a tester: its requests come faster than a client's,
/// and its checks of refused authentication send hundreds of wrong keys
/// from one address (which a server answers 429 past a small budget; the
/// tester's auth checks expect 401 each time).
const SERVER_ENV: [(&str, &str); 5] = [
    ("CADRE_API_LIMIT_PER_SECOND", "100000"),
    ("CADRE_API_LIMIT_BURST", "100000"),
    ("CADRE_API_LIMIT_FAILED_AUTH_BURST", "100000"),
    ("CADRE_API_LIMIT_FAILED_AUTH_PER_MINUTE", "100000"),
    ("RUST_LOG", "warn"),
];

#[test]
fn an_open_server_answers_as_its_document_says() {
    let schemathesis = schemathesis();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Server::start_offline_with(&data, &repo_agents(), &SERVER_ENV);
    run(&schemathesis, &server, dir.path(), None);
}

#[test]
fn a_keyed_server_answers_a_tenant_as_its_document_says() {
    let schemathesis = schemathesis();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(["keys", "create", "--tenant", "acme", "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .output()
        .expect("cadre keys create runs");
    assert!(out.status.success(), "keys create: {}", text(&out.stderr));
    let key = text(&out.stdout).trim().to_string();
    assert!(key.starts_with("cadre_"), "{key}");
    let server = Server::start_offline_with(&data, &repo_agents(), &SERVER_ENV);
    run(&schemathesis, &server, dir.path(), Some(&key));
}

/// Runs schemathesis against `server` (with `key` as the bearer) and fails
/// with its report unless every check passed.
fn run(schemathesis: &Path, server: &Server, scratch: &Path, key: Option<&str>) {
    let config = scratch.join("schemathesis.toml");
    std::fs::write(&config, CONFIG).expect("write the schemathesis config");
    let examples = setting("CADRE_CONTRACT_EXAMPLES", MAX_EXAMPLES.into());
    let seed = setting("CADRE_CONTRACT_SEED", SEED);
    let mut command = Command::new(schemathesis);
    command
        .current_dir(scratch)
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/openapi.json", server.base))
        .args(["--checks", "all"])
        .args(["--max-examples", &examples.to_string()])
        .args(["--seed", &seed.to_string()])
        .args(["--request-timeout", "3"])
        .args(["--generation-database", "none"])
        .args(["--no-color", "--output-truncate", "false"])
        .env_remove("SCHEMATHESIS_HOOKS");
    match key {
        Some(key) => {
            command.args(["--header", &format!("Authorization: Bearer {key}")]);
        }
        // Creating a key ends open mode; an admin's erase would take every
        // session of the run (see the module doc).
        None => {
            command.args(["--exclude-operation-id", "create_key"]);
            command.args(["--exclude-operation-id", "erase_tenant_sessions"]);
        }
    }
    let started = Instant::now();
    let out = command.output().expect("schemathesis runs");
    let report = text(&out.stdout);
    eprintln!(
        "schemathesis ({} mode) took {:.0?}",
        if key.is_some() { "keyed" } else { "open" },
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "schemathesis found a mismatch between /openapi.json and the server:\n{report}\n{}\nserver log:\n{}",
        text(&out.stderr),
        server.log_tail()
    );
    assert!(
        report.contains("passed") && !report.contains("Tested: 0"),
        "schemathesis tested nothing:\n{report}"
    );
}

/// The pinned schemathesis, installed once per target dir (and once per
/// process: both tests wait for the same install).
fn schemathesis() -> PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("schemathesis-{SCHEMATHESIS}"));
    let bin = venv.join("bin").join("schemathesis");
    if installed(&bin) {
        return bin;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let python = support::clients::system_python("CADRE_CONTRACT_PYTHON");
    let started = Instant::now();
    must(
        Command::new(&python).arg("-m").arg("venv").arg(&venv),
        "create a venv",
    );
    must(
        Command::new(venv.join("bin").join("python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("schemathesis=={SCHEMATHESIS}"),
        ]),
        "pip install schemathesis (PyPI must be reachable)",
    );
    assert!(
        installed(&bin),
        "schemathesis {SCHEMATHESIS} did not install"
    );
    eprintln!(
        "installed schemathesis {SCHEMATHESIS} in {:.0?}",
        started.elapsed()
    );
    bin
}

fn installed(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success() && text(&out.stdout).contains(SCHEMATHESIS))
}

fn must(command: &mut Command, what: &str) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number: {v}")),
        Err(_) => default,
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
