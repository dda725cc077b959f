//! cadre: an actor-based runtime for LLM tool calling.
//!
//! A turn flows through the modules in this order:
//!
//! - [`http`]: the axum API; turns requests into calls on the handles below.
//! - [`conversation`]: one actor per chat session; a pure `ConversationMachine`
//!   decides each step of a turn, the actor performs the IO it asks for.
//! - [`model`]: the `ChatModel` trait, the OpenAI-compatible client and the
//!   offline intent router that serves when no endpoint is configured.
//! - [`tools`]: tool definitions, the registry, builtin handlers and the
//!   per-batch `ToolSubAgent` actor.
//! - [`executor`]: the supervised actor every tool call passes through.
//! - [`workflow`]: DAGs of tool and agent nodes; a pure scheduler inside a
//!   runner actor per run.
//! - [`store`]: redb tables and the group-committing writer.
//! - [`metrics`]: counters and histograms for `/metrics`.
//! - [`tenants`]: API keys, tenant isolation and per-tenant config.
//! - [`mcp`]: MCP servers as tool sources, and cadre as an MCP server.
//! - [`runtime`]: wires the pieces on one tokio runtime shared with actix.
//! - [`events`]: the broadcast bus of runtime events.
//! - [`config`]: agent definitions; [`server_config`]: the server's config file.

pub mod config;
pub mod conversation;
pub mod events;
pub mod executor;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod runtime;
pub mod server_config;
pub mod store;
pub mod tenants;
pub mod tools;
pub mod workflow;

pub use runtime::{Runtime, RuntimeBuilder, RuntimeError};
