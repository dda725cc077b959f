//! cadre's sample domain, out of the runtime: the trading copilot's tools
//! (seed 000: market data, news, ML signals, paper orders, alerts,
//! watchlists, risk) and the brokerage data layer's (seed 004: positions,
//! activity, quotes, each answer with a citable `source_id`).
//!
//! Place in the data flow: beside the runtime, not in it. The `cadre`
//! binary (cli/main.rs) registers [`tools`] at start through
//! `RuntimeBuilder::tool_family`, the same public API an embedder uses;
//! the runtime then treats them like any tool: the executor enforces what
//! each definition declares (plan, rate limit, `side_effects`, `cache`),
//! and the offline model learns their keywords from the definitions.
//! Their data comes from the agents folder (`agents/data/trading.json`,
//! `agents/data/brokerage.json`) and per-user state from the store's
//! documents, both handed over in the [`BuiltinContext`].

pub mod brokerage;
pub mod trading;

use cadre::tools::builtin::{BuiltinContext, ToolEntry};

/// Every tool of the sample domain, for `RuntimeBuilder::tool_family`.
pub fn tools(ctx: &BuiltinContext) -> Vec<ToolEntry> {
    let mut tools = brokerage::tools(ctx);
    tools.extend(trading::tools(ctx));
    tools
}
