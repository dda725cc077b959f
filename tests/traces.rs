//! A turn's trace: the model calls and the tool spans nest under the turn,
//! with the OpenTelemetry GenAI attribute names. The spans are recorded by
//! a test layer on the global subscriber (so spans opened on actix arbiter
//! threads are seen too); this file holds one test for that reason.

mod support;

use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use support::{AppOptions, MockModel, Reply, spawn_app};
use tracing::span::{Attributes, Id};
use tracing::subscriber::set_global_default;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// (span name, parent span name, recorded field names)
type Seen = Arc<Mutex<Vec<(String, Option<String>, Vec<String>)>>>;

struct Recorder(Seen);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_string());
        let fields = attrs
            .metadata()
            .fields()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_string(), parent, fields));
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
    let find = |name: &str| -> Vec<(Option<String>, Vec<String>)> {
        seen.iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, p, f)| (p.clone(), f.clone()))
            .collect()
    };
    let turns = find("turn");
    assert_eq!(turns.len(), 1, "{seen:?}");
    let chats = find("gen_ai.chat");
    assert_eq!(chats.len(), 2, "one per model call: {seen:?}");
    for (parent, fields) in &chats {
        assert_eq!(parent.as_deref(), Some("turn"));
        for f in [
            "gen_ai.request.model",
            "gen_ai.usage.input_tokens",
            "gen_ai.operation.name",
        ] {
            assert!(fields.iter().any(|x| x == f), "{f} in {fields:?}");
        }
    }
    let batches = find("tool_batch");
    assert_eq!(batches[0].0.as_deref(), Some("turn"));
    let calls = find("tool_call");
    assert_eq!(calls[0].0.as_deref(), Some("tool_batch"));
    let executed = find("execute_tool");
    let (parent, fields) = &executed[0];
    assert_eq!(parent.as_deref(), Some("tool_call"));
    for f in [
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "error.type",
        "cadre.caller_type",
    ] {
        assert!(fields.iter().any(|x| x == f), "{f} in {fields:?}");
    }
}
