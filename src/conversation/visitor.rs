//! The visitor/operator protocol of a session: who answers a visitor, and
//! how a person's messages are stored.
//!
//! http/ws (frames) ──Content::new──▶ Sessions::visitor_message ──▶ VisitorMessage { decision }
//!     VisitorMessage::deliver(events) ──▶ Delivered::Stored { seq }   (record_message, no turn)
//!                                     └─▶ Delivered::Turn(StartedTurn) (response delay, then start_turn)
//! http/ws ──▶ Sessions::operator_message ──▶ record_message (assistant, named `operator:<id>`)
//! http/ws ──▶ Sessions::set_operator (assign / unassign)
//!
//! Owns: the auto-response decision for a visitor's message
//! ([`should_auto_respond`]: the tenant's config and whether an operator is
//! assigned), the tenant's `response_delay_ms` before the turn, and the
//! shape of stored person messages. Does not: read or write frames, rate
//! limits or frame sizes (the transport's), or run the turn itself: every
//! turn starts through [`Sessions::start_turn`], the one entry point.
//!
//! Decisions:
//! - A visitor's message is decided, then delivered, in two steps: the
//!   transport tells the client the decision (`auto_respond`) before the
//!   response delay passes and the turn's events start, as it always did.
//! - Content is checked once, when the transport builds a [`Content`]
//!   (not blank, at most [`super::sessions::MAX_CONTENT_BYTES`], the rule of every turn):
//!   a message stored without a turn obeys it too, and the check comes
//!   before any other, so a frame's faults are reported in the same order.
//! - An operator message without an `operator_id` is named after the
//!   session's assigned operator, else `operator:operator`.

use std::time::Duration;

use super::actor::TurnSink;
use super::auto_respond::{Decision, should_auto_respond};
use super::sessions::{SessionError, Sessions, StartedTurn, check_content};
use crate::identity::Scope;
use crate::model::ChatMessage;

/// A message's content, checked: not blank, at most [`super::sessions::MAX_CONTENT_BYTES`].
#[derive(Debug, Clone)]
pub struct Content(String);

impl Content {
    pub fn new(content: String) -> Result<Content, SessionError> {
        check_content(&content)?;
        Ok(Content(content))
    }
}

/// A visitor's message, decided ([`Self::decision`]) but not yet acted on.
#[must_use = "a visitor message is stored or answered only once delivered"]
pub struct VisitorMessage {
    sessions: Sessions,
    scope: Scope,
    session: String,
    content: String,
    delay: Duration,
    /// Whether the model answers, and why (sent to the client as is).
    pub decision: Decision,
}

/// What became of a visitor's message.
pub enum Delivered {
    /// Stored without a turn, at this seq.
    Stored { seq: u64 },
    /// Handed to the conversation as a turn.
    Turn(StartedTurn),
}

impl Sessions {
    /// Decides whether a visitor's message to session `id` within `scope`
    /// gets a model turn; nothing is stored yet (see [`VisitorMessage::deliver`]).
    pub async fn visitor_message(
        &self,
        scope: &Scope,
        id: &str,
        content: Content,
    ) -> Result<VisitorMessage, SessionError> {
        let session = self.get(scope, id).await?;
        let config = self.tenant_config(&session.tenant).await?;
        let operator = session
            .metadata
            .get("operator_id")
            .is_some_and(|v| !v.is_null());
        let decision = should_auto_respond(&config, operator);
        tracing::info!(session = %id, respond = decision.respond, reason = decision.reason, "auto-response decision");
        Ok(VisitorMessage {
            sessions: self.clone(),
            scope: scope.clone(),
            session: id.to_string(),
            content: content.0,
            delay: Duration::from_millis(config.response_delay_ms),
            decision,
        })
    }

    /// Stores an operator's reply to session `id` within `scope` (an assistant
    /// message named `operator:<id>`, no model turn); its seq.
    /// `operator_id` defaults to the session's assigned operator.
    pub async fn operator_message(
        &self,
        scope: &Scope,
        id: &str,
        content: Content,
        operator_id: Option<String>,
    ) -> Result<u64, SessionError> {
        let session = self.get(scope, id).await?;
        let who = operator_id
            .or_else(|| session.metadata["operator_id"].as_str().map(str::to_string))
            .unwrap_or_else(|| "operator".into());
        let mut message = ChatMessage::assistant(content.0);
        message.name = Some(format!("operator:{who}"));
        self.record_message(scope, id, message).await
    }
}

impl VisitorMessage {
    /// Acts on the decision: stores the message as it is, or, after the
    /// tenant's `response_delay_ms`, starts its turn
    /// ([`Sessions::start_turn`]) with `events` as the turn's sink.
    pub async fn deliver(self, events: TurnSink) -> Result<Delivered, SessionError> {
        if !self.decision.respond {
            let seq = self
                .sessions
                .record_message(&self.scope, &self.session, ChatMessage::user(self.content))
                .await?;
            return Ok(Delivered::Stored { seq });
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let started = self
            .sessions
            .start_turn(&self.scope, &self.session, self.content, Some(events), None)
            .await?;
        Ok(Delivered::Turn(started))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::sessions::MAX_CONTENT_BYTES;

    #[test]
    fn content_is_checked_as_a_turns_is() {
        assert!(matches!(
            Content::new(" \n".into()),
            Err(SessionError::EmptyContent)
        ));
        assert!(matches!(
            Content::new("x".repeat(MAX_CONTENT_BYTES + 1)),
            Err(SessionError::ContentTooLarge { .. })
        ));
        assert!(Content::new("x".repeat(MAX_CONTENT_BYTES)).is_ok());
    }
}
