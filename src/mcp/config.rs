//! `agents/mcp.toml`: the MCP servers whose tools cadre offers.
//!
//! file ──parse (deny unknown keys; file and line on error)──▶ [`McpServerSpec`] per server
//!      ──check (one transport, valid names, `${VAR}` expanded)──▶ [`McpServerConfig`]
//!
//! ```toml
//! [servers.files]                      # tools become `files.<tool>`
//! command = "mcp-server-filesystem"    # stdio: a child process
//! args = ["/srv/data"]
//! env = { LOG_LEVEL = "warn" }
//!
//! [servers.search]                     # streamable HTTP
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = "Bearer ${SEARCH_TOKEN}" }
//! required_plan = "pro"                # applies to every tool of the server
//! category = "mcp"                     # concurrency bucket (default "mcp")
//! timeout_s = 30
//! rate_limit = { per_minute = 60 }
//! cache_ttl_s = 0                      # default: not cached
//! ```
//! No file means no MCP servers. `${VAR}` in `env` and `headers` values is
//! replaced by the environment variable, so secrets stay out of the file; a
//! missing variable is an error naming it (never its value).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::tools::{Plan, RateLimit};

pub use crate::config::MCP_FILE_NAME as FILE_NAME;
pub const DEFAULT_CATEGORY: &str = "mcp";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct McpFile {
    #[serde(default)]
    servers: BTreeMap<String, McpServerSpec>,
}

/// One server as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub required_plan: Plan,
    pub category: Option<String>,
    pub timeout_s: Option<f64>,
    #[serde(default)]
    pub rate_limit: RateLimit,
    pub cache_ttl_s: Option<u64>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

/// How cadre reaches a server.
#[derive(Debug, Clone, PartialEq)]
pub enum McpTransport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// A checked server declaration.
#[derive(Debug, Clone)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: McpTransport,
    pub required_plan: Plan,
    pub category: String,
    pub timeout: Option<Duration>,
    pub rate_limit: RateLimit,
    pub cache_ttl_s: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct McpConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

/// Server names are the prefix of their tools' names: letters, digits,
/// `_` and `-`, at most 32.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Reads `agents_dir/mcp.toml`; no file: no servers. Disabled servers are left out.
pub fn load(agents_dir: &Path) -> Result<Vec<McpServerConfig>, McpConfigError> {
    let path = agents_dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&path, &text, &|k| std::env::var(k).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(McpConfigError {
            file: path,
            line: None,
            message: format!("cannot read: {e}"),
        }),
    }
}

pub fn parse(
    path: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<McpServerConfig>, McpConfigError> {
    let err = |line: Option<usize>, message: String| McpConfigError {
        file: path.to_path_buf(),
        line,
        message,
    };
    let file: McpFile = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        err(line, e.message().to_string())
    })?;
    let mut out = Vec::new();
    for (name, spec) in file.servers {
        let fail = |m: String| err(None, format!("server '{name}': {m}"));
        if !valid_server_name(&name) {
            return Err(fail(
                "use 1-32 letters, digits, '_' or '-' for a server name".into(),
            ));
        }
        if !spec.enabled {
            continue;
        }
        let transport = match (&spec.command, &spec.url) {
            (Some(command), None) if !command.is_empty() => {
                if !spec.headers.is_empty() {
                    return Err(fail("`headers` belong to a `url` server".into()));
                }
                McpTransport::Stdio {
                    command: command.clone(),
                    args: spec.args.clone(),
                    env: expand_all(&spec.env, env).map_err(fail)?,
                }
            }
            (None, Some(url)) => {
                if !spec.args.is_empty() || !spec.env.is_empty() {
                    return Err(fail("`args` and `env` belong to a `command` server".into()));
                }
                let parsed = url::Url::parse(url).map_err(|e| fail(format!("url: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(fail("url must be http or https".into()));
                }
                McpTransport::Http {
                    url: url.clone(),
                    headers: expand_all(&spec.headers, env).map_err(fail)?,
                }
            }
            _ => {
                return Err(fail(
                    "needs exactly one of `command` (stdio) or `url` (streamable HTTP)".into(),
                ));
            }
        };
        if let Some(t) = spec.timeout_s
            && !(t > 0.0 && t <= 3600.0)
        {
            return Err(fail("timeout_s must be in (0, 3600]".into()));
        }
        let category = spec
            .category
            .clone()
            .unwrap_or_else(|| DEFAULT_CATEGORY.into());
        out.push(McpServerConfig {
            name,
            transport,
            required_plan: spec.required_plan,
            category,
            timeout: spec.timeout_s.map(Duration::from_secs_f64),
            rate_limit: spec.rate_limit,
            cache_ttl_s: spec.cache_ttl_s,
        });
    }
    Ok(out)
}

fn expand_all(
    values: &BTreeMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, String> {
    values
        .iter()
        .map(|(k, v)| Ok((k.clone(), expand(v, env)?)))
        .collect()
}

/// Replaces each `${VAR}` with the variable's value.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed '${{' in {value:?}"))?;
        let var = &after[..end];
        out.push_str(&env(var).ok_or_else(|| format!("environment variable {var} is not set"))?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn both_transports_parse_and_variables_expand() {
        let text = r#"
[servers.files]
command = "srv"
args = ["-v"]
env = { A = "x-${TOKEN}" }

[servers.web]
url = "http://127.0.0.1:9/mcp"
headers = { Authorization = "Bearer ${TOKEN}" }
required_plan = "pro"
timeout_s = 5

[servers.off]
command = "nothing"
enabled = false
"#;
        let servers = parse(Path::new("mcp.toml"), text, &env).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "files");
        assert_eq!(servers[0].category, "mcp");
        let McpTransport::Stdio { env: e, .. } = &servers[0].transport else {
            panic!("stdio expected")
        };
        assert_eq!(e["A"], "x-s3cret");
        let McpTransport::Http { headers, .. } = &servers[1].transport else {
            panic!("http expected")
        };
        assert_eq!(headers["Authorization"], "Bearer s3cret");
        assert_eq!(servers[1].required_plan, Plan::Pro);
    }

    #[test]
    fn mistakes_are_named() {
        let bad = [
            ("[servers.x]\nargs = []\n", "exactly one of"),
            (
                "[servers.x]\ncommand = \"a\"\nurl = \"http://h\"\n",
                "exactly one of",
            ),
            ("[servers.\"a.b\"]\ncommand = \"a\"\n", "server name"),
            ("[servers.x]\nurl = \"ftp://h\"\n", "http or https"),
            ("[servers.x]\ncommand = \"a\"\nbogus = 1\n", "bogus"),
            (
                "[servers.x]\nurl = \"http://h\"\nheaders = { A = \"${NOPE}\" }\n",
                "NOPE is not set",
            ),
        ];
        for (text, needle) in bad {
            let e = parse(Path::new("mcp.toml"), text, &env).unwrap_err();
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
    }
}
