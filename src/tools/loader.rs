//! Tool files: `agents/tools/*.yaml|*.yml|*.toml`, one tool per file.
//!
//! file ──parse (deny unknown keys; file and line on error)──▶ [`ToolFile`]
//!      ──resolve (schema compiled, handler found)──▶ (ToolDefinition, handler)
//!
//! Stage one ([`parse_file`]) needs nothing but the text, so `cadre tools
//! check` runs it alone. Stage two ([`resolve`]) binds the entry to a
//! handler: `builtin` by handler name (default: the tool's name),
//! `external` to a command or an HTTP endpoint ([`super::external`]; a
//! command runs in the folder of the file that declares it, made absolute
//! here so a later change of the server's directory does not move it),
//! `custom` to a handler the embedding program registered by name.
//!
//! `side_effects` ([`SideEffects`]) is what the file says; unsaid, a
//! `builtin` entry keeps its handler's own and anything else is
//! `at_most_once` (a command or a URL may act, and cadre cannot tell).
//! A command entry runs sandboxed ([`super::sandbox`]): its policy is
//! built here, once per file, from `network`, `paths` and
//! `sandbox_limits`; where the kernel cannot sandbox (and `[tools]
//! sandbox` is not `"off"`) the file is refused with what is missing.
//! A command entry gets the call's idempotency key in its JSON input as
//! `idempotency_key` ([`super::external`]), so it may not declare a
//! parameter of that name.
//!
//! Reading ([`read_tool_file`]) is apart from both: a file over
//! `[tools] max_file_bytes` (default 1 MiB) is refused by its size, read no
//! further than the cap plus one byte; a symlink whose target lies outside
//! the agents folder (the tools folder's parent) is refused, so a tool file
//! cannot be an alias for a file the operator did not put there.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::definition::{CacheSpec, Entry, Plan, RateLimit, Redirects, SideEffects};
use super::schema::{Parameters, to_json_schema};
use super::validate::ParamValidator;
use super::{ToolDefinition, ToolHandler, external};

/// A tool file as written (YAML or TOML, the same keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    pub name: String,
    #[serde(default = "default_version")]
    pub version: String,
    pub description: String,
    #[serde(default = "default_category")]
    pub category: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub parameters: Parameters,
    #[serde(default)]
    pub entry: Entry,
    #[serde(default)]
    pub output: Option<Value>,
    #[serde(default)]
    pub required_plan: Plan,
    #[serde(default)]
    pub rate_limit: RateLimit,
    #[serde(default)]
    pub cache: Option<CacheSpec>,
    #[serde(default)]
    pub post_processor: Option<String>,
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Unset: the builtin handler's own, else `at_most_once`.
    #[serde(default)]
    pub side_effects: Option<SideEffects>,
}

fn default_version() -> String {
    "1.0.0".into()
}
fn default_category() -> String {
    "custom".into()
}

/// Why a tool file was not loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct LoadError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl LoadError {
    fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        LoadError {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }
}

/// Is this a tool file by its name?
pub fn is_tool_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "toml")
    )
}

/// Stage one: the text of a file into a checked [`ToolFile`].
pub fn parse_file(path: &Path, text: &str) -> Result<ToolFile, LoadError> {
    let file: ToolFile = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            LoadError::new(path, line, e.message().to_string())
        })?,
        _ => yaml_serde::from_str(text)
            .map_err(|e| LoadError::new(path, e.location().map(|l| l.line()), e.to_string()))?,
    };
    check(path, &file)?;
    Ok(file)
}

fn check(path: &Path, file: &ToolFile) -> Result<(), LoadError> {
    let valid_name = !file.name.is_empty()
        && file.name.len() <= 64
        && file
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid_name {
        return Err(LoadError::new(
            path,
            None,
            format!(
                "invalid tool name '{}': use 1-64 letters, digits, '_', '-' or '.'",
                file.name
            ),
        ));
    }
    if let Some(t) = file.timeout_s
        && !(t > 0.0 && t <= 3600.0)
    {
        return Err(LoadError::new(path, None, "timeout_s must be in (0, 3600]"));
    }
    if let Some(p) = &file.post_processor
        && p != super::definition::REQUIRE_CONFIRMATION
    {
        return Err(LoadError::new(
            path,
            None,
            format!("unknown post_processor '{p}' (known: require_confirmation)"),
        ));
    }
    for (window, n) in [
        ("per_minute", file.rate_limit.per_minute),
        ("per_hour", file.rate_limit.per_hour),
        ("per_day", file.rate_limit.per_day),
    ] {
        if n == Some(0) {
            return Err(LoadError::new(
                path,
                None,
                format!("rate_limit.{window} must be at least 1"),
            ));
        }
    }
    if let Entry::External {
        command,
        url,
        allowlist,
        redirects,
        env,
        env_set,
        network,
        paths,
        sandbox_limits,
        ..
    } = &file.entry
    {
        super::sandbox::check_grants(paths).map_err(|m| LoadError::new(path, None, m))?;
        if let Some(bad) = env
            .iter()
            .chain(env_set.keys())
            .find(|n| !super::process::is_env_name(n))
        {
            return Err(LoadError::new(
                path,
                None,
                format!("`{bad}` is not an environment variable name (letters, digits and _)"),
            ));
        }
        match (command, url) {
            (Some(c), None) if !c.is_empty() => {
                if !allowlist.is_empty() || *redirects != Redirects::default() {
                    return Err(LoadError::new(
                        path,
                        None,
                        "`allowlist` and `redirects` apply to `url` entries only",
                    ));
                }
            }
            (None, Some(_))
                if !env.is_empty()
                    || !env_set.is_empty()
                    || *network
                    || !paths.is_empty()
                    || !sandbox_limits.is_empty() =>
            {
                return Err(LoadError::new(
                    path,
                    None,
                    "`env`, `env_set`, `network`, `paths` and `sandbox_limits` apply to `command` entries only",
                ));
            }
            (None, Some(u)) => {
                let parsed = url::Url::parse(u)
                    .map_err(|e| LoadError::new(path, None, format!("invalid url '{u}': {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(LoadError::new(
                        path,
                        None,
                        format!("url '{u}' must be http or https"),
                    ));
                }
            }
            _ => {
                return Err(LoadError::new(
                    path,
                    None,
                    "an external entry needs exactly one of `command` (non-empty list) or `url`",
                ));
            }
        }
    }
    let schema =
        to_json_schema(&file.parameters).map_err(|e| LoadError::new(path, None, e.to_string()))?;
    if let Entry::External {
        command: Some(_), ..
    } = &file.entry
        && schema["properties"]
            .get(external::IDEMPOTENCY_KEY_FIELD)
            .is_some()
    {
        return Err(LoadError::new(
            path,
            None,
            format!(
                "a command entry may not declare a parameter named `{}`: cadre puts the call's idempotency key there",
                external::IDEMPOTENCY_KEY_FIELD
            ),
        ));
    }
    ParamValidator::new(&schema, false).map_err(|e| LoadError::new(path, None, e.to_string()))?;
    Ok(())
}

/// Server settings tool files are read and resolved with (`[tools]`).
#[derive(Debug, Clone)]
pub struct FileSettings {
    /// Largest tool file read; a bigger one is refused and named in the log.
    pub max_file_bytes: u64,
    /// `[tools] http_allowlist`: open to HTTP entries as to `http_request`,
    /// before each entry's own `allowlist`.
    pub http_allowlist: Vec<String>,
    /// `[tools] sandbox` and `sandbox_limits`, and what no command may see.
    pub sandbox: super::sandbox::Sandbox,
}

pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 20;

impl Default for FileSettings {
    fn default() -> Self {
        FileSettings {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            http_allowlist: Vec::new(),
            sandbox: Default::default(),
        }
    }
}

/// A tool file's text, or why it was not read: over `max_bytes`, a symlink
/// out of `agents_dir` (the tools folder's parent), or an IO error.
pub fn read_tool_file(path: &Path, agents_dir: &Path, max_bytes: u64) -> Result<String, String> {
    let link = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if link.file_type().is_symlink() {
        let target =
            std::fs::canonicalize(path).map_err(|e| format!("cannot resolve the symlink: {e}"))?;
        let inside = std::fs::canonicalize(agents_dir).is_ok_and(|root| target.starts_with(root));
        if !inside {
            return Err(format!(
                "refused: a symlink to {}, outside the agents folder {}",
                target.display(),
                agents_dir.display()
            ));
        }
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let too_big = |size: u64| {
        format!(
            "refused: the file is {size} bytes, over the {max_bytes}-byte cap ([tools] max_file_bytes)"
        )
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > max_bytes {
        return Err(too_big(size));
    }
    // The file may grow between the size check and the read.
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the file: {e}"))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_string())
}

/// Handlers a tool file may name.
#[derive(Clone, Default)]
pub struct HandlerCatalog {
    pub builtin: HashMap<String, Arc<dyn ToolHandler>>,
    pub custom: HashMap<String, Arc<dyn ToolHandler>>,
    /// What each builtin handler declares: a tool file naming one without
    /// `side_effects` of its own keeps it.
    pub builtin_side_effects: HashMap<String, SideEffects>,
}

/// The working directory of a command entry: the folder of its tool file
/// as listed (a symlink's own folder, not its target's).
fn command_dir(file: &Path) -> PathBuf {
    let folder = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf())
}

/// Stage two: bind the file to its handler.
pub fn resolve(
    path: &Path,
    file: ToolFile,
    catalog: &HandlerCatalog,
    settings: &FileSettings,
) -> Result<(ToolDefinition, Arc<dyn ToolHandler>), LoadError> {
    let parameters =
        to_json_schema(&file.parameters).map_err(|e| LoadError::new(path, None, e.to_string()))?;
    let handler: Arc<dyn ToolHandler> = match &file.entry {
        Entry::Builtin { handler } => {
            let name = handler.as_deref().unwrap_or(&file.name);
            catalog.builtin.get(name).cloned().ok_or_else(|| {
                LoadError::new(path, None, format!("no builtin handler named '{name}'"))
            })?
        }
        Entry::Custom { handler } => {
            let name = handler.as_deref().unwrap_or(&file.name);
            catalog.custom.get(name).cloned().ok_or_else(|| {
                LoadError::new(
                    path,
                    None,
                    format!("no custom handler named '{name}' was registered"),
                )
            })?
        }
        Entry::Mcp { .. } => {
            return Err(LoadError::new(
                path,
                None,
                "mcp entries come from the servers declared in agents/mcp.toml, not from tool files",
            ));
        }
        Entry::Agent { .. } => {
            return Err(LoadError::new(
                path,
                None,
                "agent entries come from an agent file's `agents = [...]`, not from tool files",
            ));
        }
        Entry::External {
            command,
            url,
            max_output_bytes,
            allowlist,
            redirects,
            env,
            env_set,
            network,
            paths,
            sandbox_limits,
        } => {
            let cap = max_output_bytes.unwrap_or(external::DEFAULT_MAX_OUTPUT);
            match (command, url) {
                (Some(argv), _) => {
                    let dir = command_dir(path);
                    let policy = settings
                        .sandbox
                        .policy(std::slice::from_ref(&dir), paths, *network, sandbox_limits)
                        .map_err(|e| LoadError::new(path, None, e.to_string()))?;
                    Arc::new(
                        external::ExternalHandler::command(argv.clone(), dir, cap)
                            .with_env(env.clone(), env_set.clone())
                            .sandboxed(policy),
                    )
                }
                (None, Some(url)) => {
                    let url = url::Url::parse(url)
                        .map_err(|e| LoadError::new(path, None, format!("invalid url: {e}")))?;
                    let allow: Vec<String> = settings
                        .http_allowlist
                        .iter()
                        .chain(allowlist)
                        .cloned()
                        .collect();
                    let handler = external::ExternalHandler::http(url, &allow, *redirects, cap)
                        .map_err(|e| {
                            LoadError::new(path, None, format!("cannot build the HTTP client: {e}"))
                        })?;
                    Arc::new(handler)
                }
                (None, None) => {
                    return Err(LoadError::new(
                        path,
                        None,
                        "an external entry needs `command` or `url`",
                    ));
                }
            }
        }
    };
    let side_effects = file.side_effects.unwrap_or_else(|| match &file.entry {
        Entry::Builtin { handler } => catalog
            .builtin_side_effects
            .get(handler.as_deref().unwrap_or(&file.name))
            .copied()
            .unwrap_or_default(),
        _ => SideEffects::default(),
    });
    let definition = ToolDefinition {
        name: file.name,
        version: file.version,
        description: file.description,
        category: file.category,
        tags: file.tags,
        parameters,
        entry: file.entry,
        output: file.output,
        required_plan: file.required_plan,
        rate_limit: file.rate_limit,
        cache: file.cache,
        post_processor: file.post_processor,
        timeout: file.timeout_s.map(Duration::from_secs_f64),
        side_effects,
    };
    Ok((definition, handler))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP_YAML: &str = r#"
name: http_get
version: "1.0.0"
description: Send an HTTP request
category: http
tags: [network]
parameters:
  - name: url
    type: string
    required: true
    validation:
      pattern: "^https?://"
  - name: timeout
    type: number
    default: 30
    validation: { min: 1, max: 300 }
entry:
  type: builtin
  handler: echo
required_plan: pro
rate_limit: { per_minute: 5 }
cache: { ttl_seconds: 60 }
"#;

    #[test]
    fn yaml_and_toml_give_the_same_definition() {
        let yaml = parse_file(Path::new("t.yaml"), HTTP_YAML).unwrap();
        let toml_text = r#"
name = "http_get"
version = "1.0.0"
description = "Send an HTTP request"
category = "http"
tags = ["network"]
required_plan = "pro"
rate_limit = { per_minute = 5 }
cache = { ttl_seconds = 60 }
entry = { type = "builtin", handler = "echo" }

[[parameters]]
name = "url"
type = "string"
required = true
validation = { pattern = "^https?://" }

[[parameters]]
name = "timeout"
type = "number"
default = 30
validation = { min = 1, max = 300 }
"#;
        let toml = parse_file(Path::new("t.toml"), toml_text).unwrap();
        let mut catalog = HandlerCatalog::default();
        catalog.builtin.insert(
            "echo".into(),
            Arc::new(crate::tools::builtin::echo::Echo) as Arc<dyn ToolHandler>,
        );
        let settings = FileSettings::default();
        let (a, _) = resolve(Path::new("t.yaml"), yaml, &catalog, &settings).unwrap();
        let (b, _) = resolve(Path::new("t.toml"), toml, &catalog, &settings).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.required_plan, Plan::Pro);
        assert_eq!(a.rate_limit.per_minute, Some(5));
        assert_eq!(a.parameters["properties"]["timeout"]["maximum"], 300);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err =
            parse_file(Path::new("bad.yaml"), "name: x\ndescription: d\nbogus: 1\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.message.contains("bogus"), "{err}");
        let err = parse_file(
            Path::new("bad.toml"),
            "name = \"x\"\ndescription = \"d\"\nrate_limit = { per_minute = \"many\" }\n",
        )
        .unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.to_string().starts_with("bad.toml:3:"), "{err}");
    }

    #[test]
    fn semantic_errors_are_refused_at_parse() {
        let bad_regex = "name: x\ndescription: d\nparameters:\n  - {name: a, type: string, validation: {pattern: '('}}\n";
        assert!(parse_file(Path::new("a.yaml"), bad_regex).is_err());
        let bad_name = "name: 'x y'\ndescription: d\n";
        assert!(parse_file(Path::new("a.yaml"), bad_name).is_err());
        let zero = "name: x\ndescription: d\nrate_limit: {per_day: 0}\n";
        assert!(parse_file(Path::new("a.yaml"), zero).is_err());
        let pp = "name: x\ndescription: d\npost_processor: explode\n";
        assert!(parse_file(Path::new("a.yaml"), pp).is_err());
    }

    #[test]
    fn side_effects_are_said_inherited_from_a_builtin_or_at_most_once() {
        let mut catalog = HandlerCatalog::default();
        catalog.builtin.insert(
            "echo".into(),
            Arc::new(crate::tools::builtin::echo::Echo) as Arc<dyn ToolHandler>,
        );
        catalog
            .builtin_side_effects
            .insert("echo".into(), SideEffects::None);
        let side_effects = |text: &str| {
            let file = parse_file(Path::new("t.yaml"), text).unwrap();
            let (def, _) = resolve(
                Path::new("t.yaml"),
                file,
                &catalog,
                &FileSettings::default(),
            )
            .unwrap();
            def.side_effects
        };
        let builtin = "name: x\ndescription: d\nentry: {type: builtin, handler: echo}\n";
        assert_eq!(side_effects(builtin), SideEffects::None);
        assert_eq!(
            side_effects(&format!("{builtin}side_effects: idempotent\n")),
            SideEffects::Idempotent
        );
        let command = "name: x\ndescription: d\nentry: {type: external, command: [cat]}\n";
        assert_eq!(side_effects(command), SideEffects::AtMostOnce);
        assert_eq!(
            side_effects(&format!("{command}side_effects: none\n")),
            SideEffects::None
        );
        let bad = format!("{command}side_effects: sometimes\n");
        assert!(parse_file(Path::new("t.yaml"), &bad).is_err());
    }

    #[test]
    fn a_command_may_not_declare_the_idempotency_key_as_a_parameter() {
        let text = "name: x\ndescription: d\nentry: {type: external, command: [cat]}\nparameters:\n  - {name: idempotency_key, type: string}\n";
        let err = parse_file(Path::new("t.yaml"), text).unwrap_err();
        assert!(err.message.contains("idempotency_key"), "{err}");
        // A URL entry gets the key in a header: the name is free there.
        let url = "name: x\ndescription: d\nentry: {type: external, url: \"https://h.example/x\"}\nparameters:\n  - {name: idempotency_key, type: string}\n";
        assert!(parse_file(Path::new("t.yaml"), url).is_ok());
    }

    #[test]
    fn an_unknown_handler_is_a_resolve_error() {
        let f = parse_file(Path::new("a.yaml"), "name: x\ndescription: d\n").unwrap();
        let Err(err) = resolve(
            Path::new("a.yaml"),
            f,
            &HandlerCatalog::default(),
            &FileSettings::default(),
        ) else {
            panic!("resolved a tool whose handler does not exist");
        };
        assert!(err.message.contains("no builtin handler named 'x'"));
    }
}
