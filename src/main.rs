//! The `cadre` command line: `serve` runs the HTTP server, `chat` runs one
//! turn in-process, `tools` lists and checks tool definitions, `workflow`
//! lists workflows and runs one in-process with a line per node event.
//! Thin: everything it does is the library's.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use cadre::Runtime;
use cadre::conversation::NewSession;
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

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080", env = "CADRE_ADDR")]
        addr: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
    /// Chat in-process: one turn with MESSAGE, or an interactive session
    /// without it (`/summary`, `/tools`, `/quit`).
    Chat {
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
    /// API keys of tenants (work on the data dir: stop the server first).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Read sessions from the data dir.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Tool call records, newest first.
    Calls {
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        tool: Option<String>,
        #[arg(long)]
        workflow: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Per-tool call counters.
    Stats {
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// List workflows, or run one in-process.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
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
        #[arg(long)]
        tenant: String,
        /// May manage tenant configs and read runtime-wide stats and events.
        #[arg(long)]
        admin: bool,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// List keys (ids and tenants; never the keys).
    List {
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Revoke a key by id.
    Revoke {
        key_id: String,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum SessionsCommand {
    /// One line per session: id, tenant, agent, created.
    List {
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// A session and its messages, readably.
    Show {
        id: String,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// A session, its messages, summary and call records as one JSON document.
    Export {
        id: String,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Print a session's summary as JSON.
    Summary {
        id: String,
        #[arg(long, default_value = "./data", env = "CADRE_DATA_DIR")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// List the tools a server with these agents would offer.
    List {
        /// Only the tools this plan may call.
        #[arg(long)]
        plan: Option<String>,
        #[arg(long, default_value = "./agents", env = "CADRE_AGENTS_DIR")]
        agents: PathBuf,
    },
    /// Check tool files (default: ./agents/tools); exits non-zero on errors.
    Check { dir: Option<PathBuf> },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Tools { .. }
        | Command::Workflow { .. }
        | Command::Keys { .. }
        | Command::Sessions { .. }
        | Command::Calls { .. }
        | Command::Stats { .. } => "warn",
        _ => "info,tower_http=warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    // A log line that cannot be written (stderr on a full disk) is dropped:
    // the default reports it with `eprintln!`, which panics when stderr
    // fails, and would take down whichever thread was logging.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    match cli.command {
        Command::Serve { addr, common } => serve(addr, common),
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
        Command::Keys { command } => keys(command),
        Command::Sessions { command } => sessions(command),
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

fn runtime(common: &Common) -> anyhow::Result<cadre::RuntimeBuilder> {
    let config = ServerConfig::load(common.config.as_deref(), std::env::vars())?;
    Ok(Runtime::builder()
        .data_dir(&common.data_dir)
        .agents_dir(&common.agents)
        .config(config))
}

fn serve(addr: SocketAddr, common: Common) -> anyhow::Result<()> {
    let runtime = runtime(&common)?
        .listen(addr)
        .handle_signals(true)
        .start()
        .context("starting cadre")?;
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
    use std::io::{BufRead, Write};

    use cadre::conversation::actor::TurnEvent;

    let plan = Plan::parse(&plan).context("--plan must be free, pro or premium")?;
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sessions = runtime.sessions();
    let id = rt.block_on(async {
        match session {
            Some(id) => sessions.get(&id).await.map(|s| s.id),
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
            let work = sessions.send_message_with(&id, text, Some(tx));
            tokio::pin!(work);
            let mut streamed = false;
            let outcome = loop {
                tokio::select! {
                    result = &mut work => break result,
                    Some(event) = rx.recv() => match event {
                        TurnEvent::TurnStarted { .. } if live => {
                            eprint!("… thinking\r");
                        }
                        TurnEvent::ToolCallStarted { name, arguments, .. } => {
                            println!("[tool] {name}({arguments}) …");
                        }
                        TurnEvent::ToolCallCompleted { call } => {
                            let result = match (&call.output, &call.error) {
                                (Some(out), _) => format!("ok: {out}"),
                                (None, Some(err)) => format!("failed: {err}"),
                                (None, None) => "no output".into(),
                            };
                            println!("[tool] {} -> {result}", call.name);
                        }
                        TurnEvent::ModelDelta { text } if live => {
                            streamed = true;
                            print!("{text}");
                            let _ = std::io::stdout().flush();
                        }
                        _ => {}
                    },
                }
            };
            let outcome = outcome?;
            if streamed {
                println!();
            } else {
                println!("{}", outcome.answer);
            }
            Ok(())
        })
    };
    if let Some(message) = message {
        return turn(message, false);
    }
    println!("session {id} with agent {agent}; /summary, /tools, /quit");
    let stdin = std::io::stdin();
    loop {
        print!("you> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/summary" => {
                let summary = rt.block_on(sessions.summary(&id))?;
                println!("{}", serde_json::to_string_pretty(&summary)?);
            }
            "/tools" => {
                let session = rt.block_on(sessions.get(&id))?;
                if let Some(a) = sessions.agents().get(&session.agent) {
                    for spec in a.tool_specs(runtime.registry(), session.plan) {
                        println!("{:<24} {}", spec.name, spec.description);
                    }
                }
            }
            text => {
                if let Err(e) = turn(text.to_string(), true) {
                    println!("error: {e}");
                }
            }
        }
    }
    Ok(())
}

fn workflow_list(common: Common) -> anyhow::Result<()> {
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let workflows = runtime.workflows();
    for w in workflows.definitions() {
        let nodes: Vec<String> = w
            .nodes
            .iter()
            .map(|n| format!("{}({})", n.id, n.kind()))
            .collect();
        println!("{:<20} {}", w.name, w.description);
        println!("{:<20} nodes: {}", "", nodes.join(", "));
    }
    let errors = workflows.load_errors();
    for e in &errors {
        eprintln!("error: {}", e.message);
    }
    if !errors.is_empty() {
        bail!("{} workflow file(s) did not load", errors.len());
    }
    Ok(())
}

fn workflow_run(
    name: String,
    input: String,
    user_id: Option<String>,
    common: Common,
) -> anyhow::Result<()> {
    use cadre::workflow::{StartRun, WorkflowEventKind as Kind};
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
            match &event.kind {
                Kind::RunStarted { .. } => {}
                Kind::NodeStarted { node } => println!("{at} {node:<16} started"),
                Kind::NodeSucceeded { node, attempts } => {
                    println!("{at} {node:<16} succeeded ({attempts} attempt(s))")
                }
                Kind::NodeFailed { node, error, .. } => {
                    println!("{at} {node:<16} failed: {error}")
                }
                Kind::NodeSkipped { node, reason } => {
                    println!("{at} {node:<16} skipped: {reason}")
                }
                Kind::ItemStarted { node, item } => {
                    println!("{at} {:<16} started", format!("{node}[{item}]"))
                }
                Kind::ItemSucceeded { node, item } => {
                    println!("{at} {:<16} succeeded", format!("{node}[{item}]"))
                }
                Kind::ItemFailed { node, item, error } => {
                    println!("{at} {:<16} failed: {error}", format!("{node}[{item}]"))
                }
                Kind::RunFinished { status, .. } => {
                    println!("{at} run {}", status.as_str());
                    break;
                }
            }
        }
        workflows.wait(&run.id).await
    })?;
    let shown = match &run.output {
        Some(output) => output.clone(),
        None => serde_json::json!(
            run.nodes
                .iter()
                .map(|(id, n)| (id.clone(), n.output.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
        ),
    };
    println!("{}", serde_json::to_string_pretty(&shown)?);
    if let Some(error) = &run.error {
        bail!("run {} {}: {error}", run.id, run.status.as_str());
    }
    Ok(())
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
        let limit = d
            .rate_limit
            .per_minute
            .map(|n| format!(" {n}/min"))
            .unwrap_or_default();
        println!(
            "{:<24} {:<8} {:<10}{limit}  {}",
            d.name,
            d.required_plan.as_str(),
            d.category,
            d.description
        );
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match command {
            KeysCommand::Create {
                tenant,
                admin,
                data_dir,
            } => {
                let store = open_store(&data_dir)?;
                let (key, record) = cadre::tenants::create_key(&store, &tenant, admin).await?;
                println!("{key}");
                eprintln!(
                    "key {} for tenant {}{}: shown once, store it now",
                    record.key_id,
                    record.tenant,
                    if admin { " (admin)" } else { "" }
                );
            }
            KeysCommand::List { data_dir } => {
                let store = open_store(&data_dir)?;
                for k in cadre::tenants::list_keys(&store).await? {
                    let state = match k.revoked_at {
                        Some(t) => format!("revoked {t}"),
                        None => "active".into(),
                    };
                    let admin = if k.admin { "admin" } else { "" };
                    println!(
                        "{:<14} {:<20} {admin:<6} {} {state}",
                        k.key_id, k.tenant, k.created_at
                    );
                }
            }
            KeysCommand::Revoke { key_id, data_dir } => {
                let store = open_store(&data_dir)?;
                let k = cadre::tenants::revoke_key(&store, &key_id).await?;
                println!("revoked {} (tenant {})", k.key_id, k.tenant);
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
                    println!(
                        "{}  {:<12} {:<18} {}",
                        s.id, s.tenant, s.agent, s.created_at
                    );
                }
            }
            SessionsCommand::Show { id, data_dir } => {
                let store = open_store(&data_dir)?;
                let session = store
                    .get_session(&id)
                    .await?
                    .with_context(|| format!("no session with id '{id}'"))?;
                println!(
                    "session {} (agent {}, tenant {})",
                    session.id, session.agent, session.tenant
                );
                for m in store.messages(&id).await? {
                    let role = format!("{:?}", m.message.role).to_lowercase();
                    let who = m
                        .message
                        .name
                        .as_deref()
                        .map(|n| format!(" {n}"))
                        .unwrap_or_default();
                    let text = match (&m.message.content, m.message.tool_calls.is_empty()) {
                        (_, false) => m
                            .message
                            .tool_calls
                            .iter()
                            .map(|c| format!("→ {}({})", c.name, c.arguments))
                            .collect::<Vec<_>>()
                            .join(" "),
                        (Some(c), true) => c.clone(),
                        (None, true) => String::new(),
                    };
                    println!("[{:>4}] {role}{who}: {text}", m.seq);
                }
            }
            SessionsCommand::Export { id, data_dir } => {
                let store = open_store(&data_dir)?;
                let session = store
                    .get_session(&id)
                    .await?
                    .with_context(|| format!("no session with id '{id}'"))?;
                let doc = serde_json::json!({
                    "session": session,
                    "messages": store.messages(&id).await?,
                    "summary": store.get_summary(&id).await?,
                    "calls": store.calls_for_conversation(&id).await?,
                });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            }
            SessionsCommand::Summary { id, data_dir } => {
                let store = open_store(&data_dir)?;
                let summary = cadre::conversation::sessions::summarize(&store, &id).await?;
                println!("{}", serde_json::to_string_pretty(&summary)?);
            }
        }
        Ok(())
    })
}

fn calls(filter: cadre::store::CallFilter, data_dir: PathBuf) -> anyhow::Result<()> {
    block_on(async {
        let store = open_store(&data_dir)?;
        for c in store.calls(filter).await? {
            let outcome = if c.is_success {
                "ok".to_string()
            } else {
                c.error_type.clone().unwrap_or_else(|| "failed".into())
            };
            println!(
                "{} {:<22} {:<18} {:>6} ms  {} {}",
                c.created_at,
                c.tool_name,
                outcome,
                c.execution_time_ms,
                c.caller_type,
                c.conversation_id.or(c.workflow_id).unwrap_or_default()
            );
        }
        Ok(())
    })
}

fn stats(data_dir: PathBuf) -> anyhow::Result<()> {
    block_on(async {
        let store = open_store(&data_dir)?;
        println!(
            "{:<24} {:>8} {:>8} {:>8} {:>10}",
            "tool", "calls", "ok", "failed", "avg ms"
        );
        for (name, s) in store.all_tool_stats().await? {
            let avg = if s.total_calls > 0 {
                s.total_execution_time_ms as f64 / s.total_calls as f64
            } else {
                0.0
            };
            println!(
                "{name:<24} {:>8} {:>8} {:>8} {avg:>10.1}",
                s.total_calls, s.successful_calls, s.failed_calls
            );
        }
        Ok(())
    })
}
