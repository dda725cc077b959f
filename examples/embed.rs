//! Embedding cadre in another Rust program: a custom tool written as a
//! closure, a model client of our own (here a tiny rule-based one; any type
//! implementing `ChatModel` works, e.g. a client for a provider cadre does
//! not speak), one turn, no HTTP server.
//!
//! Run: `cargo run --release --example embed`

use std::sync::Arc;

use cadre::Runtime;
use cadre::conversation::NewSession;
use cadre::identity::Scope;
use cadre::model::{ChatModel, ChatRequest, ChatResponse, ModelError, Role, ToolCall};
use cadre::tools::{FnHandler, ToolDefinition, ToolError};
use serde_json::{Value, json};

/// Asks for `shout` once, then answers with what it returned.
struct RuleModel;

#[async_trait::async_trait]
impl ChatModel for RuleModel {
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let last = request
            .messages
            .last()
            .expect("a conversation has messages");
        let (content, tool_calls) = match last.role {
            Role::Tool => (last.content.clone(), vec![]),
            _ => (
                None,
                vec![ToolCall {
                    id: "call_1".into(),
                    name: "shout".into(),
                    arguments: json!({"text": last.content}).to_string(),
                }],
            ),
        };
        Ok(ChatResponse {
            content,
            tool_calls,
            usage: None,
            finish_reason: None,
        })
    }

    fn describe(&self) -> String {
        "rule-based example model".into()
    }
}

fn main() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let agents = tempfile::tempdir()?;
    std::fs::write(
        agents.path().join("shouter.toml"),
        "name = \"shouter\"\nsystem_prompt = \"You shout.\"\ntools = [\"shout\"]\n",
    )?;
    let shout = ToolDefinition::new(
        "shout",
        "Upper-case a text.",
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    );
    let runtime = Runtime::builder()
        .data_dir(data.path())
        .agents_dir(agents.path())
        .model(Arc::new(RuleModel))
        .tool(
            shout,
            Arc::new(FnHandler(|params: Value| async move {
                let text = params["text"].as_str().unwrap_or_default();
                Ok::<_, ToolError>(json!(text.to_uppercase()))
            })),
        )
        .start()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = rt.block_on(async {
        let sessions = runtime.sessions();
        let session = sessions
            .create(NewSession {
                agent: "shouter".into(),
                ..Default::default()
            })
            .await?;
        // An embedder owns the data dir: its scope reaches every session
        // (a server's handlers use the caller's tenant's scope instead).
        sessions
            .send_message(
                &Scope::runtime(),
                &session.id,
                "hello from rust".into(),
                None,
            )
            .await
    })?;
    println!("{}", outcome.answer);
    assert_eq!(outcome.answer, "HELLO FROM RUST");
    Ok(())
}
