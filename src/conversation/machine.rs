//! ConversationMachine: the decisions of a turn, with no IO.
//!
//! user text ─▶ start_turn ─▶ CallModel ─▶ on_model_reply ─▶ RunTools ─▶ on_tool_results ─▶ CallModel ...
//!                                            └─▶ Finish (answer)
//!
//! Every step returns the messages to persist and the next action; the
//! Conversation actor performs them. Rules:
//! - the context sent is: system prompt (+ tool-use instructions when tools
//!   are offered), the last `history_window` messages of earlier turns
//!   (never starting on an orphan tool result), then the whole current turn;
//! - at most `max_iterations` rounds of tool calls; after the last round one
//!   final call with `tool_choice = none` and an instruction to answer with
//!   what it has (`fallback_used`). Tool calls in that final reply are ignored;
//! - `iterations` in the outcome counts the model calls of the turn.

use serde::Serialize;
use serde_json::Value;

use crate::model::{ChatMessage, ChatRequest, ChatResponse, Role, ToolCall, ToolChoice, ToolSpec};
use crate::tools::{ErrorType, ToolExecutionResult};

use super::summary::ToolUsageSummary;

pub const TOOL_USE_INSTRUCTIONS: &str = "When a tool can answer part of the question, call it \
     instead of guessing, then answer from its result. If a tool reports an error, correct the \
     arguments or explain the problem.";

pub const FALLBACK_INSTRUCTION: &str = "You have used all the tool calls allowed for this \
     question. Do not call any more tools: answer now with the information you already have, \
     and say what is missing if anything is.";

/// Per-agent settings the machine needs.
#[derive(Debug, Clone)]
pub struct TurnSettings {
    pub system_prompt: String,
    pub model: String,
    pub tools: Vec<ToolSpec>,
    pub max_iterations: u32,
    pub history_window: usize,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
}

/// One tool call of a turn as the caller sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallReport {
    pub id: String,
    pub name: String,
    /// Parsed arguments, or the raw string when they were not JSON.
    pub arguments: Value,
    pub is_success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<ErrorType>,
}

/// The result of a finished turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnOutcome {
    pub answer: String,
    pub tool_calls: Vec<CallReport>,
    pub tool_usage_summary: ToolUsageSummary,
    pub iterations: u32,
    pub fallback_used: bool,
}

#[derive(Debug, Clone)]
pub enum Action {
    CallModel(ChatRequest),
    RunTools(Vec<ToolCall>),
    Finish(TurnOutcome),
}

/// What the actor must do: persist these messages (in order), then act.
#[derive(Debug, Clone)]
pub struct Step {
    pub persist: Vec<ChatMessage>,
    pub action: Action,
}

#[derive(Debug, Default)]
struct Turn {
    messages: Vec<ChatMessage>,
    rounds: u32,
    model_calls: u32,
    calls: Vec<CallReport>,
    fallback: bool,
}

pub struct ConversationMachine {
    settings: TurnSettings,
    /// Earlier turns, at most `history_window` messages.
    history: Vec<ChatMessage>,
    turn: Option<Turn>,
}

impl ConversationMachine {
    pub fn new(settings: TurnSettings, history: Vec<ChatMessage>) -> Self {
        let mut m = ConversationMachine {
            settings,
            history,
            turn: None,
        };
        m.trim_history();
        m
    }

    pub fn in_turn(&self) -> bool {
        self.turn.is_some()
    }

    pub fn start_turn(&mut self, text: String) -> Step {
        let user = ChatMessage::user(text);
        self.turn = Some(Turn {
            messages: vec![user.clone()],
            ..Turn::default()
        });
        Step {
            persist: vec![user],
            action: Action::CallModel(self.request()),
        }
    }

    pub fn on_model_reply(&mut self, reply: ChatResponse) -> Step {
        let turn = self.turn.as_mut().expect("model reply outside a turn");
        if !reply.tool_calls.is_empty() && !turn.fallback {
            let msg = ChatMessage::assistant_tool_calls(reply.content, reply.tool_calls.clone());
            turn.messages.push(msg.clone());
            return Step {
                persist: vec![msg],
                action: Action::RunTools(reply.tool_calls),
            };
        }
        let answer = reply.content.unwrap_or_default();
        let msg = ChatMessage::assistant(answer.clone());
        turn.messages.push(msg.clone());
        let outcome = self.finish(answer);
        Step {
            persist: vec![msg],
            action: Action::Finish(outcome),
        }
    }

    /// `results` in the order of the calls of the last model reply.
    pub fn on_tool_results(&mut self, results: Vec<(ToolCall, ToolExecutionResult)>) -> Step {
        let max = self.settings.max_iterations;
        let turn = self.turn.as_mut().expect("tool results outside a turn");
        let mut persist = Vec::with_capacity(results.len());
        for (call, result) in results {
            let msg = ChatMessage::tool_result(&call, result.model_content());
            turn.messages.push(msg.clone());
            persist.push(msg);
            turn.calls.push(CallReport {
                arguments: serde_json::from_str(&call.arguments)
                    .unwrap_or(Value::String(call.arguments.clone())),
                id: call.id,
                name: call.name,
                is_success: result.is_success,
                output: result.output,
                error: result.error,
                error_type: result.error_type,
            });
        }
        turn.rounds += 1;
        if turn.rounds >= max {
            turn.fallback = true;
        }
        Step {
            persist,
            action: Action::CallModel(self.request()),
        }
    }

    /// Ends a turn that failed (model down): what was persisted stays in the
    /// history, so memory matches the store.
    pub fn abort_turn(&mut self) {
        if let Some(turn) = self.turn.take() {
            self.history.extend(turn.messages);
            self.trim_history();
        }
    }

    fn finish(&mut self, answer: String) -> TurnOutcome {
        let turn = self.turn.take().expect("finish outside a turn");
        let summary = ToolUsageSummary::from_calls(
            turn.calls.iter().map(|c| (c.name.as_str(), c.is_success)),
        );
        let outcome = TurnOutcome {
            answer,
            tool_usage_summary: summary,
            iterations: turn.model_calls,
            fallback_used: turn.fallback,
            tool_calls: turn.calls,
        };
        self.history.extend(turn.messages);
        self.trim_history();
        outcome
    }

    fn trim_history(&mut self) {
        let window = self.settings.history_window;
        if self.history.len() > window {
            self.history.drain(..self.history.len() - window);
        }
        // A tool result without the assistant message that asked for it is
        // refused by OpenAI-compatible servers.
        let orphans = self
            .history
            .iter()
            .take_while(|m| m.role == Role::Tool)
            .count();
        self.history.drain(..orphans);
    }

    fn request(&mut self) -> ChatRequest {
        let s = &self.settings;
        let turn = self.turn.as_mut().expect("request outside a turn");
        turn.model_calls += 1;
        let mut system = s.system_prompt.clone();
        if !s.tools.is_empty() {
            system.push_str("\n\n");
            system.push_str(TOOL_USE_INSTRUCTIONS);
        }
        let mut messages = Vec::with_capacity(2 + self.history.len() + turn.messages.len());
        messages.push(ChatMessage::system(system));
        messages.extend(self.history.iter().cloned());
        messages.extend(turn.messages.iter().cloned());
        if turn.fallback {
            messages.push(ChatMessage::system(FALLBACK_INSTRUCTION));
        }
        ChatRequest {
            model: s.model.clone(),
            messages,
            tools: s.tools.clone(),
            tool_choice: if turn.fallback {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            },
            temperature: s.temperature,
            max_tokens: s.max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn settings(max_iterations: u32, window: usize) -> TurnSettings {
        TurnSettings {
            system_prompt: "sys".into(),
            model: "m".into(),
            tools: vec![ToolSpec {
                name: "echo".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }],
            max_iterations,
            history_window: window,
            temperature: None,
            max_tokens: None,
        }
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "echo".into(),
            arguments: r#"{"message":"x"}"#.into(),
        }
    }

    fn tools_reply(ids: &[&str]) -> ChatResponse {
        ChatResponse {
            content: None,
            tool_calls: ids.iter().map(|i| call(i)).collect(),
            usage: None,
        }
    }

    fn ok(id: &str) -> (ToolCall, ToolExecutionResult) {
        (
            call(id),
            ToolExecutionResult::success("echo", json!({"message": "x"}), Duration::ZERO, 1),
        )
    }

    fn request_of(step: &Step) -> &ChatRequest {
        match &step.action {
            Action::CallModel(r) => r,
            other => panic!("expected a model call, got {other:?}"),
        }
    }

    #[test]
    fn tool_results_follow_the_assistant_message_with_their_ids() {
        let mut m = ConversationMachine::new(settings(3, 20), vec![]);
        m.start_turn("hi".into());
        let step = m.on_model_reply(tools_reply(&["a", "b"]));
        assert!(matches!(step.action, Action::RunTools(ref c) if c.len() == 2));
        let step = m.on_tool_results(vec![ok("a"), ok("b")]);
        let req = request_of(&step);
        let roles: Vec<_> = req.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("a"));
        assert_eq!(req.messages[4].tool_call_id.as_deref(), Some("b"));
        assert_eq!(req.tool_choice, ToolChoice::Auto);
    }

    #[test]
    fn after_max_iterations_the_last_call_forbids_tools_and_ignores_new_calls() {
        let mut m = ConversationMachine::new(settings(2, 20), vec![]);
        m.start_turn("hi".into());
        m.on_model_reply(tools_reply(&["a"]));
        let step = m.on_tool_results(vec![ok("a")]);
        assert_eq!(request_of(&step).tool_choice, ToolChoice::Auto);
        m.on_model_reply(tools_reply(&["b"]));
        let step = m.on_tool_results(vec![ok("b")]);
        let req = request_of(&step);
        assert_eq!(req.tool_choice, ToolChoice::None);
        assert_eq!(
            req.messages.last().unwrap().content.as_deref(),
            Some(FALLBACK_INSTRUCTION)
        );
        let step = m.on_model_reply(ChatResponse {
            content: Some("done".into()),
            tool_calls: vec![call("c")],
            usage: None,
        });
        let Action::Finish(outcome) = step.action else {
            panic!("expected the turn to finish");
        };
        assert_eq!(outcome.answer, "done");
        assert!(outcome.fallback_used);
        assert_eq!(outcome.iterations, 3);
        assert_eq!(outcome.tool_calls.len(), 2);
        assert_eq!(outcome.tool_usage_summary.total_calls, 2);
    }

    #[test]
    fn the_window_keeps_recent_history_without_orphan_tool_results() {
        let mut m = ConversationMachine::new(settings(3, 2), vec![]);
        m.start_turn("one".into());
        m.on_model_reply(tools_reply(&["a"]));
        m.on_tool_results(vec![ok("a")]);
        m.on_model_reply(ChatResponse {
            content: Some("answer".into()),
            tool_calls: vec![],
            usage: None,
        });
        // history: user, assistant(tool_calls), tool, assistant -> a window
        // of 2 would start on the tool result, which is dropped.
        let step = m.start_turn("two".into());
        let req = request_of(&step);
        let contents: Vec<_> = req
            .messages
            .iter()
            .map(|m| (m.role, m.content.clone().unwrap_or_default()))
            .collect();
        assert_eq!(contents[1], (Role::Assistant, "answer".to_string()));
        assert_eq!(contents[2], (Role::User, "two".to_string()));
        assert_eq!(contents.len(), 3);
    }
}
