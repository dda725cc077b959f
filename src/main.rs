//! The `cadre` command line: `serve` runs the HTTP server, `chat` runs one
//! turn in-process. Thin: everything it does is the library's.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use cadre::Runtime;
use cadre::conversation::NewSession;

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
    /// Folder of agent definitions (*.toml).
    #[arg(long, default_value = "./agents", env = "CADRE_AGENTS_DIR")]
    agents: PathBuf,
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
        /// The message to send.
        message: String,
        #[command(flatten)]
        common: Common,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve { addr, common } => serve(addr, common),
        Command::Chat {
            agent,
            message,
            common,
        } => chat(agent, message, common),
    }
}

fn serve(addr: SocketAddr, common: Common) -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .data_dir(&common.data_dir)
        .agents_dir(&common.agents)
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

fn chat(agent: String, message: String, common: Common) -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .data_dir(&common.data_dir)
        .agents_dir(&common.agents)
        .start()
        .context("starting cadre")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = rt.block_on(async {
        let sessions = runtime.sessions();
        let session = sessions
            .create(NewSession {
                agent,
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
