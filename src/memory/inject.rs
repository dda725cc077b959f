//! `memory = { inject = true }`: the few items of the agent's namespace
//! that match the user's message best, as notes for the turn's prompt.
//!
//! Sessions::start_turn ──[`Memory::notes_for`] (the user's message)──▶ search (BM25, or fused: [`super::embed`])
//!                      ◀── the notes, bounded ──┘ ──▶ TurnRules.memory ──▶ the machine's request: a fenced `user` message after the summary
//!
//! The notes go to the model as data, like the rolling summary: the
//! conversation layer labels and fences them
//! (`conversation::context::memory_message`); this module picks and
//! bounds them.
//!
//! Decided:
//! - At most [`MAX_ITEMS`] items, each one a line `- <text>` (the value's
//!   `text`, else all its text as search reads it), and at most
//!   [`MAX_BYTES`] of notes in all: an item's text is cut (on a character
//!   boundary, marked `…`) to what is left, and no item is added once
//!   nothing is. So the layer costs a bounded share of the prompt
//!   whatever was remembered.
//! - Only items that match the message (a score above 0: a word in
//!   common, or with semantic ranking a cosine of at least
//!   `embeddings_min_similarity`): a message that matches nothing
//!   remembered gets no layer at all.
//! - The namespace is the tools' (the same template and variables): a
//!   session without a user under `{user_id}` gets no notes.
//! - A failed search (the store unavailable) gives no notes and a warning:
//!   the turn runs without them rather than fail.
//! - Chosen once, when the turn starts, and kept in the turn's record
//!   (`memory_notes`): every model call of the turn sends the same notes,
//!   a call after a restart resumed it or after a handoff to another
//!   agent included (the notes are the user's message's, not the agent's).
//!   What is remembered meanwhile reaches the next turn.

use super::{Memory, SearchQuery};

/// Most items injected into one turn's prompt.
pub const MAX_ITEMS: usize = 3;
/// Most bytes of notes (the items' text) injected into one turn's prompt.
pub const MAX_BYTES: usize = 2048;

/// The text of an item, as the notes and `recall` show it.
pub fn text_of_item(value: &serde_json::Value) -> String {
    match &value["text"] {
        serde_json::Value::String(s) => s.clone(),
        _ => super::text_of(value).trim().to_string(),
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The notes: one line per item, within [`MAX_BYTES`].
pub fn render(texts: impl IntoIterator<Item = String>) -> Option<String> {
    let mut lines = Vec::new();
    let mut left = MAX_BYTES;
    for text in texts.into_iter().take(MAX_ITEMS) {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() || left == 0 {
            continue;
        }
        let line = if text.len() <= left {
            text
        } else {
            let marker = "…";
            let kept = cut(&text, left.saturating_sub(marker.len()));
            if kept.is_empty() {
                break;
            }
            format!("{kept}{marker}")
        };
        left = left.saturating_sub(line.len());
        lines.push(format!("- {line}"));
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

impl Memory {
    /// The notes for a turn of `agent` whose memory template is
    /// `template`, for the session of `tenant` and `user_id`, on the
    /// user's `message`; `None` when nothing matches.
    pub async fn notes_for(
        &self,
        template: &[String],
        tenant: &str,
        user_id: Option<&str>,
        agent: &str,
        message: &str,
    ) -> Option<String> {
        let namespace = super::tools::resolve(template, tenant, user_id, agent).ok()?;
        let found = self
            .search(
                tenant,
                SearchQuery {
                    namespace_prefix: namespace,
                    query: Some(message.chars().take(4096).collect()),
                    filter: None,
                    limit: MAX_ITEMS,
                    offset: 0,
                },
            )
            .await;
        match found {
            Ok(found) => render(
                found
                    .into_iter()
                    .filter(|f| f.score > 0.0)
                    .map(|f| text_of_item(&f.item.value)),
            ),
            Err(e) => {
                tracing::warn!(tenant, agent, error = %e, "memory notes left out of the turn: the search failed");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_one_line_each_and_bounded() {
        assert_eq!(render(Vec::new()), None);
        assert_eq!(
            render(["a\n dog".to_string(), "b".to_string()]),
            Some("- a dog\n- b".into())
        );
        let many = (0..10).map(|i| format!("item {i}"));
        assert_eq!(render(many).unwrap().lines().count(), MAX_ITEMS);
        let big = render(["é".repeat(MAX_BYTES), "next".to_string()]).unwrap();
        let texts: usize = big.lines().map(|l| l.len() - 2).sum();
        assert!(texts <= MAX_BYTES, "{texts}");
        assert!(big.ends_with('…'), "the cut is marked");
        assert_eq!(big.lines().count(), 1, "nothing is left for the next");
    }
}
