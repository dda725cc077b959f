//! The documentation is checked like code: `README.md` and every page of
//! `docs/` (#20).
//!
//! - **Links.** Every relative link (`[text](path)`, `[text](path#anchor)`,
//!   `[text](#anchor)`) outside code names an existing file, and an
//!   `#anchor` names a heading of its target, slugged as GitHub does
//!   (lowercase, spaces to `-`, punctuation other than `-` and `_` dropped,
//!   `-1`, `-2`... for repeated headings). Every `docs/` page is linked from
//!   the README.
//! - **TOML.** A fenced `toml` block with a `[section]` line naming a
//!   section of `ServerConfig` (`[concurrency]`, `[server]`, ...) is a
//!   server config: it is written to a temp file and must load with
//!   `ServerConfig::load`, as `serve` loads `--config`. Otherwise one with
//!   `[servers.*]` or `[limits]` is an `mcp.toml` and must parse as cadre
//!   reads one (any value standing in for `${VAR}`s), and one with a
//!   top-level `name = ` is an agent file and must parse as one. Any other
//!   `toml` block fails the test unless it is marked skipped.
//! - **Commands.** Every fenced `sh` block is cut into commands (comment
//!   lines and trailing `# comments` dropped, `\` continuations joined),
//!   and each command is decided on its own by this rule:
//!   1. `cadre ...` or `cargo run [--release] -- ...` (the binary) is
//!      **offline** and must exit 0 when run with the real binary
//!      (`CARGO_BIN_EXE_cadre`) through `bash`, cwd the repository root,
//!      stdin closed, a fresh temp data dir per block (`CADRE_DATA_DIR`,
//!      and in place of any `--data-dir` the command names), no model
//!      endpoint, key or server URL in the environment, and a trailing
//!      `> file` redirection dropped (stdout is captured, nothing is
//!      written outside the temp dir). Not run: a synopsis (`<placeholder>`,
//!      `a|b` alternatives, `[optional]` parts or `$VARIABLES` outside
//!      quotes), `serve` (the test's own server stands in for it) and a
//!      command with `--url` (it is served, below).
//!   2. A command using `curl` (or the binary with `--url`) is **served**:
//!      the block's served commands run as one `bash` script (so `ID=$(...)`
//!      carries on to the next line), `set -euo pipefail`, `curl` made to
//!      fail on an HTTP error status (`--fail-with-body`; `jq`, when the
//!      machine has none, played by Python for `jq` and `jq -r .x`), against a real
//!      `cadre serve` this test starts on the repository's agents with the
//!      offline provider (`Server::start_offline`): `localhost:8080` and
//!      `127.0.0.1:8080` become its address, as a reader's port would.
//!      Not run: a command with a `<placeholder>` or a `$VARIABLE` the block
//!      does not assign (values the reader brings: a key, a run id).
//!   3. Anything else (`cargo test`, `cargo build`, `cargo bench`,
//!      `export ...`, a built binary's path) is not run, and neither is
//!      any command after an `export` in its block (it relies on a setting
//!      the reader makes, e.g. `CADRE_URL` and a key).
//!
//! Any block (`toml` or `sh`) is skipped when the line before its fence
//! (blank lines aside) is `<!-- docs-test: skip (reason) -->`; the tests
//! print what they ran, what they skipped and why. The README's "A session
//! with curl" block must run as written.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cadre::server_config::ServerConfig;
use support::repo_agents;
use support::server::Server;

/// The sections of `ServerConfig` (`src/server_config.rs`).
const SERVER_SECTIONS: [&str; 10] = [
    "cluster",
    "memory",
    "concurrency",
    "api_limit",
    "executor",
    "tools",
    "sessions",
    "workflows",
    "server",
    "model",
];

const SKIP_MARKER: &str = "<!-- docs-test: skip";

/// For a machine without `jq`: the two forms the docs use (`jq` and
/// `jq -r .field`), with the Python the suite needs anyway.
const JQ_FALLBACK: &str = r#"if ! command -v jq >/dev/null; then
  jq() {
    if [ "${1:-}" = -r ]; then
      python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1].lstrip(".")])' "$2"
    elif [[ "${1:-}" =~ ^\.[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)[sys.argv[1].lstrip(".")], indent=2))' "$1"
    else
      python3 -m json.tool
    fi
  }
fi
"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every `docs/*.md`, relative to the repository root.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    assert!(docs.len() >= 10, "docs/ lost pages: {docs:?}");
    pages.extend(docs);
    pages
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("read {page:?}: {e}"))
}

/// A fenced block of a page.
struct Block {
    page: PathBuf,
    /// 1-based line of the opening fence.
    line: usize,
    tag: String,
    body: String,
    /// The reason of a `docs-test: skip` marker before the fence.
    skip: Option<String>,
}

impl Block {
    fn place(&self) -> String {
        format!("{}:{}", self.page.display(), self.line)
    }
}

fn blocks(page: &Path) -> Vec<Block> {
    blocks_of(page, &read(page))
}

fn blocks_of(page: &Path, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(tag) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && !lines[i].starts_with("```") {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        i += 1;
        let skip = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix(SKIP_MARKER))
            .map(|r| r.trim_end_matches("-->").trim().to_string());
        out.push(Block {
            page: page.to_path_buf(),
            line: start + 1,
            tag: tag.trim().to_string(),
            body,
            skip,
        });
    }
    out
}

/// The page's text outside fenced blocks.
fn prose(page: &Path) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in read(page).lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((n + 1, line.to_string()));
        }
    }
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, repeated ones numbered as GitHub does.
fn anchors(page: &Path) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(page) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links on a line, inline code left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut plain = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            plain.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_names_an_existing_file_and_heading() {
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut linked_from_readme = BTreeSet::new();
    for page in pages() {
        let dir = page.parent().unwrap_or(Path::new(""));
        for (n, line) in prose(&page) {
            for target in link_targets(&line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    normalise(&dir.join(path))
                };
                if page == Path::new("README.md") {
                    linked_from_readme.insert(file.clone());
                }
                if !root().join(&file).exists() {
                    problems.push(format!(
                        "{}:{n}: {target}: no file {}",
                        page.display(),
                        file.display()
                    ));
                    continue;
                }
                if let Some(anchor) = anchor
                    && !anchors(&file).contains(anchor)
                {
                    problems.push(format!(
                        "{}:{n}: {target}: no heading #{anchor} in {} (it has {:?})",
                        page.display(),
                        file.display(),
                        anchors(&file)
                    ));
                }
            }
        }
    }
    for page in pages().into_iter().skip(1) {
        if !linked_from_readme.contains(&page) {
            problems.push(format!("{} is not linked from the README", page.display()));
        }
    }
    println!("{checked} relative links checked");
    assert!(checked >= 20, "only {checked} relative links found");
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// `docs/../README.md` → `README.md`.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What a `toml` block is, by its lines.
#[derive(Debug, PartialEq)]
enum TomlKind {
    /// A `[section]` of `ServerConfig`.
    ServerConfig,
    /// `[servers.*]` or `[limits]`: an `mcp.toml`.
    Mcp,
    /// A top-level `name = ...`: an agent file.
    Agent,
    Unknown,
}

fn toml_kind(body: &str) -> TomlKind {
    let sections: Vec<&str> = body
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix('['))
        .filter_map(|l| l.split(']').next())
        .map(str::trim)
        .collect();
    if sections.iter().any(|s| SERVER_SECTIONS.contains(s)) {
        TomlKind::ServerConfig
    } else if sections
        .iter()
        .any(|s| s.starts_with("servers.") || *s == "limits")
    {
        TomlKind::Mcp
    } else if body.lines().any(|l| l.starts_with("name = ")) {
        TomlKind::Agent
    } else {
        TomlKind::Unknown
    }
}

#[test]
fn every_toml_block_loads_as_what_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let (mut loaded, mut skipped) = (Vec::new(), Vec::new());
    let mut problems = Vec::new();
    for page in pages() {
        for block in blocks(&page).into_iter().filter(|b| b.tag == "toml") {
            if let Some(reason) = &block.skip {
                skipped.push(format!("{} {reason}", block.place()));
                continue;
            }
            let kind = toml_kind(&block.body);
            let file = dir.path().join(format!("block{}.toml", loaded.len()));
            std::fs::write(&file, &block.body).unwrap();
            let result = match kind {
                TomlKind::ServerConfig => ServerConfig::load(Some(&file), std::iter::empty())
                    .map(drop)
                    .map_err(|e| e.to_string()),
                // `${VAR}`s are the reader's: any value stands in.
                TomlKind::Mcp => {
                    cadre::mcp::config::parse(&file, &block.body, &|_| Some("x".to_string()))
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
                TomlKind::Agent => cadre::agents::AgentFile::parse(&file, &block.body)
                    .map(drop)
                    .map_err(|e| e.to_string()),
                TomlKind::Unknown => Err("neither a server config, an mcp.toml nor an agent \
                                          file: mark it `<!-- docs-test: skip (why) -->`"
                    .to_string()),
            };
            if let Err(e) = result {
                problems.push(format!("{} ({kind:?}): {e}", block.place()));
            }
            loaded.push(format!("{} ({kind:?})", block.place()));
        }
    }
    println!("toml blocks loaded: {loaded:?}");
    println!("toml blocks skipped ({}): {skipped:?}", skipped.len());
    assert!(
        loaded
            .iter()
            .any(|p| p.starts_with("docs/configuration.md") && p.ends_with("(ServerConfig)")),
        "the server config of docs/configuration.md was not loaded: {loaded:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// One command of a `sh` block.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Offline,
    Served,
    NotRun(&'static str),
}

/// The commands of a `sh` block: comments dropped, continuations joined.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let line = strip_comment(line);
        let line = line.trim_end();
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        if !current.trim().is_empty() {
            out.push(current.trim().to_string());
        }
        current.clear();
    }
    out
}

/// The line with a trailing `# comment` outside quotes removed.
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    line.to_string()
}

/// The characters of a command outside quotes.
fn unquoted(command: &str) -> String {
    let mut quote = None;
    let mut out = String::new();
    for c in command.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, c) => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whether the command holds a `<placeholder>` (in quotes or not).
fn has_placeholder(command: &str) -> bool {
    command.match_indices('<').any(|(i, _)| {
        let rest = &command[i + 1..];
        rest.starts_with(|c: char| c.is_ascii_lowercase())
            && rest.find('>').is_some_and(|end| {
                rest[..end]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == ' ' || c == '-')
            })
    })
}

/// The `$NAME`s a command reads (`$NAME` and `${NAME}`).
fn variables(command: &str) -> Vec<String> {
    command
        .match_indices('$')
        .filter_map(|(i, _)| {
            let rest = command[i + 1..].trim_start_matches('{');
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit())).then_some(name)
        })
        .collect()
}

/// The command with the binary in place of `cadre` / `cargo run ... --`,
/// or None when it does not run the binary.
fn binary_command(command: &str) -> Option<String> {
    let bin = format!("'{}'", env!("CARGO_BIN_EXE_cadre"));
    let rest = if let Some(rest) = command.strip_prefix("cadre ") {
        rest
    } else if let Some(rest) = command.strip_prefix("cargo run ") {
        let (flags, rest) = rest.split_once("-- ")?;
        if !flags.split_whitespace().all(|f| f == "--release") {
            return None;
        }
        rest
    } else {
        return None;
    };
    Some(format!("{bin} {rest}"))
}

fn classify(command: &str, assigned: &BTreeSet<String>) -> Kind {
    let outside = unquoted(command);
    if command.contains("curl ") || outside.contains("--url") {
        if has_placeholder(command) {
            return Kind::NotRun("a <placeholder> the reader fills in");
        }
        if variables(command).iter().any(|v| !assigned.contains(v)) {
            return Kind::NotRun("a $VARIABLE the block does not set");
        }
        return Kind::Served;
    }
    let Some(run) = binary_command(command) else {
        return Kind::NotRun("not the cadre binary");
    };
    let args = run.split_once(' ').map(|(_, a)| a).unwrap_or("");
    if args.split_whitespace().next() == Some("serve") {
        return Kind::NotRun("serve: the test's own server stands in for it");
    }
    let synopsis_part = outside.split(" > ").next().unwrap_or("");
    if has_placeholder(command)
        || synopsis_part.contains('|')
        || synopsis_part.contains('[')
        || synopsis_part.contains('$')
    {
        return Kind::NotRun("a synopsis (<placeholder>, a|b or [optional])");
    }
    Kind::Offline
}

/// Every `sh` command of the docs with its kind, by block.
fn sh_blocks() -> Vec<(Block, Vec<(String, Kind)>)> {
    let mut out = Vec::new();
    for page in pages() {
        for block in blocks(&page).into_iter().filter(|b| b.tag == "sh") {
            let commands = commands(&block.body);
            let assigned: BTreeSet<String> = commands
                .iter()
                .filter_map(|c| c.split_once('=').map(|(name, _)| name.to_string()))
                .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            let mut exported = false;
            let kinds = commands
                .into_iter()
                .map(|c| {
                    let kind = if exported {
                        Kind::NotRun("after an `export` the test does not run")
                    } else {
                        classify(&c, &assigned)
                    };
                    exported |= c.starts_with("export ");
                    (c, kind)
                })
                .collect();
            out.push((block, kinds));
        }
    }
    out
}

/// Runs `script` with `bash`, cwd the repository root, stdin closed, no
/// model endpoint, key or server in the environment; killed after 60 s.
fn bash(script: &str, data_dir: &Path) -> Output {
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .current_dir(root())
        .env("CADRE_DATA_DIR", data_dir)
        .env("RUST_LOG", "warn");
    for var in [
        "CADRE_URL",
        "CADRE_API_KEY",
        "CADRE_CONFIG",
        "CADRE_AGENTS_DIR",
        "OPENAI_API_KEY",
        "CADRE_MODEL_BASE_URL",
        "CADRE_MODEL_API_KEY",
        "CADRE_MODEL",
    ] {
        command.env_remove(var);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if waited.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to the process group of our own child.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("bash ends");
    let _ = done.send(());
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The offline form of an offline command: the binary, the temp data dir
/// for any `--data-dir`, no trailing `> file`.
fn offline_script(command: &str, data_dir: &Path) -> String {
    let run = binary_command(command).expect("an offline command runs the binary");
    let run = match run.rfind(" > ") {
        Some(at) if !run[at..].contains(['\'', '"']) => run[..at].to_string(),
        _ => run,
    };
    let words: Vec<&str> = run.split(' ').collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        out.push(words[i].to_string());
        if words[i] == "--data-dir" && i + 1 < words.len() {
            out.push(format!("'{}'", data_dir.display()));
            i += 1;
        }
        i += 1;
    }
    out.join(" ")
}

#[test]
fn every_offline_command_of_the_docs_exits_0() {
    let mut ran = Vec::new();
    let mut not_run = Vec::new();
    let mut failed = Vec::new();
    for (block, kinds) in sh_blocks() {
        if let Some(reason) = &block.skip {
            not_run.push(format!("{} (block skipped: {reason})", block.place()));
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        for (command, kind) in kinds {
            match kind {
                Kind::Offline => {
                    let script = offline_script(&command, &data);
                    let out = bash(&script, &data);
                    if !out.status.success() {
                        failed.push(format!(
                            "{}: `{command}` exited {:?}\nstdout: {}\nstderr: {}",
                            block.place(),
                            out.status,
                            text(&out.stdout),
                            text(&out.stderr)
                        ));
                    }
                    ran.push(format!("{}: {command}", block.place()));
                }
                Kind::Served => {}
                Kind::NotRun(why) => not_run.push(format!("{}: {command} ({why})", block.place())),
            }
        }
    }
    println!(
        "offline commands run ({}):\n  {}",
        ran.len(),
        ran.join("\n  ")
    );
    println!(
        "commands not run ({}):\n  {}",
        not_run.len(),
        not_run.join("\n  ")
    );
    for expected in [
        "config check examples/cadre.toml",
        "tools check",
        "tools list",
        "tools invoke calculator",
        "keys create",
        "completions bash",
        "mcp --plan pro",
    ] {
        assert!(
            ran.iter().any(|r| r.contains(expected)),
            "no offline command `{expected}` ran: the rule or the docs changed"
        );
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The docs' curl commands need curl: on a machine without it (a fresh CI
/// machine runs as root with Debian's packages reachable) it is installed,
/// as the suite installs what else it needs; if that fails the test fails,
/// it is never skipped.
fn ensure_curl() {
    support::packages::ensure_installed("curl", "curl");
}

#[test]
fn the_served_blocks_run_against_a_real_server() {
    ensure_curl();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_offline(&data, &repo_agents());
    let address = server.base.trim_start_matches("http://").to_string();
    let mut ran = Vec::new();
    let mut failed = Vec::new();
    let mut readme_session = None;
    let mut readme_typed = None;
    for (block, kinds) in sh_blocks() {
        if block.skip.is_some() {
            continue;
        }
        let served: Vec<String> = kinds
            .into_iter()
            .filter(|(_, k)| *k == Kind::Served)
            .map(|(c, _)| {
                let c = c
                    .replace("localhost:8080", &address)
                    .replace("127.0.0.1:8080", &address);
                binary_command(&c).unwrap_or(c)
            })
            .collect();
        if served.is_empty() {
            continue;
        }
        let script = format!(
            "set -euo pipefail\ncurl() {{ command curl --fail-with-body \"$@\"; }}\n{JQ_FALLBACK}{}\n",
            served.join("\n")
        );
        let out = bash(&script, &data);
        if !out.status.success() {
            failed.push(format!(
                "{}: exited {:?}\nscript:\n{script}\nstdout: {}\nstderr: {}",
                block.place(),
                out.status,
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
        if block.page == Path::new("README.md") && block.body.contains("/v1/sessions") {
            // The first is "A session with curl"; the typed answer's follows.
            if readme_session.is_none() {
                readme_session = Some(text(&out.stdout));
            } else if block.body.contains("\"agent\":\"quote\"") {
                readme_typed = Some(text(&out.stdout));
            }
        }
        ran.push(format!("{} ({} commands)", block.place(), served.len()));
    }
    println!("served blocks run against {address}: {ran:?}");
    assert!(
        failed.is_empty(),
        "{}\nserver log:\n{}",
        failed.join("\n\n"),
        server.log_tail()
    );
    let session = readme_session.expect("the README's \"A session with curl\" block ran");
    assert!(
        session.contains("(2+3)*4 = 20") && session.contains("\"calculator\""),
        "the README's session did not answer as it shows:\n{session}"
    );
    let typed = readme_typed.expect("the README's typed answer block ran");
    let output: serde_json::Value =
        serde_json::from_str(&typed).expect("the typed answer block prints the output as JSON");
    assert_eq!(output["symbol"], "AAPL", "{typed}");
    assert_eq!(
        output["sources"],
        serde_json::json!(["tool:price:v1"]),
        "{typed}"
    );
}

/// The rule of the header, on commands of each kind.
#[test]
fn the_rule_decides_as_documented() {
    let none = BTreeSet::new();
    let not_run =
        |c: &str, assigned: &BTreeSet<String>| matches!(classify(c, assigned), Kind::NotRun(_));
    assert_eq!(classify("cadre tools list", &none), Kind::Offline);
    assert_eq!(
        classify("cargo run -- config check examples/cadre.toml", &none),
        Kind::Offline
    );
    assert_eq!(
        classify("cadre completions bash > ~/.bash_completion", &none),
        Kind::Offline
    );
    assert!(not_run("cargo run --release -- serve", &none));
    assert!(not_run("cadre sessions list|show <id>", &none));
    assert!(not_run("cadre chat [--session <id>]", &none));
    assert!(not_run("cargo test --locked", &none));
    assert!(not_run("export CADRE_URL=http://127.0.0.1:8080", &none));
    assert_eq!(
        classify("curl -s localhost:8080/healthz", &none),
        Kind::Served
    );
    assert!(not_run("curl -s localhost:8080/v1/sessions/$ID", &none));
    let id = BTreeSet::from(["ID".to_string()]);
    assert_eq!(
        classify("curl -s localhost:8080/v1/sessions/$ID | jq", &id),
        Kind::Served
    );
    assert!(not_run(
        "curl -s \"localhost:8080/v1/calls?id=<run id>\"",
        &id
    ));
    assert_eq!(
        classify("cadre keys list --url http://127.0.0.1:8080", &none),
        Kind::Served
    );
    assert_eq!(
        commands("a \\\n  b  # c\n# d\n\ne '#f'\n"),
        vec!["a    b".to_string(), "e '#f'".to_string()]
    );
    let marked = "x\n<!-- docs-test: skip (partial) -->\n\n```toml\n[server]\n```\n";
    let blocks = blocks_of(Path::new("p.md"), marked);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].skip.as_deref(), Some("(partial)"));
    assert_eq!(blocks[0].line, 4);
    assert_eq!(slug("HTTP API (v1)"), "http-api-v1");
    assert_eq!(
        slug("Security: hostile models, MCP servers and tool upstreams"),
        "security-hostile-models-mcp-servers-and-tool-upstreams"
    );
    assert_eq!(
        slug("server.json, Ctrl-C and config check"),
        "serverjson-ctrl-c-and-config-check"
    );
}

/// Issue #38: one cargo profile throughout the docs, so trying the CLI
/// after the quick start (`cargo run --release -- serve`) does not pay a
/// second full build of another profile.
#[test]
fn the_docs_run_the_binary_with_one_cargo_profile() {
    let mut wrong = Vec::new();
    for page in pages() {
        for (n, line) in read(&page).lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("cargo run") {
                let after = &rest[at + "cargo run".len()..];
                if !after.trim_start().starts_with("--release") {
                    wrong.push(format!("{}:{}: {line}", page.display(), n + 1));
                }
                rest = after;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "`cargo run` without --release (the quick start's profile):\n{}",
        wrong.join("\n")
    );
}

/// Issue #38: the reply the README shows for "What is (2+3)*4?" is what
/// cadre answers, field for field (its `…` stands for a generated id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_example_reply_is_what_cadre_answers() {
    let readme = read(Path::new("README.md"));
    let start = readme
        .find("# {\"turn_id\"")
        .expect("the README shows the reply of its first turn");
    let shown: String = readme[start..]
        .lines()
        .take_while(|l| l.starts_with("# {") || l.starts_with("#  "))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    let mut shown: serde_json::Value =
        serde_json::from_str(&shown).unwrap_or_else(|e| panic!("{e}: {shown}"));

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let client = server.client();
    let (status, session) = client
        .post("/v1/sessions", &serde_json::json!({"agent": "assistant"}))
        .await;
    assert!(status.is_success(), "{session}");
    let id = session["id"].as_str().unwrap();
    let (status, reply) = client
        .post(
            &format!("/v1/sessions/{id}/messages"),
            &serde_json::json!({"content": "What is (2+3)*4?"}),
        )
        .await;
    assert!(status.is_success(), "{reply}");
    assert_eq!(shown["turn_id"], "…");
    shown["turn_id"] = reply["turn_id"].clone();
    // Each call names its record (its `record_id` in `GET /v1/calls`):
    // generated too.
    let calls = shown["tool_calls"].as_array_mut().unwrap();
    for (i, call) in calls.iter_mut().enumerate() {
        assert_eq!(call["record_id"], "…", "{call}");
        call["record_id"] = reply["tool_calls"][i]["record_id"].clone();
        assert!(call["record_id"].is_string(), "{reply}");
    }
    assert_eq!(shown, reply, "README.md's reply drifted from cadre's");
}

#[test]
fn the_shipped_assistant_is_the_one_docs_agents_md_shows() {
    let page = Path::new("docs/agents.md");
    let block = blocks(page)
        .into_iter()
        .find(|b| b.tag == "toml" && b.body.contains("name = \"assistant\""))
        .expect("docs/agents.md shows the shipped assistant's file");
    let file = root().join("agents/assistant.toml");
    let shown = cadre::agents::AgentFile::parse(&file, &block.body).expect("the block loads");
    let shipped = cadre::agents::AgentFile::parse(&file, &read(Path::new("agents/assistant.toml")))
        .expect("the shipped file loads");
    assert_eq!(
        (
            &shown.name,
            &shown.description,
            &shown.tools,
            shown.max_iterations,
            shown.history_window
        ),
        (
            &shipped.name,
            &shipped.description,
            &shipped.tools,
            shipped.max_iterations,
            shipped.history_window
        ),
        "{}: the block drifted from agents/assistant.toml",
        block.place()
    );
    let intro: String = read(page).lines().take(4).collect::<Vec<_>>().join(" ");
    for tool in &shipped.tools {
        assert!(
            intro.contains(&format!("`{tool}`")),
            "docs/agents.md's first lines do not name the assistant's tool {tool}: {intro}"
        );
    }
}

#[test]
fn docs_layout_md_names_every_module_of_src() {
    let layout = read(Path::new("docs/layout.md"));
    let named: BTreeSet<&str> = layout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("src/"))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("src")).expect("read src/") {
        let path = entry.expect("a src/ entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let shown = if path.is_dir() {
            format!("src/{name}/")
        } else {
            format!("src/{name}")
        };
        if !named.contains(shown.as_str()) {
            missing.push(shown);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/layout.md does not name {missing:?}"
    );
    for path in &named {
        assert!(
            root().join(path).exists(),
            "docs/layout.md names {path}, which does not exist"
        );
    }
}
