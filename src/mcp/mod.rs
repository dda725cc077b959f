//! MCP (Model Context Protocol), both ways, on rmcp.
//!
//! agents/mcp.toml ──[`config`]──▶ [`client`]: each server's tools as `server.tool` in the ToolRegistry
//!                                  ├─ every connection under [`bounded`] (server requests, send deadlines)
//!                                  └─ stdio servers: a child process group behind [`stdio`]
//! MCP clients ──stdio (`cadre mcp`) | `/mcp` (streamable HTTP)──▶ [`server`]: cadre's tools and agents
//!
//! Both directions go through the executor: MCP tools are registry tools
//! with an `mcp` entry, and MCP callers are direct callers. A server's tool
//! offered again by cadre keeps its `outputSchema` and its content blocks
//! ([`content`]).
//!
//! Layer: below the HTTP API and the runtime, which hand down what it needs
//! (the registry, executor and sessions as [`McpServerDeps`], the body limit
//! of `/mcp`) and never the other way: the stdio entry point of `cadre mcp`
//! lives with the runtime (`Runtime::serve_mcp_stdio`), which calls
//! [`server::serve_stdio`].
//!
//! Names: registry, records and the API use `server.tool`; OpenAI-compatible
//! endpoints accept only `^[a-zA-Z0-9_-]{1,64}$`, so the model sees
//! `server__tool` ([`crate::model::wire_name`]), mapped back on its reply.
//!
//! Crate: rmcp, the official Rust SDK of the protocol (client and server,
//! stdio and streamable HTTP, on tokio, hyper/tower and reqwest as we use
//! them), without default features: no proc macros (cadre's tool set is
//! dynamic), no OAuth; its build script only configures git hooks inside
//! its own repository and fetches nothing.

pub mod bounded;
pub mod client;
pub mod config;
pub mod content;
pub mod server;
pub mod stdio;

pub use client::McpClients;
pub use config::{McpServerConfig, McpTransport};
pub use server::{CadreMcp, Caller, McpServerDeps};
