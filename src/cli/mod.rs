//! The CLI's own pieces (bin-private: declared from `main.rs` only, never
//! from `lib.rs`).
//!
//! - [`render`]: how each read command prints what it got. The local path
//!   (redb file, in-process runtime) and the remote path (`--url`, the HTTP
//!   API) hand it the same data, so both print the same thing.
//! - [`remote`]: the client side of `--url`/`--api-key`: one request (or
//!   an SSE stream) per command, JSON errors printed as `CODE (HTTP n):
//!   message` with a non-zero exit.
//! - [`telemetry`]: the tracing subscriber, and OTLP export of the spans
//!   (feature `otlp`).

pub mod remote;
pub mod render;
pub mod telemetry;

use std::io::{BufRead, Write};

use serde_json::Value;

/// The interactive chat loop, local or remote: `turn` runs one turn
/// (streaming it), `summary` and `tools` answer `/summary` and `/tools`.
pub fn repl(
    id: &str,
    agent: &str,
    mut turn: impl FnMut(String, bool) -> anyhow::Result<()>,
    mut summary: impl FnMut() -> anyhow::Result<Value>,
    mut tools: impl FnMut() -> anyhow::Result<Vec<(String, String)>>,
) -> anyhow::Result<()> {
    println!("session {id} with agent {agent}; /summary, /tools, /quit");
    let stdin = std::io::stdin();
    loop {
        print!("you> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let result = match line.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/summary" => summary().and_then(|s| render::json(&s)),
            "/tools" => tools().map(|tools| {
                for (name, description) in tools {
                    println!("{name:<24} {description}");
                }
            }),
            text => turn(text.to_string(), true),
        };
        if let Err(e) = result {
            println!("error: {e:#}");
        }
    }
    Ok(())
}
