//! A turn's trace: the model calls and the tool spans nest under the turn
//! (turn > gen_ai.chat; turn > tool_batch > tool_call > execute_tool), with
//! the OpenTelemetry GenAI attribute names and values and cadre's own. The
//! spans are recorded by a test layer on the global subscriber (so spans
//! opened on actix arbiter threads are seen too); this file holds one test
//! for that reason.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use support::{AppOptions, MockModel, Reply, spawn_app};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::set_global_default;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as the recorder saw it.
#[derive(Clone, Debug)]
struct SeenSpan {
    id: u64,
    name: String,
    parent: Option<u64>,
    /// Every field the span declares, recorded or not.
    fields: Vec<String>,
    /// The fields given a value, at creation or later.
    values: BTreeMap<String, String>,
}

type Seen = Arc<Mutex<Vec<SeenSpan>>>;

struct Recorder(Seen);

struct Values<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Values<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.id().into_u64());
        let fields = attrs
            .metadata()
            .fields()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        let mut values = BTreeMap::new();
        attrs.record(&mut Values(&mut values));
        self.0.lock().unwrap().push(SeenSpan {
            id: id.into_u64(),
            name: attrs.metadata().name().to_string(),
            parent,
            fields,
            values,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        // Span ids are reused after close: the latest span with this id.
        if let Some(span) = seen.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut Values(&mut span.values));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_trace_nests_model_and_tool_spans_with_genai_attributes() {
    let seen: Seen = Arc::default();
    set_global_default(tracing_subscriber::registry().with(Recorder(seen.clone())))
        .expect("the only subscriber of this test binary");

    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "calculator", r#"{"expression":"6*7"}"#),
        Reply::text("42"),
    ]);
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;
    let (status, body) = app.say(&session, "What is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let seen = seen.lock().unwrap().clone();
    let find =
        |name: &str| -> Vec<SeenSpan> { seen.iter().filter(|s| s.name == name).cloned().collect() };
    let parent_name = |span: &SeenSpan| -> Option<String> {
        let parent = span.parent?;
        seen.iter()
            .rev()
            .find(|s| s.id == parent)
            .map(|s| s.name.clone())
    };
    let has = |span: &SeenSpan, names: &[&str]| {
        for f in names {
            assert!(span.fields.iter().any(|x| x == f), "{f} in {span:?}");
        }
    };
    let value = |span: &SeenSpan, name: &str| -> String {
        span.values
            .get(name)
            .unwrap_or_else(|| panic!("{name} has a value in {span:?}"))
            .clone()
    };

    let turns = find("turn");
    assert_eq!(turns.len(), 1, "{seen:?}");
    let turn = &turns[0];
    assert_eq!(turn.parent, None, "a turn is a root span");
    has(
        turn,
        &[
            "gen_ai.operation.name",
            "gen_ai.agent.name",
            "gen_ai.conversation.id",
            "cadre.session",
            "cadre.tenant",
            "cadre.caller_type",
            "latency_ms",
            "error.type",
        ],
    );
    assert_eq!(value(turn, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(value(turn, "otel.name"), "invoke_agent assistant");
    assert_eq!(value(turn, "gen_ai.conversation.id"), session);
    assert_eq!(value(turn, "cadre.caller_type"), "conversation_agent");
    assert_eq!(value(turn, "iterations"), "2");
    value(turn, "latency_ms");
    assert!(!turn.values.contains_key("error.type"), "{turn:?}");

    let chats = find("gen_ai.chat");
    assert_eq!(chats.len(), 2, "one per model call: {seen:?}");
    for chat in &chats {
        assert_eq!(chat.parent, Some(turn.id));
        has(
            chat,
            &[
                "gen_ai.request.model",
                "gen_ai.provider.name",
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "gen_ai.operation.name",
                "cadre.session",
                "cadre.tenant",
                "latency_ms",
                "error.type",
            ],
        );
        assert_eq!(value(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(value(chat, "gen_ai.request.model"), "mock-model");
        assert_eq!(value(chat, "otel.name"), "chat mock-model");
        value(chat, "gen_ai.usage.input_tokens");
        value(chat, "gen_ai.usage.output_tokens");
        value(chat, "latency_ms");
    }

    let batches = find("tool_batch");
    assert_eq!(batches.len(), 1, "{seen:?}");
    assert_eq!(batches[0].parent, Some(turn.id));
    let calls = find("tool_call");
    assert_eq!(calls.len(), 1, "{seen:?}");
    assert_eq!(calls[0].parent, Some(batches[0].id));
    assert_eq!(value(&calls[0], "gen_ai.tool.name"), "calculator");
    assert_eq!(value(&calls[0], "gen_ai.tool.call.id"), "call_1");
    let executed = find("execute_tool");
    assert_eq!(executed.len(), 1, "{seen:?}");
    let exec = &executed[0];
    assert_eq!(exec.parent, Some(calls[0].id));
    assert_eq!(parent_name(exec).as_deref(), Some("tool_call"));
    has(
        exec,
        &[
            "gen_ai.tool.name",
            "gen_ai.tool.call.id",
            "error.type",
            "cadre.caller_type",
            "cadre.session",
            "cadre.tenant",
            "cadre.source_id",
            "latency_ms",
        ],
    );
    assert_eq!(value(exec, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(value(exec, "otel.name"), "execute_tool calculator");
    assert_eq!(value(exec, "gen_ai.tool.name"), "calculator");
    assert_eq!(value(exec, "gen_ai.tool.call.id"), "call_1");
    assert_eq!(value(exec, "cadre.session"), session);
    assert_eq!(value(exec, "cadre.caller_type"), "conversation_agent");
    value(exec, "latency_ms");
    assert!(!exec.values.contains_key("error.type"), "{exec:?}");
}
