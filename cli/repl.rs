//! The interactive chat loop (`cadre chat`), shared by the local path
//! (in-process runtime) and the remote one (`--url`).

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
            "/summary" => summary().and_then(|s| crate::render::json(&s)),
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
