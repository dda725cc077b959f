//! The `cadre` command line: `serve` runs the HTTP server, `chat` runs one
//! turn in-process, `tools` lists and checks tool definitions, `workflow`
//! lists workflows and runs one in-process with a line per node event,
//! `schedules` lists, creates and deletes a running server's schedules.
//! `memory` searches, reads, stores and deletes a running server's memory items.
//! Thin: everything it does is the library's. With `--url` the read and run
//! commands ask a running server instead (see `remote`).

// The binary's own pieces (never declared from the runtime's lib.rs):
// `render`: how each read command prints what it got (the local path and
// the remote one hand it the same data, so both print the same thing);
// `remote`: the client side of `--url`/`--api-key`; `repl`: the chat
// loop; `telemetry`: the tracing subscriber and OTLP export (feature
// `otlp`).
mod remote;
mod render;
mod repl;
mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use cadre::Runtime;
use cadre::conversation::NewSession;
use cadre::identity::Scope;
use cadre::server_config::ServerConfig;
use cadre::tools::loader::{is_tool_file, parse_file};
use cadre::tools::{Plan, ToolRegistry, builtin};

#[derive(Parser)]
#[command(
    name = "cadre",
    version,
    about = "An actor-based runtime for LLM tool calling"
)]
struct Cli {
    /// Log lines as text or as JSON objects (one per line, with span fields).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CADRE_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Talk to a running `cadre serve` at this URL instead of the data dir
    /// (sessions, calls, stats, tools list/invoke, workflow, chat).
    #[arg(long, global = true, env = "CADRE_URL")]
    url: Option<String>,
    /// API key sent as `Authorization: Bearer` with `--url`.
    #[arg(long, global = true, env = "CADRE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct Common {
    /// Where the redb database lives.
    #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
    data_dir: PathBuf,
    /// Folder of agent definitions (*.toml); tools in its `tools/`, data in its `data/`.
    #[arg(long, default_value = "./agents", env = "CADRE_AGENTS_DIR")]
    agents: PathBuf,
    /// Server config file (TOML); every key can be overridden by CADRE_<SECTION>_<KEY>.
    #[arg(long, env = "CADRE_CONFIG")]
    config: Option<PathBuf>,
}

/// Cluster mode: several nodes on one PostgreSQL (each overrides its
/// `[cluster]` key; README "Running on several machines").
#[derive(Args, Default)]
struct ClusterArgs {
    /// The shared store, `postgres://user:pass@host:port/db` (`[cluster] store`).
    #[arg(long)]
    store: Option<String>,
    /// This node's id, unique in the cluster (`[cluster] node_id`).
    #[arg(long)]
    node_id: Option<String>,
    /// Where the other nodes reach this one, `http://host:port` (`[cluster] advertise`).
    #[arg(long)]
    advertise: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server.
    Serve {
        /// Address to listen on (loopback unless keys exist: open mode serves loopback only).
        #[arg(long, default_value = "127.0.0.1:8080", env = "CADRE_ADDR")]
        addr: SocketAddr,
        /// Cluster mode: Redis for shared rate limits, concurrency permits and
        /// events (`redis://[user:password@]host:port`; `[cluster] redis`).
        #[arg(long, env = "CADRE_CLUSTER_REDIS", hide_env_values = true)]
        redis: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Chat in-process: one turn with MESSAGE, or an interactive session
    /// without it (`/summary`, `/tools`, `/quit`).
    Chat {
        /// The agent of a new session (ignored with --session).
        #[arg(long, default_value = "assistant")]
        agent: String,
        /// Plan of the session: free, pro or premium.
        #[arg(long, default_value = "free")]
        plan: String,
        /// Continue this session instead of starting one.
        #[arg(long)]
        session: Option<String>,
        /// The message to send; none: interactive.
        message: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// List or check tool definitions.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// API keys of tenants: with `--url` (and an admin `--api-key`) on a
    /// running server, else on the data dir (the server stopped).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Read sessions from the data dir.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Schedules of a running server (`/v1/schedules`): with `--url`, or
    /// the server that holds `--data-dir`.
    Schedules {
        #[command(subcommand)]
        command: SchedulesCommand,
    },
    /// Memory of a running server (`/v1/memory`, docs/memory.md): with
    /// `--url`, or the server that holds `--data-dir`.
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// Tool call records, newest first.
    Calls {
        /// Only the calls of this session.
        #[arg(long)]
        session: Option<String>,
        /// Only the calls of this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only the calls of this workflow run.
        #[arg(long)]
        workflow: Option<String>,
        /// At most this many records.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Give the space deletes freed back to the file system: compacts the
    /// data dir's redb file (stop the server first).
    Compact {
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Per-tool call counters.
    Stats {
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Serve cadre's tools and agents (`agent_<name>`) over MCP on stdio.
    Mcp {
        /// The plan of the local caller: free, pro or premium.
        #[arg(long, default_value = "free", env = "CADRE_MCP_PLAN")]
        plan: String,
        /// Offer `confirmations_list` and `confirmation_decide`: only for an
        /// MCP host that asks its human before each tool call (a model that
        /// can approve its own held calls defeats the confirmation).
        #[arg(long)]
        confirmation_tools: bool,
        #[command(flatten)]
        common: Common,
    },
    /// List workflows, or run one in-process.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
    },
    /// Check a server config file.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Copy a redb data dir into PostgreSQL, to move a single node to
    /// cluster mode; safe to run again (rows are set, not added).
    Migrate {
        /// The data dir of the single-node server (stop it first).
        #[arg(long)]
        from: PathBuf,
        /// The PostgreSQL URL the nodes will use (`serve --store`).
        #[arg(long)]
        to: String,
    },
    /// Print a shell completion script: `cadre completions bash >
    /// ~/.local/share/bash-completion/completions/cadre` (zsh: a file
    /// `_cadre` in a folder of `$fpath`; fish:
    /// `~/.config/fish/completions/cadre.fish`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum WorkflowCommand {
    /// List the workflows of the agents folder; exits non-zero when a file did not load.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Run a workflow in-process, printing each node as it starts and ends.
    Run {
        /// The workflow's name.
        name: String,
        /// The run's input, as JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// The user the run's tool calls are made for (rate limits).
        #[arg(long)]
        user_id: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key for a tenant; it is printed once and only its hash is stored.
    Create {
        /// The tenant the key calls as (letters, digits, '_' or '-', at most 64).
        #[arg(long)]
        tenant: String,
        /// May manage tenant configs and keys, and read runtime-wide stats,
        /// events and /metrics.
        #[arg(long)]
        admin: bool,
        /// The highest plan the key may use: free, pro or premium (default: every plan).
        #[arg(long, value_parser = parse_plan)]
        plan: Option<Plan>,
        /// A scrape key: it may read /metrics and nothing else.
        #[arg(long, conflicts_with = "admin")]
        metrics: bool,
        /// When the key stops working (RFC 3339, e.g. 2030-01-01T00:00:00Z).
        #[arg(long)]
        expires_at: Option<jiff::Timestamp>,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// List keys (ids, tenants, rights, status; never the keys).
    List {
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Revoke a key by id.
    Revoke {
        /// The key's id (the part after `cadre_`, as `keys list` shows it).
        key_id: String,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
}

fn parse_plan(s: &str) -> Result<Plan, String> {
    Plan::parse(s).ok_or_else(|| format!("'{s}' is not a plan: free, pro or premium"))
}

#[derive(Subcommand)]
enum SessionsCommand {
    /// One line per session: id, tenant, agent, created.
    List {
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// A session and its messages, readably.
    Show {
        /// The session's id.
        id: String,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// A session, its messages, summary and call records as one JSON document.
    Export {
        /// The session's id.
        id: String,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Print a session's summary as JSON.
    Summary {
        /// The session's id.
        id: String,
        /// Where the redb database lives.
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
}

/// The server a `schedules` command asks when no `--url` is given: the
/// one holding this data dir (its `server.json`).
#[derive(Args)]
struct ServerDir {
    /// The data dir of the server to ask when no --url is given.
    #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
    data_dir: PathBuf,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum SchedulesCommand {
    /// One line per schedule of the key's tenant: id, what it runs, when,
    /// its next fire and its last run.
    List {
        #[command(flatten)]
        server: ServerDir,
    },
    /// Create a schedule (an agent turn or a workflow run, on a cron
    /// expression or an interval); prints its id, and what it is on stderr.
    #[command(group(clap::ArgGroup::new("target").required(true).args(["agent", "workflow"])))]
    #[command(group(clap::ArgGroup::new("timing").required(true).args(["cron", "interval_s"])))]
    Create {
        /// The agent asked at each fire.
        #[arg(long, requires = "message")]
        agent: Option<String>,
        /// What the agent is asked.
        #[arg(long, requires = "agent")]
        message: Option<String>,
        /// `new` (default: a new session per fire) or a session id of the same agent.
        #[arg(long, requires = "agent")]
        session: Option<String>,
        /// The workflow run at each fire.
        #[arg(long)]
        workflow: Option<String>,
        /// The workflow run's input, as JSON.
        #[arg(long, requires = "workflow")]
        input: Option<String>,
        /// A cron expression: 5 fields (`0 9 * * 1-5`), or 6 with seconds first.
        #[arg(long)]
        cron: Option<String>,
        /// Every this many seconds.
        #[arg(long)]
        interval_s: Option<u64>,
        /// The IANA time zone of --cron (default UTC).
        #[arg(long, requires = "cron")]
        timezone: Option<String>,
        /// The user the turns or runs are for.
        #[arg(long)]
        user_id: Option<String>,
        /// The schedule's webhook, an http(s) URL.
        #[arg(long)]
        webhook: Option<String>,
        /// Slots missed while no server ran: one (default), none or all.
        #[arg(long, value_parser = ["one", "none", "all"])]
        catch_up: Option<String>,
        #[command(flatten)]
        server: ServerDir,
    },
    /// Delete a schedule: it fires no more.
    Delete {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        server: ServerDir,
    },
    /// A schedule's fires, newest first.
    Runs {
        /// The schedule's id.
        id: String,
        /// At most this many (1 to 100).
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        server: ServerDir,
    },
}

#[derive(Subcommand)]
enum MemoryCommand {
    /// Search the key's tenant's memory: one line per item (score,
    /// namespace, key, value), best first for --query, else newest first.
    Search {
        /// Words to rank by (BM25).
        #[arg(long)]
        query: Option<String>,
        /// Only items under this namespace, segments joined with `.` (`users.u1`).
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many (1 to 100).
        #[arg(long, default_value_t = 10)]
        limit: usize,
        #[command(flatten)]
        server: ServerDir,
    },
    /// Print an item's value (JSON).
    Get {
        /// The namespace, segments joined with `.` (`users.u1`).
        namespace: String,
        /// The item's key within the namespace.
        key: String,
        #[command(flatten)]
        server: ServerDir,
    },
    /// Store an item (create or replace).
    Put {
        /// The namespace, segments joined with `.` (`users.u1`).
        namespace: String,
        /// The item's key within the namespace.
        key: String,
        /// The value: a JSON object.
        value: String,
        /// Forget it this many seconds from now.
        #[arg(long)]
        ttl_s: Option<u64>,
        #[command(flatten)]
        server: ServerDir,
    },
    /// Delete an item.
    Delete {
        /// The namespace, segments joined with `.` (`users.u1`).
        namespace: String,
        /// The item's key within the namespace.
        key: String,
        #[command(flatten)]
        server: ServerDir,
    },
}

impl MemoryCommand {
    fn data_dir(&self) -> &std::path::Path {
        match self {
            MemoryCommand::Search { server, .. }
            | MemoryCommand::Get { server, .. }
            | MemoryCommand::Put { server, .. }
            | MemoryCommand::Delete { server, .. } => &server.data_dir,
        }
    }
}

impl SchedulesCommand {
    fn data_dir(&self) -> &std::path::Path {
        match self {
            SchedulesCommand::List { server }
            | SchedulesCommand::Create { server, .. }
            | SchedulesCommand::Delete { server, .. }
            | SchedulesCommand::Runs { server, .. } => &server.data_dir,
        }
    }
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// List the tools a server with these agents would offer.
    List {
        /// Only the tools this plan may call.
        #[arg(long)]
        plan: Option<String>,
        /// Folder of agent definitions; tool files in its `tools/`.
        #[arg(long, default_value = "./agents", env = "CADRE_AGENTS_DIR")]
        agents: PathBuf,
    },
    /// Check tool files (default: ./agents/tools); exits non-zero on errors.
    Check {
        /// The folder of tool files (default: ./agents/tools).
        dir: Option<PathBuf>,
    },
    /// Call a tool through the executor (caller type `direct`) and print
    /// the result; exits non-zero when the call fails.
    Invoke {
        /// The tool's name.
        name: String,
        /// The call's parameters, as JSON.
        #[arg(long, default_value = "{}")]
        params: String,
        /// Plan of the caller: free, pro or premium.
        #[arg(long)]
        plan: Option<String>,
        /// The user the call is made for (per-user rate limits and cache).
        #[arg(long)]
        user_id: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a server config file (TOML); exits non-zero when it is invalid.
    Check {
        /// The config file (TOML).
        path: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Tools { .. }
        | Command::Workflow { .. }
        | Command::Keys { .. }
        | Command::Sessions { .. }
        | Command::Schedules { .. }
        | Command::Memory { .. }
        | Command::Calls { .. }
        | Command::Stats { .. }
        | Command::Compact { .. }
        | Command::Config { .. }
        | Command::Completions { .. } => "warn",
        _ => "info,tower_http=warn",
    };
    let _telemetry = telemetry::init(matches!(cli.log_format, LogFormat::Json), default_filter)?;
    if let Some(url) = &cli.url
        && let Some(result) = remote::run(url, cli.api_key.as_deref(), &cli.command)
    {
        return result;
    }
    if cli.url.is_none()
        && let Some(data_dir) = data_dir_of(&cli.command)
        && let Some(server) = cadre::runtime::ServerFile::read_live(data_dir)
    {
        return held_by_server(&server, data_dir, cli.api_key.as_deref(), &cli.command);
    }
    match cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "cadre", &mut std::io::stdout());
            Ok(())
        }
        Command::Serve {
            addr,
            redis,
            cluster,
            common,
        } => serve(addr, redis, cluster, common),
        Command::Migrate { from, to } => migrate(&from, &to),
        Command::Chat {
            agent,
            plan,
            session,
            message,
            common,
        } => chat(agent, plan, session, message, common),
        Command::Tools {
            command: ToolsCommand::List { plan, agents },
        } => tools_list(plan, agents),
        Command::Tools {
            command: ToolsCommand::Check { dir },
        } => tools_check(dir.unwrap_or_else(|| PathBuf::from("./agents/tools"))),
        Command::Tools {
            command:
                ToolsCommand::Invoke {
                    name,
                    params,
                    plan,
                    user_id,
                    common,
                },
        } => tools_invoke(name, params, plan, user_id, common),
        Command::Config {
            command: ConfigCommand::Check { path },
        } => config_check(path),
        Command::Keys { command } => keys(command),
        Command::Sessions { command } => sessions(command),
        Command::Schedules { command } => bail!(
            "no cadre server holds {}: schedules are kept and fired by a running server. Pass --url URL (env CADRE_URL) with --api-key, or --data-dir of the running `cadre serve`",
            command.data_dir().display()
        ),
        Command::Memory { command } => bail!(
            "no cadre server holds {}: memory is served by a running server. Pass --url URL (env CADRE_URL) with --api-key, or --data-dir of the running `cadre serve`",
            command.data_dir().display()
        ),
        Command::Calls {
            session,
            tool,
            workflow,
            limit,
            data_dir,
        } => calls(
            cadre::store::CallFilter {
                conversation_id: session,
                workflow_id: workflow,
                tool,
                tenant: None,
                limit,
            },
            data_dir,
        ),
        Command::Stats { data_dir } => stats(data_dir),
        Command::Compact { data_dir } => compact(data_dir),
        Command::Mcp {
            plan,
            confirmation_tools,
            common,
        } => {
            let plan = Plan::parse(&plan).context("--plan must be free, pro or premium")?;
            let runtime = runtime(&common)?.start().context("starting cadre")?;
            Ok(runtime.serve_mcp_stdio(plan, confirmation_tools)?)
        }
        Command::Workflow {
            command: WorkflowCommand::List { common },
        } => workflow_list(common),
        Command::Workflow {
            command:
                WorkflowCommand::Run {
                    name,
                    input,
                    user_id,
                    common,
                },
        } => workflow_run(name, input, user_id, common),
    }
}

/// `cadre migrate`: copies every table of the data dir's redb file into
/// PostgreSQL ([`cadre::cluster::postgres`]'s import) and prints the rows
/// copied per table.
fn migrate(from: &std::path::Path, to: &str) -> anyhow::Result<()> {
    if let Some(server) = cadre::runtime::ServerFile::read_live(from) {
        bail!(
            "a cadre server (pid {}) serves {} at {}; stop it first",
            server.pid,
            from.display(),
            server.url
        );
    }
    let node = cadre::store::NodeIdentity {
        id: cadre::cluster::postgres::IMPORT_NODE.into(),
        addr: None,
        stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
    };
    let store = cadre::cluster::postgres::PgStore::open(to, node).map_err(|e| match e {
        cadre::store::StoreError::Unreachable { url, reason, .. } => {
            anyhow::anyhow!("cannot reach PostgreSQL at {url} (set with --to): {reason}")
        }
        other => other.into(),
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let imported = rt
        .block_on(store.import_redb(from))
        .with_context(|| format!("copying {} into PostgreSQL", from.display()))?;
    for (table, rows) in imported.tables {
        println!("{table:<14} {rows}");
    }
    Ok(())
}

/// The data dir a command opens, if it opens one.
fn data_dir_of(command: &Command) -> Option<&std::path::Path> {
    match command {
        Command::Serve { common, .. }
        | Command::Chat { common, .. }
        | Command::Mcp { common, .. }
        | Command::Workflow {
            command: WorkflowCommand::List { common } | WorkflowCommand::Run { common, .. },
        }
        | Command::Tools {
            command: ToolsCommand::Invoke { common, .. },
        } => Some(&common.data_dir),
        Command::Keys {
            command:
                KeysCommand::Create { data_dir, .. }
                | KeysCommand::List { data_dir }
                | KeysCommand::Revoke { data_dir, .. },
        }
        | Command::Sessions {
            command:
                SessionsCommand::List { data_dir }
                | SessionsCommand::Show { data_dir, .. }
                | SessionsCommand::Export { data_dir, .. }
                | SessionsCommand::Summary { data_dir, .. },
        }
        | Command::Calls { data_dir, .. }
        | Command::Stats { data_dir }
        | Command::Compact { data_dir } => Some(data_dir),
        Command::Schedules { command } => Some(command.data_dir()),
        Command::Memory { command } => Some(command.data_dir()),
        Command::Tools { .. }
        | Command::Config { .. }
        | Command::Completions { .. }
        | Command::Migrate { .. } => None,
    }
}

/// A running server holds `data_dir` (redb: one process per file): the
/// command goes to that server over HTTP, saying so, or fails with what to
/// run instead.
fn held_by_server(
    server: &cadre::runtime::ServerFile,
    data_dir: &std::path::Path,
    api_key: Option<&str>,
    command: &Command,
) -> anyhow::Result<()> {
    let url = &server.url;
    let dir = data_dir.display();
    let pid = server.pid;
    match command {
        Command::Serve { .. } => {
            bail!(
                "a cadre server (pid {pid}) already serves {dir} at {url}; stop it first, or start this one with another --data-dir"
            )
        }
        Command::Mcp { .. } => bail!(
            "a cadre server (pid {pid}) holds {dir}: point the MCP client at {url}/mcp (streamable HTTP), or stop the server to run `cadre mcp` on stdio"
        ),
        _ => {}
    }
    match remote::run(url, api_key, command) {
        Some(result) => {
            eprintln!(
                "cadre: {dir} is held by the server at {url} (pid {pid}); using it over HTTP"
            );
            result
        }
        None => bail!(
            "a cadre server (pid {pid}) holds {dir}, and this command needs the data dir itself: stop the server first"
        ),
    }
}

fn runtime(common: &Common) -> anyhow::Result<cadre::RuntimeBuilder> {
    let config = ServerConfig::load(common.config.as_deref(), std::env::vars())?;
    Ok(Runtime::builder()
        .data_dir(&common.data_dir)
        .agents_dir(&common.agents)
        .tool_family(cadre_sample::tools)
        .config(config))
}

fn serve(
    addr: SocketAddr,
    redis: Option<String>,
    cluster: ClusterArgs,
    common: Common,
) -> anyhow::Result<()> {
    let mut config = ServerConfig::load(common.config.as_deref(), std::env::vars())?;
    let section = &mut config.cluster;
    for (flag, value, key) in [
        ("--store", cluster.store, &mut section.store),
        ("--node-id", cluster.node_id, &mut section.node_id),
        ("--advertise", cluster.advertise, &mut section.advertise),
    ] {
        if value.is_some() {
            tracing::debug!(flag, "cluster setting from the command line");
            *key = value;
        }
    }
    config.check().context("cluster settings")?;
    let mut builder = Runtime::builder()
        .data_dir(&common.data_dir)
        .agents_dir(&common.agents)
        .tool_family(cadre_sample::tools)
        .config(config);
    if let Some(url) = redis {
        builder = builder.redis(url);
    }
    let runtime = builder
        .listen(addr)
        .handle_signals(true)
        .start()
        .context("starting cadre")?;
    if runtime.sessions().agents().names().is_empty() {
        let looked_in = std::path::absolute(&common.agents).unwrap_or(common.agents.clone());
        drop(runtime);
        bail!(
            "no agent found in {}: every session would be 404 AGENT_NOT_FOUND. Pass --agents DIR (or CADRE_AGENTS_DIR), or start from the directory that holds agents/",
            looked_in.display()
        );
    }
    let bound = runtime.addr().context("no listener")?;
    // Tests and scripts read this line to learn the port.
    println!("cadre listening on http://{bound}");
    tracing::info!(data = %common.data_dir.display(), agents = %common.agents.display(), "serving");
    runtime.wait();
    Ok(())
}

fn chat(
    agent: String,
    plan: String,
    session: Option<String>,
    message: Option<String>,
    common: Common,
) -> anyhow::Result<()> {
    use cadre::conversation::actor::TurnEvent;

    let plan = Plan::parse(&plan).context("--plan must be free, pro or premium")?;
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sessions = runtime.sessions();
    let id = rt.block_on(async {
        match session {
            Some(id) => sessions.get(&Scope::runtime(), &id).await.map(|s| s.id),
            None => sessions
                .create(NewSession {
                    agent: agent.clone(),
                    plan,
                    ..Default::default()
                })
                .await
                .map(|s| s.id),
        }
    })?;
    let turn = |text: String, live: bool| -> anyhow::Result<()> {
        rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TurnEvent>();
            let scope = Scope::runtime();
            let work = sessions.send_message(&scope, &id, text, Some(tx));
            tokio::pin!(work);
            let mut printer = render::TurnPrinter::new(live);
            let outcome = loop {
                tokio::select! {
                    result = &mut work => break result,
                    Some(event) = rx.recv() => {
                        printer.event(&serde_json::to_value(&event)?);
                    }
                }
            };
            let outcome = outcome?;
            if outcome.status == cadre::conversation::machine::TurnStatus::AwaitingApproval {
                printer.paused(&serde_json::to_value(&outcome)?);
            } else {
                printer.finish(&outcome.answer);
            }
            Ok(())
        })
    };
    if let Some(message) = message {
        return turn(message, false);
    }
    repl::repl(
        &id,
        &agent,
        turn,
        || {
            Ok(serde_json::to_value(
                rt.block_on(sessions.summary(&Scope::runtime(), &id))?,
            )?)
        },
        || {
            let session = rt.block_on(sessions.get(&Scope::runtime(), &id))?;
            let specs = match sessions.agents().get(&session.agent) {
                Some(a) => a.tool_specs(runtime.registry(), session.plan),
                None => Vec::new().into(),
            };
            Ok(specs
                .iter()
                .map(|s| (s.name.clone(), s.description.clone()))
                .collect())
        },
    )
}

fn workflow_list(common: Common) -> anyhow::Result<()> {
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let workflows = runtime.workflows();
    let defs: Vec<serde_json::Value> = workflows
        .definitions()
        .iter()
        .map(|w| w.to_json())
        .collect();
    render::workflows(&serde_json::json!({
        "workflows": defs,
        "errors": workflows.load_errors(),
    }))
}

fn workflow_run(
    name: String,
    input: String,
    user_id: Option<String>,
    common: Common,
) -> anyhow::Result<()> {
    use cadre::workflow::StartRun;
    use tokio::sync::broadcast::error::RecvError;

    let input: serde_json::Value =
        serde_json::from_str(&input).context("--input must be a JSON object")?;
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let run = rt.block_on(async {
        let workflows = runtime.workflows();
        let mut events = workflows.subscribe();
        let start = StartRun {
            webhook: None,
            id: None,
            input,
            user_id,
            ..StartRun::default()
        };
        let run = workflows.start(&name, start).await?;
        println!("run {} of {name}", run.id);
        let started = std::time::Instant::now();
        loop {
            let event = match events.recv().await {
                Ok(e) if e.run_id == run.id => e,
                Ok(_) | Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            };
            let at = format!("[{:>7.2}s]", started.elapsed().as_secs_f64());
            let event = serde_json::to_value(&event.kind).unwrap_or_default();
            if render::workflow_event(&at, &event) {
                break;
            }
        }
        workflows.wait(&run.id).await
    })?;
    render::workflow_result(&run)
}

fn tools_list(plan: Option<String>, agents: PathBuf) -> anyhow::Result<()> {
    let store = cadre::store::Store::open_in_memory()?;
    let registry = ToolRegistry::new();
    let ctx = builtin::BuiltinContext {
        store,
        data_dir: agents.join("data"),
        http_allowlist: Vec::new(),
    };
    builtin::register_all(&registry, &ctx)?;
    for (definition, handler) in cadre_sample::tools(&ctx) {
        registry.register(definition, handler)?;
    }
    let report = registry.reload_dir(&agents.join("tools"));
    for e in &report.errors {
        eprintln!("warning: {e}");
    }
    let defs = match plan {
        Some(p) => registry
            .definitions_for_plan(Plan::parse(&p).context("--plan must be free, pro or premium")?),
        None => registry.definitions(),
    };
    for d in defs {
        println!("{}", render::tool_line(&d));
    }
    Ok(())
}

fn tools_check(dir: PathBuf) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_tool_file(p))
        .collect();
    paths.sort();
    let mut names = std::collections::BTreeMap::new();
    let mut errors = 0;
    for path in &paths {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                errors += 1;
                continue;
            }
        };
        match parse_file(path, &text) {
            Ok(file) => {
                if let Some(first) = names.insert(file.name.clone(), path.clone()) {
                    eprintln!(
                        "{}: tool '{}' is also defined in {}",
                        path.display(),
                        file.name,
                        first.display()
                    );
                    errors += 1;
                } else {
                    println!("ok  {} ({})", file.name, path.display());
                }
            }
            Err(e) => {
                eprintln!("{e}");
                errors += 1;
            }
        }
    }
    if errors > 0 {
        bail!("{errors} error(s) in {} tool file(s)", paths.len());
    }
    println!("{} tool file(s) checked, no errors", paths.len());
    Ok(())
}

/// Opens the data dir's store for a one-off command.
fn open_store(data_dir: &std::path::Path) -> anyhow::Result<cadre::store::Store> {
    cadre::store::Store::open(data_dir).with_context(|| {
        format!(
            "opening {} (a running server holds the database: stop it first)",
            data_dir.display()
        )
    })
}

fn keys(command: KeysCommand) -> anyhow::Result<()> {
    use cadre::tenants::NewKey;

    block_on(async {
        let now = jiff::Timestamp::now();
        match command {
            KeysCommand::Create {
                tenant,
                admin,
                plan,
                metrics,
                expires_at,
                data_dir,
            } => {
                let store = open_store(&data_dir)?;
                let mut new = NewKey::tenant(tenant);
                new.admin = admin;
                new.metrics = metrics;
                new.expires_at = expires_at;
                if let Some(plan) = plan {
                    new.plan = plan;
                }
                let before = cadre::tenants::list_keys(&store).await?;
                let (key, record) = cadre::tenants::issue_key(&store, &new, now).await?;
                render::created_key(&key, &record.info(now));
                if let Some(notice) =
                    cadre::tenants::open_mode_notice(&store, &before, &record).await?
                {
                    eprintln!("note: {notice}");
                }
            }
            KeysCommand::List { data_dir } => {
                let store = open_store(&data_dir)?;
                for k in cadre::tenants::list_keys(&store).await? {
                    println!("{}", render::key_line(&k.info(now)));
                }
            }
            KeysCommand::Revoke { key_id, data_dir } => {
                let store = open_store(&data_dir)?;
                let k = cadre::tenants::revoke_key(&store, &key_id).await?;
                println!("revoked {}", k.key_id);
            }
        }
        Ok(())
    })
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn sessions(command: SessionsCommand) -> anyhow::Result<()> {
    block_on(async {
        match command {
            SessionsCommand::List { data_dir } => {
                let store = open_store(&data_dir)?;
                for s in store.list_sessions().await? {
                    println!("{}", render::session_line(&s));
                }
            }
            SessionsCommand::Show { id, data_dir } => {
                let store = open_store(&data_dir)?;
                render::show(&cadre::conversation::sessions::export(&store, &id).await?)?;
            }
            SessionsCommand::Export { id, data_dir } => {
                let store = open_store(&data_dir)?;
                render::json(&cadre::conversation::sessions::export(&store, &id).await?)?;
            }
            SessionsCommand::Summary { id, data_dir } => {
                let store = open_store(&data_dir)?;
                let summary = cadre::conversation::sessions::summarize(&store, &id).await?;
                render::json(&serde_json::to_value(&summary)?)?;
            }
        }
        Ok(())
    })
}

fn calls(filter: cadre::store::CallFilter, data_dir: PathBuf) -> anyhow::Result<()> {
    block_on(async {
        let store = open_store(&data_dir)?;
        for c in store.calls(filter).await? {
            println!("{}", render::call_line(&c));
        }
        Ok(())
    })
}

fn compact(data_dir: PathBuf) -> anyhow::Result<()> {
    match cadre::store::RedbStore::compact(&data_dir)? {
        None => println!("{}: no store to compact", data_dir.display()),
        Some((before, after)) => println!(
            "{}: {before} bytes -> {after} bytes",
            data_dir.join("cadre.redb").display()
        ),
    }
    Ok(())
}

fn stats(data_dir: PathBuf) -> anyhow::Result<()> {
    block_on(async {
        let store = open_store(&data_dir)?;
        let stats = cadre::http::calls::stats_document(&store).await?;
        render::stats(&serde_json::to_value(stats)?);
        Ok(())
    })
}

fn tools_invoke(
    name: String,
    params: String,
    plan: Option<String>,
    user_id: Option<String>,
    common: Common,
) -> anyhow::Result<()> {
    use cadre::executor::{Arguments, ExecuteTool};
    use cadre::tools::{CallerType, ExecutionContext};

    let params: serde_json::Value =
        serde_json::from_str(&params).context("--params must be JSON")?;
    let plan = match plan {
        Some(p) => Plan::parse(&p).context("--plan must be free, pro or premium")?,
        None => Plan::Free,
    };
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let mut ctx = ExecutionContext::new(
        CallerType::Direct,
        user_id.clone().unwrap_or_else(|| "cli".into()),
    );
    ctx.user_id = user_id;
    ctx.plan = plan;
    let result = block_on(async {
        Ok(runtime
            .executor()
            .execute(ExecuteTool::new(&name, Arguments::Json(params), ctx))
            .await)
    })?;
    render::invoke_result(&serde_json::to_value(&result)?)
}

/// The same loading path as `serve`: the file, then the `CADRE_*`
/// overrides of this environment.
fn config_check(path: PathBuf) -> anyhow::Result<()> {
    if !path.exists() {
        bail!("{} not found", path.display());
    }
    ServerConfig::load(Some(&path), std::env::vars())
        .with_context(|| format!("{} is not a valid server config", path.display()))?;
    println!("ok  {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for in
    /// `--help` (and so in the shell completions).
    #[test]
    fn every_flag_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "cadre", &mut missing);
        assert!(missing.is_empty(), "no --help text: {missing:?}");
        Cli::command().debug_assert();
    }
}
