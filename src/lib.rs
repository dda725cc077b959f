//! cadre: an actor-based runtime for LLM tool calling.
//!
//! A turn flows through the modules in this order:
//!
//! - [`http`]: the axum API; turns requests into calls on the handles below.
//! - [`conversation`]: one actor per chat session; a pure `ConversationMachine`
//!   decides each step of a turn, the actor performs the IO it asks for and
//!   spawns one tool sub-agent per batch of tool calls (`conversation::batch`).
//! - [`model`]: the `ChatModel` trait, the OpenAI-compatible client and the
//!   offline intent router that serves when no endpoint is configured.
//! - [`executor`]: the supervised actor every tool call passes through.
//! - [`tools`]: tool definitions, the registry and the builtin handlers.
//! - [`workflow`]: DAGs of tool and agent nodes; a pure scheduler inside a
//!   runner actor per run.
//! - [`store`]: redb tables and the group-committing writer.
//! - [`metrics`]: counters and histograms for `/metrics`.
//! - [`tenants`]: API keys, tenant isolation and per-tenant config.
//! - [`identity`]: who a call is for (tenant, plan, principal).
//! - [`error_code`]: the table of public error codes; [`retry`]: backoff.
//! - [`mcp`]: MCP servers as tool sources, and cadre as an MCP server.
//! - [`runtime`]: wires the pieces on one tokio runtime shared with actix,
//!   and picks the adapters (in process, or cluster mode's).
//! - [`cluster`]: cluster mode's adapters, plugged into the seams of the
//!   layers below: PostgreSQL behind the store's traits; Redis behind the
//!   executor's `WindowStore` (shared rate-limit windows) and `PermitPool`
//!   (leased concurrency permits), behind `/readyz`'s `Dependency`; the
//!   forwarding of a session's requests to its owner node behind http's
//!   `ToOwner`; the event fan-out between nodes.
//! - [`schedules`]: agent turns and workflow runs started on a cron
//!   expression or an interval, exactly once per slot.
//! - [`webhooks`]: signed events when a background turn or a run ends,
//!   delivered at least once from an outbox written with the turn's end.
//! - [`memory`]: memory across sessions: a tenant's items by namespace
//!   and key, BM25 search, TTL; what the `remember` and `recall` tools use.
//! - [`events`]: the broadcast bus of runtime events.
//! - [`agents`]: agent definitions (agent files); [`server_config`]: the
//!   server's config file.
//!
//! # Layers
//!
//! Imports point down this stack only, and no two modules import each
//! other (what two modules both need moves down into a small module of its
//! own, as [`identity`] did for the store, the tools and the key ring):
//!
//! ```text
//! main / cli                      the binary (cli/, its own package): serve, chat ...
//! runtime, server_config          wiring; the server's config file
//! cluster                         cluster mode's adapters (PostgreSQL, Redis)
//! http                            the API, one file per resource
//! schedules                       turns and runs on a clock, one fire per slot
//! workflow, mcp                   multi-agent DAGs; MCP in and out
//! conversation                    session actors and their tool sub-agents
//! agents                          agent definitions
//! memory                          items across sessions: BM25 search, TTL
//! executor                        the one gate of every tool call
//! tenants                         API keys, per-tenant config
//! webhooks                        signed events from a durable outbox
//! guardrails                      checks before and after the model and tools
//! tools                           definitions, registry, builtin handlers
//! store                           redb
//! model                           the model clients and chat types
//! identity, error_code, retry     who calls; the public error codes; backoff
//! events, metrics                 the shared sinks
//! ```
//!
//! `tests/layers.rs` reads this table and fails on any import that points
//! up it, or on two modules that import each other.

pub mod agents;
pub mod cluster;
pub mod conversation;
pub mod error_code;
pub mod events;
pub mod executor;
pub mod guardrails;
pub mod http;
pub mod identity;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod retry;
pub mod runtime;
pub mod schedules;
pub mod server_config;
pub mod store;
pub mod tenants;
pub mod tools;
pub mod webhooks;
pub mod workflow;

pub use runtime::{Runtime, RuntimeBuilder, RuntimeError};
