//! The body of a chat-completions request, serialised straight from cadre's
//! own [`ChatRequest`]: borrowed, nothing copied.
//!
//! conversation ──ChatRequest──▶ [`RequestBody`] (borrows it) ──serde_json──▶ reqwest ──▶ endpoint
//!
//! The OpenAI client ([`super::openai`]) used to build async-openai's
//! request types first: every message's text, every tool call's arguments
//! and every tool's JSON Schema were copied into them for each model call,
//! then serialised (issue #37, "less JSON"). The shapes here borrow
//! instead and write the same JSON: a test serialises both for every kind
//! of message, tool, `response_format` and the streaming options, and
//! compares them (`the_body_is_what_async_openai_would_send`), so
//! async-openai's types remain the reference for the wire, in tests.
//!
//! Fields left out when unset, as async-openai does: `tools` and
//! `tool_choice` when the agent offers none, `temperature`,
//! `max_completion_tokens`, `response_format`, `stream`,
//! `stream_options`; an assistant message's `content` when it has none and
//! its `tool_calls` when it made none.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use super::{ChatMessage, ChatRequest, Role, StructuredOutput, ToolChoice, ToolSpec};

/// The request body.
#[derive(Serialize)]
pub(super) struct RequestBody<'a> {
    model: &'a str,
    messages: Messages<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Tools<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormatBody<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

impl<'a> RequestBody<'a> {
    /// The body of `request` for `model` (the endpoint's default when the
    /// request names none). A `StructuredOutput::Prompt` client sends the
    /// request's `response_format` as a last system message instead of
    /// the field.
    pub(super) fn new(
        request: &'a ChatRequest,
        model: &'a str,
        structured: StructuredOutput,
    ) -> Self {
        let (response_format, extra_system) = match (&request.response_format, structured) {
            (None, _) => (None, None),
            (Some(f), StructuredOutput::Native) => (
                Some(ResponseFormatBody {
                    kind: "json_schema",
                    json_schema: JsonSchemaBody {
                        description: f.description.as_deref(),
                        name: &f.name,
                        schema: &f.schema,
                        strict: f.strict,
                    },
                }),
                None,
            ),
            (Some(f), StructuredOutput::Prompt) => (None, Some(super::schema_instruction(f))),
        };
        let offers_tools = !request.tools.is_empty();
        RequestBody {
            model: if request.model.is_empty() {
                model
            } else {
                &request.model
            },
            messages: Messages {
                messages: &request.messages,
                extra_system,
            },
            tools: offers_tools.then_some(Tools(&request.tools)),
            tool_choice: offers_tools.then_some(match request.tool_choice {
                ToolChoice::Auto => "auto",
                ToolChoice::None => "none",
            }),
            temperature: request.temperature,
            max_completion_tokens: request.max_tokens,
            response_format,
            stream: None,
            stream_options: None,
        }
    }

    /// Asks for a stream, with the usage in its last chunk (without it a
    /// stream carries no usage and the call would count no tokens).
    pub(super) fn streamed(mut self) -> Self {
        self.stream = Some(true);
        self.stream_options = Some(StreamOptions {
            include_usage: true,
        });
        self
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct ResponseFormatBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaBody<'a>,
}

#[derive(Serialize)]
struct JsonSchemaBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    name: &'a str,
    schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

struct Messages<'a> {
    messages: &'a [ChatMessage],
    /// The answer schema's instruction, in prompt mode.
    extra_system: Option<String>,
}

impl Serialize for Messages<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let extra = usize::from(self.extra_system.is_some());
        let mut seq = s.serialize_seq(Some(self.messages.len() + extra))?;
        for m in self.messages {
            seq.serialize_element(&Message::of(m))?;
        }
        if let Some(text) = &self.extra_system {
            seq.serialize_element(&Message::Plain {
                role: "system",
                content: text,
            })?;
        }
        seq.end()
    }
}

/// One message as the endpoint takes it. A missing text is sent as `""`
/// for every role but the assistant's (whose `content` is then left out).
#[derive(Serialize)]
#[serde(untagged)]
enum Message<'a> {
    Plain {
        role: &'static str,
        content: &'a str,
    },
    Assistant {
        role: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Calls<'a>>,
    },
    Tool {
        role: &'static str,
        content: &'a str,
        tool_call_id: &'a str,
    },
}

impl<'a> Message<'a> {
    fn of(m: &'a ChatMessage) -> Self {
        let text = m.content.as_deref().unwrap_or_default();
        match m.role {
            Role::System => Message::Plain {
                role: "system",
                content: text,
            },
            Role::User => Message::Plain {
                role: "user",
                content: text,
            },
            Role::Assistant => Message::Assistant {
                role: "assistant",
                content: m.content.as_deref(),
                tool_calls: (!m.tool_calls.is_empty()).then_some(Calls(&m.tool_calls)),
            },
            Role::Tool => Message::Tool {
                role: "tool",
                content: text,
                tool_call_id: m.tool_call_id.as_deref().unwrap_or_default(),
            },
        }
    }
}

struct Calls<'a>(&'a [super::ToolCall]);

impl Serialize for Calls<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|c| CallBody {
            id: &c.id,
            kind: "function",
            function: FunctionCallBody {
                name: wire_name(&c.name),
                arguments: &c.arguments,
            },
        }))
    }
}

#[derive(Serialize)]
struct CallBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionCallBody<'a>,
}

#[derive(Serialize)]
struct FunctionCallBody<'a> {
    name: Cow<'a, str>,
    arguments: &'a str,
}

struct Tools<'a>(&'a [ToolSpec]);

impl Serialize for Tools<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| ToolBody {
            kind: "function",
            function: FunctionBody {
                name: wire_name(&t.name),
                description: &t.description,
                parameters: &t.parameters,
            },
        }))
    }
}

#[derive(Serialize)]
struct ToolBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionBody<'a>,
}

#[derive(Serialize)]
struct FunctionBody<'a> {
    name: Cow<'a, str>,
    description: &'a str,
    parameters: &'a Value,
}

/// [`super::wire_name`], copying only a name that changes.
fn wire_name(name: &str) -> Cow<'_, str> {
    if name.contains('.') {
        Cow::Owned(super::wire_name(name))
    } else {
        Cow::Borrowed(name)
    }
}
