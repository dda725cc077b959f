//! The event bus: what happens in the runtime, for anyone listening.
//!
//! registry (loads, reloads) ─┐
//! executor (calls)          ─┤
//! MCP clients (up / down)   ─┼─▶ EventBus (tokio broadcast) ─▶ subscribe() / GET /v1/events (SSE)
//!
//! In cluster mode `cluster::fanout` also sends every event published here
//! to the other nodes and publishes theirs here with [`EventBus::publish_remote`]
//! (`node` names where it happened; a local event has none).
//!
//! Publishing never blocks and never fails: with no subscriber an event is
//! dropped; a subscriber that falls more than [`CAPACITY`] events behind
//! misses the oldest (and is told how many, by the broadcast channel).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// Events buffered per subscriber before the slowest one starts losing them.
pub const CAPACITY: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A tool was in the registry at startup.
    ToolLoaded {
        tool: String,
        version: String,
        source: String,
    },
    ToolAdded {
        tool: String,
        version: String,
        source: String,
    },
    ToolUpdated {
        tool: String,
        version: String,
        source: String,
    },
    ToolRemoved {
        tool: String,
    },
    ReloadStarted,
    ReloadCompleted {
        tools: usize,
        errors: usize,
    },
    /// A tool or agent file could not be loaded (the last good version, if
    /// any, stays).
    LoadError {
        file: String,
        line: Option<usize>,
        message: String,
    },
    /// An agent file was added to the agents folder of a running server.
    AgentAdded {
        agent: String,
        source: String,
    },
    /// An agent file changed: sessions of it use it from their next turn.
    AgentUpdated {
        agent: String,
        source: String,
    },
    /// An agent file was removed: no new sessions of it.
    AgentRemoved {
        agent: String,
    },
    /// A call was refused by parameter validation.
    ValidationError {
        tool: String,
        fields: Vec<String>,
    },
    ExecutionStarted {
        tool: String,
        caller_type: String,
        conversation_id: Option<String>,
        workflow_id: Option<String>,
    },
    ExecutionCompleted {
        tool: String,
        execution_time_ms: u64,
        cached: bool,
    },
    ExecutionFailed {
        tool: String,
        error_type: String,
        error: String,
    },
    /// An MCP server of `agents/mcp.toml` answered and its tools were listed.
    McpServerUp {
        server: String,
        tools: usize,
    },
    /// An MCP server's connection ended or could not be made; its tools
    /// stay listed, unavailable, until it is back.
    McpServerDown {
        server: String,
        reason: String,
    },
    /// A guardrail blocked (`action = "block"`), redacted or rewrote what
    /// it checked at `stage`; `tool` on tool stages. Never the text checked.
    GuardrailTripped {
        guardrail: String,
        stage: String,
        action: String,
        session_id: Option<String>,
        turn_id: Option<String>,
        tool: Option<String>,
    },
}

impl EventKind {
    /// The SSE event name: the `type` tag.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::ToolLoaded { .. } => "tool_loaded",
            EventKind::ToolAdded { .. } => "tool_added",
            EventKind::ToolUpdated { .. } => "tool_updated",
            EventKind::ToolRemoved { .. } => "tool_removed",
            EventKind::ReloadStarted => "reload_started",
            EventKind::ReloadCompleted { .. } => "reload_completed",
            EventKind::LoadError { .. } => "load_error",
            EventKind::AgentAdded { .. } => "agent_added",
            EventKind::AgentUpdated { .. } => "agent_updated",
            EventKind::AgentRemoved { .. } => "agent_removed",
            EventKind::ValidationError { .. } => "validation_error",
            EventKind::ExecutionStarted { .. } => "execution_started",
            EventKind::ExecutionCompleted { .. } => "execution_completed",
            EventKind::ExecutionFailed { .. } => "execution_failed",
            EventKind::McpServerUp { .. } => "mcp_server_up",
            EventKind::McpServerDown { .. } => "mcp_server_down",
            EventKind::GuardrailTripped { .. } => "guardrail_tripped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Its place in this node's sequence (set when published here; not
    /// sent to other nodes, which number it in theirs).
    #[serde(skip)]
    pub seq: u64,
    pub at: Timestamp,
    /// The cluster node it happened on, when that is another node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    /// The last [`CAPACITY`] events, for subscribers that reconnect.
    recent: std::sync::Arc<std::sync::Mutex<Recent>>,
    /// This process's id: event ids of another process (or node) are not
    /// this one's.
    boot: std::sync::Arc<str>,
}

#[derive(Default)]
struct Recent {
    next: u64,
    events: std::collections::VecDeque<Event>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    pub fn new() -> Self {
        EventBus {
            tx: broadcast::channel(CAPACITY).0,
            recent: Default::default(),
            boot: uuid::Uuid::now_v7().simple().to_string()[20..].into(),
        }
    }

    pub fn publish(&self, kind: EventKind) {
        self.send(Event {
            seq: 0,
            at: Timestamp::now(),
            node: None,
            kind,
        });
    }

    /// Publishes an event that happened on another node (`event.node`).
    pub fn publish_remote(&self, event: Event) {
        self.send(event);
    }

    /// Numbers `event`, keeps it among the recent ones and sends it, under
    /// one lock: the recent events and the broadcast have one order.
    fn send(&self, mut event: Event) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        event.seq = recent.next;
        recent.next += 1;
        if recent.events.len() == CAPACITY {
            recent.events.pop_front();
        }
        recent.events.push_back(event.clone());
        // Nobody listening is fine.
        let _ = self.tx.send(event);
    }

    /// This process's id, the first part of its events' SSE ids.
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// The kept events after `seq`, oldest first; `None` when some of them
    /// are no longer kept.
    pub fn since(&self, seq: u64) -> Option<Vec<Event>> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let first = recent.events.front().map_or(recent.next, |e| e.seq);
        if seq.saturating_add(1) < first {
            return None;
        }
        Some(
            recent
                .events
                .iter()
                .filter(|e| e.seq > seq)
                .cloned()
                .collect(),
        )
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_get_events_in_order_with_their_type_tag() {
        let bus = EventBus::new();
        bus.publish(EventKind::ReloadStarted);
        let mut rx = bus.subscribe();
        bus.publish(EventKind::ToolRemoved { tool: "x".into() });
        bus.publish(EventKind::ReloadCompleted {
            tools: 1,
            errors: 0,
        });
        let first = rx.recv().await.unwrap();
        assert_eq!(first.kind.name(), "tool_removed");
        let json = serde_json::to_value(&first).unwrap();
        assert_eq!(json["type"], "tool_removed");
        assert_eq!(json["tool"], "x");
        assert_eq!(rx.recv().await.unwrap().kind.name(), "reload_completed");
    }

    #[test]
    fn a_guardrail_event_is_named_by_its_type_tag() {
        let kind = EventKind::GuardrailTripped {
            guardrail: "pii".into(),
            stage: "output".into(),
            action: "redact".into(),
            session_id: Some("s1".into()),
            turn_id: None,
            tool: None,
        };
        let json = serde_json::to_value(&kind).unwrap();
        assert_eq!(json["type"], kind.name());
        assert_eq!(json["type"], "guardrail_tripped");
        assert_eq!(json["stage"], "output");
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kind);
    }
}
