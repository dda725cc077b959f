//! The `cadre` command line: `serve` runs the HTTP server, `chat` runs one
//! turn in-process, `tools` lists and checks tool definitions. Thin:
//! everything it does is the library's.

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
    #[command(subcommand)]
    command: Command,
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
    /// Run one turn in-process and print the answer and each tool call.
    Chat {
        #[arg(long, default_value = "assistant")]
        agent: String,
        /// Plan of the session: free, pro or premium.
        #[arg(long, default_value = "free")]
        plan: String,
        /// The message to send.
        message: String,
        #[command(flatten)]
        common: Common,
    },
    /// List or check tool definitions.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
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
        Command::Tools { .. } => "warn",
        _ => "info,tower_http=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Serve { addr, common } => serve(addr, common),
        Command::Chat {
            agent,
            plan,
            message,
            common,
        } => chat(agent, plan, message, common),
        Command::Tools {
            command: ToolsCommand::List { plan, agents },
        } => tools_list(plan, agents),
        Command::Tools {
            command: ToolsCommand::Check { dir },
        } => tools_check(dir.unwrap_or_else(|| PathBuf::from("./agents/tools"))),
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

fn chat(agent: String, plan: String, message: String, common: Common) -> anyhow::Result<()> {
    let plan = Plan::parse(&plan).context("--plan must be free, pro or premium")?;
    let runtime = runtime(&common)?.start().context("starting cadre")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = rt.block_on(async {
        let sessions = runtime.sessions();
        let session = sessions
            .create(NewSession {
                agent,
                plan,
                ..Default::default()
            })
            .await?;
        sessions.send_message(&session.id, message).await
    })?;
    for call in &outcome.tool_calls {
        let result = match (&call.output, &call.error) {
            (Some(out), _) => format!("ok: {out}"),
            (None, Some(err)) => format!("failed: {err}"),
            (None, None) => "no output".into(),
        };
        println!("[tool] {}({}) -> {result}", call.name, call.arguments);
    }
    println!("{}", outcome.answer);
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
