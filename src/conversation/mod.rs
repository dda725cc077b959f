//! Conversations: one actor per chat session, driven by a pure machine.
//!
//! http ──▶ [`Sessions`] ──▶ [`actor::Conversation`] ──▶ model / ToolSubAgent / store
//!
//! - [`machine`]: the decisions of a turn (no IO), its record ([`machine::TurnRecord`])
//!   and phase; [`queue`]: the session's queue and multitask rule, part of the
//!   machine; [`settings`]: one turn's settings; [`context`]: the five prompt layers.
//! - [`resume`]: what is known of a batch's calls when a turn is taken up again
//!   (after a restart, or a person's decision).
//! - [`actor`]: the actor that performs them; [`batch`]: the tool sub-agent it
//!   spawns per batch of tool calls.
//! - [`sessions`]: the registry of live conversations and the session API;
//!   [`visitor`]: the visitor/operator protocol on it (auto-response, operator messages).
//! - [`delegation`]: an agent asks another (`ask_<agent>`): a turn of a
//!   child conversation, linked to the parent, as the call's result.
//! - [`fork`]: a new session from another's history up to one of its
//!   turns, and the state after each turn (issue #34).
//! - [`lineage`]: how the sessions of agents asking agents are linked.
//! - [`handoff`]: an agent hands the conversation to another
//!   (`transfer_to_<agent>`): the session's active agent from then on.
//! - [`summary`]: tool usage summaries.
//! - [`budget`]: the monthly token budget gate every turn passes first;
//!   [`storage`]: a tenant's share of the store (write rate, storage quota),
//!   checked before a message is stored.

pub mod actor;
pub mod auto_respond;
pub mod batch;
pub mod budget;
pub mod context;
pub mod delegation;
pub mod fork;
pub mod handoff;
pub mod lineage;
pub mod machine;
pub mod queue;
pub mod resume;
pub mod sessions;
pub mod settings;
pub mod storage;
pub mod summary;
pub mod turn_rows;
pub mod visitor;

pub use actor::TurnError;
pub use machine::{CallReport, TurnOutcome};
pub use sessions::{
    MAX_METADATA_BYTES, MAX_SESSION_ID_BYTES, NewSession, SessionError, SessionLimits,
    SessionSummary, Sessions, TurnEnd,
};
pub use summary::ToolUsageSummary;
