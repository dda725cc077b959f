//! `agents/mcp.toml`: the MCP servers whose tools cadre offers.
//!
//! Read once, at startup ([`load`]). Decision: no hot reload of this file
//! (servers added, removed or changed would start, stop or reconnect child
//! processes under running turns); the runtime's rescan pass logs an info
//! line when the file changed, saying a restart applies it, and
//! `docs/mcp.md` says so.
//!
//! file ──parse (deny unknown keys; file and line on error)──▶ [`McpServerSpec`] per server
//!      ──check (one transport, valid names, `${VAR}` expanded)──▶ [`McpServerConfig`]
//!
//! ```toml
//! [servers.files]                      # tools become `files.<tool>`
//! command = "mcp-server-filesystem"    # stdio: a child process
//! args = ["/srv/data"]
//! env = { LOG_LEVEL = "warn" }
//! network = false                      # its sandbox: no network unless true
//! paths = [{ path = "/srv/data", write = false }]  # beside the sandbox's view
//! sandbox_limits = { cpu_s = 0 }       # keys of [tools] sandbox_limits
//!
//! [servers.search]                     # streamable HTTP
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = "Bearer ${SEARCH_TOKEN}" }
//! required_plan = "pro"                # applies to every tool of the server
//! category = "mcp"                     # concurrency bucket (default "mcp")
//! timeout_s = 30
//! rate_limit = { per_minute = 60 }
//! cache_ttl_s = 0                      # default: not cached
//! max_tools = 50                       # any key of [limits], for this server only
//! side_effects = "idempotent"          # every tool of the server (none | idempotent | at_most_once)
//!
//! [servers.search.tool_side_effects]   # per tool, over the server's
//! lookup = "none"
//!
//! [limits]                             # every server's bounds (these are the defaults)
//! max_pages = 100                      # tools/list pages; more: refused
//! max_tools = 1000                     # tools listed; more: refused
//! warn_tools = 128                     # a WARN at registration above this many tools
//! warn_schema_kb = 256                 # ... or above this much inputSchema JSON
//! init_timeout_s = 30                  # deadline of `initialize`
//! list_timeout_s = 30                  # deadline of a whole tools/list (every page)
//! max_message_mb = 16                  # one stdio message, and a whole listing; a bigger result: "result too large"
//! relist_interval_s = 2                # at most one tools/list per interval on list_changed
//! ```
//! `side_effects` says whether a call may run again (a resumed turn): a
//! tool's entry in `tool_side_effects` wins, then the server's
//! `side_effects`, then the tool's own MCP annotations (`readOnlyHint`:
//! `none`, `idempotentHint`: `idempotent`), then `at_most_once`. A
//! `tool_side_effects` entry names the server's own tool name.
//! No file means no MCP servers. `${VAR}` in `env` and `headers` values is
//! replaced by the environment variable, so secrets stay out of the file; a
//! missing variable is an error naming it (never its value).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::tools::sandbox::{LimitsOverride, PathGrant, check_grants};
use crate::tools::{Plan, RateLimit, SideEffects};

pub use crate::agents::MCP_FILE_NAME as FILE_NAME;
pub const DEFAULT_CATEGORY: &str = "mcp";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct McpFile {
    #[serde(default)]
    limits: LimitsSpec,
    #[serde(default)]
    servers: BTreeMap<String, McpServerSpec>,
}

/// The bounds on what a server may send, as written: in `[limits]` for
/// every server, and the same keys in a server's table for that server.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    pub max_pages: Option<usize>,
    pub max_tools: Option<usize>,
    pub warn_tools: Option<usize>,
    pub warn_schema_kb: Option<usize>,
    pub init_timeout_s: Option<f64>,
    pub list_timeout_s: Option<f64>,
    pub max_message_mb: Option<f64>,
    pub relist_interval_s: Option<f64>,
}

impl LimitsSpec {
    /// `self`'s keys where set, `under`'s elsewhere.
    fn over(self, under: LimitsSpec) -> LimitsSpec {
        LimitsSpec {
            max_pages: self.max_pages.or(under.max_pages),
            max_tools: self.max_tools.or(under.max_tools),
            warn_tools: self.warn_tools.or(under.warn_tools),
            warn_schema_kb: self.warn_schema_kb.or(under.warn_schema_kb),
            init_timeout_s: self.init_timeout_s.or(under.init_timeout_s),
            list_timeout_s: self.list_timeout_s.or(under.list_timeout_s),
            max_message_mb: self.max_message_mb.or(under.max_message_mb),
            relist_interval_s: self.relist_interval_s.or(under.relist_interval_s),
        }
    }

    fn resolve(self) -> Result<McpLimits, String> {
        let d = McpLimits::default();
        let count = |v: Option<usize>, default: usize, key: &str| match v {
            Some(0) => Err(format!("{key} must be at least 1")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let secs = |v: Option<f64>, default: Duration, key: &str| match v {
            Some(t) if t > 0.0 && t <= 3600.0 => Ok(Duration::from_secs_f64(t)),
            Some(_) => Err(format!("{key} must be in (0, 3600]")),
            None => Ok(default),
        };
        let max_message_bytes = match self.max_message_mb {
            Some(mb) if mb > 0.0 && mb <= 1024.0 => (mb * 1024.0 * 1024.0) as usize,
            Some(_) => return Err("max_message_mb must be in (0, 1024]".into()),
            None => d.max_message_bytes,
        };
        Ok(McpLimits {
            max_pages: count(self.max_pages, d.max_pages, "max_pages")?,
            max_tools: count(self.max_tools, d.max_tools, "max_tools")?,
            warn_tools: count(self.warn_tools, d.warn_tools, "warn_tools")?,
            warn_schema_bytes: count(
                self.warn_schema_kb,
                d.warn_schema_bytes / 1024,
                "warn_schema_kb",
            )? * 1024,
            init_timeout: secs(self.init_timeout_s, d.init_timeout, "init_timeout_s")?,
            list_timeout: secs(self.list_timeout_s, d.list_timeout, "list_timeout_s")?,
            max_message_bytes,
            relist_interval: secs(
                self.relist_interval_s,
                d.relist_interval,
                "relist_interval_s",
            )?,
        })
    }
}

/// What one server may send before cadre refuses it (see the module doc of
/// [`super::client`] for what happens past each bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct McpLimits {
    pub max_pages: usize,
    pub max_tools: usize,
    pub warn_tools: usize,
    pub warn_schema_bytes: usize,
    pub init_timeout: Duration,
    pub list_timeout: Duration,
    pub max_message_bytes: usize,
    pub relist_interval: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        McpLimits {
            max_pages: 100,
            max_tools: 1000,
            warn_tools: 128,
            warn_schema_bytes: 256 * 1024,
            init_timeout: Duration::from_secs(30),
            list_timeout: Duration::from_secs(30),
            // rmcp's own stdio line cap and streamable HTTP event cap.
            max_message_bytes: 16 * 1024 * 1024,
            relist_interval: Duration::from_secs(2),
        }
    }
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
    /// stdio: the network is open to the server.
    #[serde(default)]
    pub network: bool,
    /// stdio: paths beside the sandbox's own view (`{ path, write }`).
    #[serde(default)]
    pub paths: Vec<PathGrant>,
    /// stdio: some of `[tools] sandbox_limits`, for this server.
    #[serde(default)]
    pub sandbox_limits: LimitsOverride,
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
    /// Every tool of the server; unset: each tool's annotations decide.
    pub side_effects: Option<SideEffects>,
    /// Per tool (the server's name for it), over `side_effects`.
    #[serde(default)]
    pub tool_side_effects: BTreeMap<String, SideEffects>,
    // The keys of [`LimitsSpec`], for this server (serde's `flatten` does
    // not mix with `deny_unknown_fields`, so they are spelled out).
    pub max_pages: Option<usize>,
    pub max_tools: Option<usize>,
    pub warn_tools: Option<usize>,
    pub warn_schema_kb: Option<usize>,
    pub init_timeout_s: Option<f64>,
    pub list_timeout_s: Option<f64>,
    pub max_message_mb: Option<f64>,
    pub relist_interval_s: Option<f64>,
}

impl McpServerSpec {
    fn limits(&self) -> LimitsSpec {
        LimitsSpec {
            max_pages: self.max_pages,
            max_tools: self.max_tools,
            warn_tools: self.warn_tools,
            warn_schema_kb: self.warn_schema_kb,
            init_timeout_s: self.init_timeout_s,
            list_timeout_s: self.list_timeout_s,
            max_message_mb: self.max_message_mb,
            relist_interval_s: self.relist_interval_s,
        }
    }
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
        /// The server may use the network (its sandbox gives it none otherwise).
        network: bool,
        /// Paths beside its sandbox's own view.
        paths: Vec<PathGrant>,
        /// Some of `[tools] sandbox_limits`, for this server.
        sandbox_limits: LimitsOverride,
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
    pub limits: McpLimits,
    /// What mcp.toml declares for every tool of the server, if anything.
    pub side_effects: Option<SideEffects>,
    /// What it declares per tool, by the server's tool name.
    pub tool_side_effects: BTreeMap<String, SideEffects>,
}

impl McpServerConfig {
    /// What mcp.toml declares for the server's tool `tool`, if anything;
    /// `None`: the tool's own annotations decide.
    pub fn declared_side_effects(&self, tool: &str) -> Option<SideEffects> {
        self.tool_side_effects
            .get(tool)
            .copied()
            .or(self.side_effects)
    }
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
    file.limits
        .resolve()
        .map_err(|m| err(None, format!("[limits]: {m}")))?;
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
                check_grants(&spec.paths).map_err(fail)?;
                McpTransport::Stdio {
                    command: command.clone(),
                    args: spec.args.clone(),
                    env: expand_all(&spec.env, env).map_err(fail)?,
                    network: spec.network,
                    paths: spec.paths.clone(),
                    sandbox_limits: spec.sandbox_limits,
                }
            }
            (None, Some(url)) => {
                if !spec.args.is_empty()
                    || !spec.env.is_empty()
                    || spec.network
                    || !spec.paths.is_empty()
                    || !spec.sandbox_limits.is_empty()
                {
                    return Err(fail(
                        "`args`, `env`, `network`, `paths` and `sandbox_limits` belong to a `command` server".into(),
                    ));
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
        let limits = spec.limits().over(file.limits).resolve().map_err(fail)?;
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
            limits,
            side_effects: spec.side_effects,
            tool_side_effects: spec.tool_side_effects,
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
    fn limits_default_are_set_in_limits_and_overridden_per_server() {
        let text = "[limits]\nmax_tools = 10\nlist_timeout_s = 5\n\n[servers.a]\ncommand = \"a\"\n\n[servers.b]\ncommand = \"b\"\nmax_tools = 3\n";
        let servers = parse(Path::new("mcp.toml"), text, &env).unwrap();
        assert_eq!(servers[0].limits.max_tools, 10);
        assert_eq!(servers[1].limits.max_tools, 3);
        assert_eq!(servers[1].limits.list_timeout, Duration::from_secs(5));
        assert_eq!(servers[1].limits.max_pages, McpLimits::default().max_pages);
    }

    #[test]
    fn side_effects_per_tool_win_over_the_servers() {
        let text = "[servers.a]\ncommand = \"a\"\nside_effects = \"idempotent\"\n\n[servers.a.tool_side_effects]\nlookup = \"none\"\n\n[servers.b]\ncommand = \"b\"\n";
        let servers = parse(Path::new("mcp.toml"), text, &env).unwrap();
        let a = &servers[0];
        assert_eq!(a.declared_side_effects("lookup"), Some(SideEffects::None));
        assert_eq!(
            a.declared_side_effects("send"),
            Some(SideEffects::Idempotent)
        );
        assert_eq!(servers[1].declared_side_effects("send"), None);
        let bad = "[servers.a]\ncommand = \"a\"\nside_effects = \"sometimes\"\n";
        let e = parse(Path::new("mcp.toml"), bad, &env).unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
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
            ("[limits]\nmax_pages = 0\n", "max_pages must be at least 1"),
            ("[limits]\nbogus = 1\n", "bogus"),
            (
                "[servers.x]\ncommand = \"a\"\nlist_timeout_s = -1\n",
                "list_timeout_s must be in",
            ),
        ];
        for (text, needle) in bad {
            let e = parse(Path::new("mcp.toml"), text, &env).unwrap_err();
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
    }
}
