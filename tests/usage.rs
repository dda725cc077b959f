//! Token usage and budgets end to end: every model call of a turn is
//! counted in the session's summary and in its tenant's usage by day and
//! agent, one tenant never sees another's, an admin sees every tenant's,
//! a tenant past its monthly budget is refused before any model call (on
//! every way a turn starts), and the usage that refuses it survives
//! `kill -9` and a restart.
//!
//! The model is the mock at the wire, scripted with the usage each reply
//! reports ([`Reply::with_usage`]).

mod support;

use std::path::Path;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde_json::{Value, json};
use support::ws::connect_ws;
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};
use tokio_tungstenite::tungstenite::Message;

/// Upper bound for anything a test waits for (a frame, a reply).
const PATIENCE: Duration = Duration::from_secs(20);

/// The agent the tests talk to: the calculator, room for a tool round.
const AGENT: &str = "counter";
/// The same with a window of one message: a summary call after a tool round.
const BRIEF: &str = "brief";

fn agents() -> tempfile::TempDir {
    agents_dir(&[
        ("counter.toml", &agent_toml(AGENT, &["calculator"], 3)),
        (
            "brief.toml",
            &format!(
                "{}history_window = 1\n",
                agent_toml(BRIEF, &["calculator"], 3)
            ),
        ),
    ])
}

/// A turn of two model calls: a tool round, then the answer. 280 tokens.
fn two_call_turn(model: &MockModel) {
    model.push(Reply::with_usage(
        100,
        10,
        Reply::tool_call("c1", "calculator", r#"{"expression":"6*7"}"#),
    ));
    model.push(Reply::with_usage(150, 20, Reply::text("It is 42.")));
}

// ---------------------------------------------------------------------------
// Keys and callers
// ---------------------------------------------------------------------------

/// A cadre with keys for acme, globex (neither admin) and an admin of `ops`.
struct Keyed {
    app: TestApp,
    acme: Caller,
    globex: Caller,
    admin: Caller,
    _data: tempfile::TempDir,
    _agents: tempfile::TempDir,
}

async fn keyed(model: &MockModel) -> Keyed {
    keyed_with(model, "").await
}

/// [`keyed`] with `config` (server config TOML) on top of the defaults.
async fn keyed_with(model: &MockModel, config: &str) -> Keyed {
    let data = tempfile::tempdir().expect("temp dir");
    let store = support::store::open_store(data.path());
    let mut keys = Vec::new();
    for (tenant, admin) in [("acme", false), ("globex", false), ("ops", true)] {
        let (key, _) = cadre::tenants::create_key(&store, tenant, admin)
            .await
            .expect("key created");
        keys.push(key);
    }
    drop(store);
    let agents = agents();
    let mut options = AppOptions::with_model(model)
        .agents(agents.path())
        .data_dir(data.path());
    if !config.is_empty() {
        options = options.config_toml(config);
    }
    let app = spawn_app(options);
    let caller = |key: &str| Caller {
        base: app.base.clone(),
        client: reqwest::Client::new(),
        key: Some(key.to_string()),
    };
    Keyed {
        acme: caller(&keys[0]),
        globex: caller(&keys[1]),
        admin: caller(&keys[2]),
        app,
        _data: data,
        _agents: agents,
    }
}

/// Requests to one server with one key (or none: a server running open).
struct Caller {
    base: String,
    client: reqwest::Client,
    key: Option<String>,
}

struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    content_type: String,
    body: Value,
}

impl Caller {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.header(AUTHORIZATION, format!("Bearer {k}")),
            None => r,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let r = request.send().await.expect("request sent");
        let header = |name| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header(RETRY_AFTER).map(|v| v.parse().expect("Retry-After in seconds"));
        let content_type = header(CONTENT_TYPE).unwrap_or_default();
        let status = r.status();
        let text = r.text().await.expect("body read");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            retry_after,
            content_type,
            body,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let a = self.send(self.request(reqwest::Method::GET, path)).await;
        (a.status, a.body)
    }

    async fn session(&self) -> String {
        self.session_of(AGENT).await
    }

    async fn session_of(&self, agent: &str) -> String {
        let a = self
            .send(
                self.request(reqwest::Method::POST, "/v1/sessions")
                    .json(&json!({ "agent": agent })),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        a.body["id"].as_str().expect("session id").to_string()
    }

    async fn say(&self, session: &str, content: &str) -> Answer {
        self.send(
            self.request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .json(&json!({ "content": content })),
        )
        .await
    }

    async fn say_streaming(&self, session: &str, content: &str) -> Answer {
        self.send(
            self.request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("accept", "text/event-stream")
            .json(&json!({ "content": content })),
        )
        .await
    }

    async fn set_budget(&self, tenant: &str, tokens: u64) {
        let a = self
            .send(
                self.request(
                    reqwest::Method::PATCH,
                    &format!("/v1/tenants/{tenant}/config"),
                )
                .json(&json!({ "monthly_token_budget": tokens })),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        assert_eq!(a.body["config"]["monthly_token_budget"], tokens);
    }

    async fn token_usage(&self, session: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/sessions/{session}/summary")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["token_usage"].clone()
    }

    /// `GET /v1/usage` over yesterday..tomorrow (UTC), so a turn near
    /// midnight is in range; `extra` is appended to the query.
    async fn usage(&self, extra: &str) -> (StatusCode, Value) {
        let today = jiff::Timestamp::now()
            .to_zoned(jiff::tz::TimeZone::UTC)
            .date();
        let (from, to) = (today.yesterday().unwrap(), today.tomorrow().unwrap());
        self.get(&format!("/v1/usage?from={from}&to={to}{extra}"))
            .await
    }
}

fn counters(prompt: u64, completion: u64, calls: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "model_calls": calls,
    })
}

/// `(tenant, agent, total_tokens)` of each usage row.
fn rows(report: &Value) -> Vec<(String, String, u64)> {
    report["usage"]
        .as_array()
        .expect("usage rows")
        .iter()
        .map(|r| {
            (
                r["tenant"].as_str().unwrap().to_string(),
                r["agent"].as_str().unwrap().to_string(),
                r["total_tokens"].as_u64().unwrap(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Counting
// ---------------------------------------------------------------------------

/// The value of `/metrics`' series `line` (name and labels), 0 when absent.
fn series(metrics: &str, line: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_turns_and_tokens_per_tenant_and_agent() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let acme = t.acme.session().await;
    two_call_turn(&model);
    assert_eq!(
        t.acme.say(&acme, "What is 6*7?").await.status,
        StatusCode::OK
    );
    let globex = t.globex.session_of(BRIEF).await;
    model.push(Reply::with_usage(7, 3, Reply::text("Hello.")));
    assert_eq!(t.globex.say(&globex, "Hi").await.status, StatusCode::OK);
    // A model that fails: the turn counts as failed for its pair.
    model.push(Reply::error(400, "invalid_request_error", "no"));
    let failed = t.acme.say(&acme, "Again?").await;
    assert!(failed.status.is_server_error(), "{}", failed.body);

    let (status, metrics) = t.admin.get("/metrics").await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let metrics = metrics.as_str().expect("text");
    let turns = |tenant: &str, agent: &str, outcome: &str| {
        series(
            metrics,
            &format!(
                "cadre_agent_turns_total{{tenant=\"{tenant}\",agent=\"{agent}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    let tokens = |tenant: &str, agent: &str, kind: &str| {
        series(
            metrics,
            &format!(
                "cadre_agent_tokens_total{{tenant=\"{tenant}\",agent=\"{agent}\",kind=\"{kind}\"}}"
            ),
        )
    };
    assert_eq!(turns("acme", AGENT, "completed"), 1, "{metrics}");
    assert_eq!(turns("acme", AGENT, "failed"), 1, "{metrics}");
    assert_eq!(turns("globex", BRIEF, "completed"), 1, "{metrics}");
    assert_eq!(turns("globex", AGENT, "completed"), 0, "{metrics}");
    assert_eq!(
        (
            tokens("acme", AGENT, "prompt"),
            tokens("acme", AGENT, "completion")
        ),
        (250, 30),
        "{metrics}"
    );
    assert_eq!(
        (
            tokens("globex", BRIEF, "prompt"),
            tokens("globex", BRIEF, "completion")
        ),
        (7, 3),
        "{metrics}"
    );
    assert_eq!(
        series(metrics, "cadre_turns_completed_total"),
        2,
        "{metrics}"
    );
    promtool_accepts(metrics);
}

/// `promtool check metrics` (Prometheus' own linter: counter names end in
/// `_total`, base units, help on every metric...) finds nothing to say.
fn promtool_accepts(metrics: &str) {
    use std::io::Write;
    support::packages::ensure_installed("promtool", "prometheus");
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
    for name in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "cadre_build_info",
        "cadre_tool_call_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "no {name} in /metrics");
    }
    assert!(
        metrics.contains("cadre_model_call_duration_seconds_bucket{le=\"60\"}"),
        "model call latency buckets reach a minute"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_model_calls_of_a_turn_add_up_in_the_session_summary_and_the_tenants_usage() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let session = t.acme.session().await;
    assert_eq!(t.acme.token_usage(&session).await, counters(0, 0, 0));

    two_call_turn(&model);
    let turn = t.acme.say(&session, "What is 6*7?").await;
    assert_eq!(turn.status, StatusCode::OK, "{}", turn.body);
    assert_eq!(turn.body["iterations"], 2, "{}", turn.body);
    assert_eq!(model.request_count(), 2);

    assert_eq!(t.acme.token_usage(&session).await, counters(250, 30, 2));
    let (status, report) = t.acme.usage("").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["tenant"], "acme");
    assert_eq!(rows(&report), [("acme".into(), AGENT.into(), 280)]);
    let row = &report["usage"][0];
    assert_eq!(
        (
            &row["prompt_tokens"],
            &row["completion_tokens"],
            &row["model_calls"]
        ),
        (&json!(250), &json!(30), &json!(2))
    );
    assert_eq!(report["totals"], counters(250, 30, 2));
    assert_eq!(report["budget"], Value::Null, "acme has no budget");

    // A second turn adds to the same session and the same day's row.
    model.push(Reply::with_usage(40, 5, Reply::text("Still 42.")));
    let turn = t.acme.say(&session, "And again?").await;
    assert_eq!(turn.status, StatusCode::OK, "{}", turn.body);
    assert_eq!(t.acme.token_usage(&session).await, counters(290, 35, 3));
    assert_eq!(t.acme.usage("").await.1["totals"], counters(290, 35, 3));
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_and_the_summary_call_after_a_turn_count_too() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let session = t.acme.session_of(BRIEF).await;
    // Four messages outgrow two windows of one: a summary call follows.
    two_call_turn(&model);
    model.push(Reply::with_usage(30, 4, Reply::text("They asked 6*7.")));
    // The streamed turn's usage comes in the stream's last chunk; the
    // summary call after it is refused, and so counts nothing.
    model.push(Reply::with_usage(40, 5, Reply::text("Still 42.")));
    model.push(Reply::fail(400));

    assert_eq!(t.acme.say(&session, "6*7?").await.status, StatusCode::OK);
    // Queued behind the summary call, whose usage is written before this
    // turn's final commit.
    let streamed = t.acme.say_streaming(&session, "Again?").await;
    assert_eq!(streamed.status, StatusCode::OK);
    let text = streamed.body.as_str().expect("an event stream");
    assert!(text.contains("event: turn_completed"), "{text}");
    // The refused summary call after it.
    tokio::time::timeout(PATIENCE, model.wait_for_requests(5))
        .await
        .expect("the summary call after the streamed turn");
    let requests = model.requests();
    assert_eq!(requests[3]["stream"], true);
    assert_eq!(requests[3]["stream_options"]["include_usage"], true);

    assert_eq!(
        t.acme.token_usage(&session).await,
        counters(250 + 30 + 40, 30 + 4 + 5, 4)
    );
    assert_eq!(t.acme.usage("").await.1["totals"], counters(320, 39, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_only_its_own_usage_and_an_admin_sees_every_tenants() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let acme_session = t.acme.session().await;
    two_call_turn(&model);
    assert_eq!(
        t.acme.say(&acme_session, "6*7?").await.status,
        StatusCode::OK
    );
    let globex_session = t.globex.session().await;
    model.push(Reply::with_usage(7, 3, Reply::text("Hello.")));
    assert_eq!(
        t.globex.say(&globex_session, "Hi").await.status,
        StatusCode::OK
    );

    let (_, globex) = t.globex.usage("").await;
    assert_eq!(rows(&globex), [("globex".into(), AGENT.into(), 10)]);
    assert_eq!(globex["totals"], counters(7, 3, 1));
    let (_, acme) = t.acme.usage("").await;
    assert_eq!(rows(&acme), [("acme".into(), AGENT.into(), 280)]);
    // Another tenant's session summary, usage included, is not found.
    let (status, _) = t
        .globex
        .get(&format!("/v1/sessions/{acme_session}/summary"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Naming another tenant needs an admin key.
    let (status, body) = t.globex.usage("&tenant=acme").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "ADMIN_REQUIRED");
    let (status, _) = t.globex.usage("&tenant=globex").await;
    assert_eq!(status, StatusCode::OK);

    let (status, all) = t.admin.usage("").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["tenant"], Value::Null);
    assert_eq!(
        rows(&all),
        [
            ("acme".into(), AGENT.into(), 280),
            ("globex".into(), AGENT.into(), 10)
        ]
    );
    assert_eq!(all["totals"], counters(257, 33, 3));
    let (_, one) = t.admin.usage("&tenant=globex").await;
    assert_eq!(rows(&one), [("globex".into(), AGENT.into(), 10)]);

    // Ranges are bounded and days are days.
    let (status, body) = t.admin.get("/v1/usage?from=2024-01-01&to=2025-01-01").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, _) = t.admin.get("/v1/usage?from=2024-01-01&to=2024-12-31").await;
    assert_eq!(status, StatusCode::OK, "366 days are allowed");
    let (status, _) = t.admin.get("/v1/usage?from=2024-1-1").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = t.admin.get("/v1/usage?from=2024-02-02&to=2024-02-01").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

// ---------------------------------------------------------------------------
// Budgets
// ---------------------------------------------------------------------------

/// The seconds from now to 00:00 UTC on the 1st of next month, and that instant.
fn until_next_month() -> (u64, String) {
    let now = jiff::Timestamp::now();
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let next = today
        .last_of_month()
        .tomorrow()
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .unwrap()
        .timestamp();
    let secs = next.duration_since(now).as_secs().max(1) as u64;
    (secs, next.to_string())
}

/// A refusal: 429 `BUDGET_EXCEEDED`, JSON, `Retry-After` up to the reset,
/// and the reset instant in the message and the details.
fn assert_budget_exceeded(answer: &Answer, used: u64) {
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.body
    );
    assert!(
        answer.content_type.starts_with("application/json"),
        "{}",
        answer.content_type
    );
    let error = &answer.body["error"];
    assert_eq!(error["code"], "BUDGET_EXCEEDED", "{}", answer.body);
    let (secs, resets_at) = until_next_month();
    assert_eq!(error["details"]["resets_at"], resets_at.as_str());
    assert_eq!(error["details"]["used_tokens"], used);
    assert!(
        error["message"].as_str().unwrap().contains(&resets_at),
        "{error}"
    );
    let retry_after = answer.retry_after.expect("Retry-After");
    assert!(
        retry_after >= 1 && retry_after.abs_diff(secs) <= 5,
        "Retry-After {retry_after}, {secs} s to the reset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_budget_a_tenants_turns_are_refused_before_any_model_call() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    t.admin.set_budget("acme", 250).await;
    let session = t.acme.session().await;

    // Admitted under the budget, the turn runs to its end and crosses it.
    two_call_turn(&model);
    let turn = t.acme.say(&session, "What is 6*7?").await;
    assert_eq!(turn.status, StatusCode::OK, "{}", turn.body);
    assert_eq!(model.request_count(), 2);

    // Every way a turn starts is refused, and the model hears of none.
    assert_budget_exceeded(&t.acme.say(&session, "And 7*8?").await, 280);
    assert_budget_exceeded(&t.acme.say_streaming(&session, "And 7*8?").await, 280);
    let other = t.acme.session().await;
    assert_budget_exceeded(&t.acme.say(&other, "Hello?").await, 280);
    let mut ws = connect_ws(&t.app, &session, t.acme.key.as_deref())
        .await
        .expect("connected");
    ws.send(Message::text(
        json!({"type": "visitor_message", "content": "Anyone?"}).to_string(),
    ))
    .await
    .expect("frame sent");
    let decision = next_frame(&mut ws).await;
    assert_eq!(decision["type"], "auto_respond", "{decision}");
    let refused = next_frame(&mut ws).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["code"], "BUDGET_EXCEEDED", "{refused}");
    assert_eq!(model.request_count(), 2, "{:?}", model.requests());

    let (_, report) = t.acme.usage("").await;
    let (_, resets_at) = until_next_month();
    assert_eq!(
        report["budget"],
        json!({
            "monthly_token_budget": 250,
            "used_tokens": 280,
            "remaining_tokens": 0,
            "resets_at": resets_at,
        })
    );

    // Another tenant, without a budget, goes on.
    let globex = t.globex.session().await;
    model.push(Reply::with_usage(7, 3, Reply::text("Hello.")));
    assert_eq!(t.globex.say(&globex, "Hi").await.status, StatusCode::OK);
    // Raising the budget lets acme go on at once.
    t.admin.set_budget("acme", 1_000).await;
    model.push(Reply::with_usage(7, 3, Reply::text("56.")));
    assert_eq!(
        t.acme.say(&session, "And 7*8?").await.status,
        StatusCode::OK
    );
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// A tenant's share of the store
// ---------------------------------------------------------------------------

/// One tenant sending large messages as fast as it can used to slow every
/// tenant's turns (one store writer, every byte read back into later model
/// requests). Each tenant now has a share of what the store writes: a
/// request is admitted while its bucket is not empty and pays what it will
/// store (a message's content as the store writes it, JSON-escaped; a tool
/// call's arguments), what the turn writes back (the model's reply) is
/// charged when committed, and past the share the tenant is refused (429,
/// `Retry-After`) before anything is read or stored. Another tenant is not
/// touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_write_share_is_refused_and_the_others_are_not() {
    let model = MockModel::start().await;
    // 64 KiB/s: a bucket of 256 KiB (one largest message).
    let t = keyed_with(&model, "[tenants]\nwrite_kib_per_s = 64\n").await;
    let (acme, globex) = (t.acme.session().await, t.globex.session().await);
    let large = "x".repeat(200 * 1024);

    // 256 KiB, then 56 KiB left: both admitted, the second into debt.
    for _ in 0..2 {
        model.push(Reply::text("Noted."));
        let sent = t.acme.say(&acme, &large).await;
        assert_eq!(sent.status, StatusCode::OK, "{}", sent.body);
    }
    let refused = t.acme.say(&acme, "and a short one").await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.body
    );
    assert_eq!(
        refused.body["error"]["code"], "RATE_LIMITED",
        "{}",
        refused.body
    );
    assert_eq!(
        refused.body["error"]["details"]["write_kib_per_s"], 64,
        "{}",
        refused.body
    );
    let message = refused.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("write_kib_per_s"), "{message}");
    // 144 KiB of debt at 64 KiB/s.
    let wait = refused.retry_after.expect("Retry-After");
    assert!((2..=4).contains(&wait), "{wait}");
    assert_eq!(
        model.request_count(),
        2,
        "the refused message reached the model"
    );
    let (_, history) = t.acme.get(&format!("/v1/sessions/{acme}/messages")).await;
    assert_eq!(
        history["messages"].as_array().map(Vec::len),
        Some(4),
        "{history}"
    );
    // A direct tool call pays from the same share.
    let invoke = t
        .acme
        .send(
            t.acme
                .request(reqwest::Method::POST, "/v1/tools/calculator/invoke")
                .json(&json!({"params": {"expression": "1+1"}})),
        )
        .await;
    assert_eq!(
        invoke.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        invoke.body
    );
    assert_eq!(
        invoke.body["error"]["code"], "RATE_LIMITED",
        "{}",
        invoke.body
    );

    // The other tenant has a share of its own. Its content is paid as the
    // store writes it: 40,000 control characters are 240,000 bytes of
    // JSON, so after 200 KiB its 56 KiB go into debt (paid as 40,000
    // bytes, they would have left room for another message).
    model.push(Reply::text("Noted too."));
    assert_eq!(t.globex.say(&globex, &large).await.status, StatusCode::OK);
    model.push(Reply::text("Odd."));
    let controls = "\u{1}".repeat(40_000);
    assert_eq!(
        t.globex.say(&globex, &controls).await.status,
        StatusCode::OK
    );
    let refused = t.globex.say(&globex, "hello?").await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.body
    );

    // What the model writes back is charged too: a 300 KiB reply to a
    // short message leaves the tenant in debt.
    let ops = t.admin.session().await;
    model.push(Reply::text(&"z".repeat(300 * 1024)));
    assert_eq!(
        t.admin.say(&ops, "tell me everything").await.status,
        StatusCode::OK
    );
    let refused = t.admin.say(&ops, "thanks").await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.body
    );
    assert_eq!(model.overruns(), 0);
}

/// A tenant at its storage quota gets no new message stored (413
/// `STORAGE_QUOTA_EXCEEDED`, naming how to free space), another tenant
/// is not touched, and erasing a session frees what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_storage_quota_stores_nothing_more_until_it_erases() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let a = t
        .admin
        .send(
            t.admin
                .request(reqwest::Method::PATCH, "/v1/tenants/acme/config")
                .json(&json!({ "max_storage_mb": 1 })),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["config"]["max_storage_mb"], 1, "{}", a.body);

    let session = t.acme.session().await;
    // Under 64 KiB: read and admitted while the tenant is under its quota
    // (a larger body declaring more than is left is refused before it is
    // read: `a_body_the_quota_or_the_share_will_refuse_is_refused_before_it_is_read`).
    let large = "y".repeat(60 * 1024);
    let mut stored = 0;
    let refused = loop {
        model.push(Reply::text("Stored."));
        let answer = t.acme.say(&session, &large).await;
        if answer.status != StatusCode::OK {
            break answer;
        }
        stored += 1;
        assert!(stored <= 18, "1 MiB holds at most 18 messages of 60 KiB");
    };
    assert!(stored >= 16, "{stored} messages stored before the quota");
    assert_eq!(
        refused.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        refused.body
    );
    let error = &refused.body["error"];
    assert_eq!(error["code"], "STORAGE_QUOTA_EXCEEDED", "{error}");
    assert_eq!(error["details"]["max_storage_mb"], 1, "{error}");
    assert!(
        error["details"]["stored_bytes"].as_u64().unwrap() >= 1024 * 1024,
        "{error}"
    );
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("DELETE /v1/sessions/") && message.contains("max_storage_mb"),
        "{message}"
    );
    // A small message too: the quota is full; so is a direct tool call's
    // record, and a keyed message's refusal is not its key's answer.
    let small = t.acme.say(&session, "hello?").await;
    assert_eq!(
        small.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        small.body
    );
    let invoke = t
        .acme
        .send(
            t.acme
                .request(reqwest::Method::POST, "/v1/tools/calculator/invoke")
                .json(&json!({"params": {"expression": "1+1"}})),
        )
        .await;
    assert_eq!(
        invoke.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        invoke.body
    );
    assert_eq!(
        invoke.body["error"]["code"], "STORAGE_QUOTA_EXCEEDED",
        "{}",
        invoke.body
    );
    let keyed = |session: &str| {
        t.acme
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("Idempotency-Key", "after-the-quota")
            .json(&json!({ "content": "once there is room" }))
    };
    let first = t.acme.send(keyed(&session)).await;
    assert_eq!(
        first.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        first.body
    );
    let (_, history) = t
        .acme
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(
        history["messages"].as_array().map(Vec::len),
        Some(stored * 2),
        "nothing of the refused messages is stored: {history}"
    );

    // Another tenant stores on.
    let globex = t.globex.session().await;
    model.push(Reply::text("Fine."));
    assert_eq!(t.globex.say(&globex, &large).await.status, StatusCode::OK);

    // Erasing the session frees its bytes.
    let erased = t
        .acme
        .send(
            t.acme
                .request(reqwest::Method::DELETE, &format!("/v1/sessions/{session}")),
        )
        .await;
    assert!(erased.status.is_success(), "{}", erased.body);
    let fresh = t.acme.session().await;
    model.push(Reply::text("Room again."));
    let again = t.acme.say(&fresh, "hello again").await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    // The keyed message is not answered from its key: retried, it runs
    // (its session is gone now, so it is not found, not a replayed 413).
    let retried = t.acme.send(keyed(&session)).await;
    assert_eq!(retried.status, StatusCode::NOT_FOUND, "{}", retried.body);
    assert_eq!(model.overruns(), 0);
}

/// A direct tool call (HTTP invoke, no session) stores a record holding
/// its arguments; the records used to count for nothing, so a tenant
/// could store ~1 MiB/s of them past its quota. Now they count: a tenant
/// that fills its quota with direct calls gets 413 for the next call and
/// the next message, and erasing its records (`DELETE
/// /v1/tenants/{id}/sessions`) brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filling_its_quota_with_direct_tool_calls_is_refused_until_it_erases() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let a = t
        .admin
        .send(
            t.admin
                .request(reqwest::Method::PATCH, "/v1/tenants/acme/config")
                .json(&json!({ "max_storage_mb": 1 })),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // 60 KiB of arguments a call (the calculator refuses so long an
    // expression; its record keeps them all the same), under the size a
    // body is checked at before it is read.
    let padded = json!({"params": {"expression": format!("1+1{}", " ".repeat(60 * 1024))}});
    let invoke = |caller: &Caller| {
        caller
            .request(reqwest::Method::POST, "/v1/tools/calculator/invoke")
            .json(&padded)
    };
    let mut stored = 0;
    let refused = loop {
        let answer = t.acme.send(invoke(&t.acme)).await;
        if answer.status == StatusCode::PAYLOAD_TOO_LARGE {
            break answer;
        }
        stored += 1;
        assert!(
            stored <= 18,
            "1 MiB holds at most 18 records of 60 KiB: {}",
            answer.body
        );
    };
    assert!(stored >= 16, "{stored} records stored before the quota");
    assert_eq!(
        refused.body["error"]["code"], "STORAGE_QUOTA_EXCEEDED",
        "{}",
        refused.body
    );
    // The quota is the tenant's, whatever stored it: no message either.
    let session = t.acme.session().await;
    let said = t.acme.say(&session, "hello?").await;
    assert_eq!(said.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", said.body);
    // Another tenant calls on.
    let other = t.globex.send(invoke(&t.globex)).await;
    assert_ne!(
        other.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        other.body
    );

    // Erasing the tenant's records frees their bytes.
    let erased = t
        .admin
        .send(
            t.admin
                .request(reqwest::Method::DELETE, "/v1/tenants/acme/sessions"),
        )
        .await;
    assert_eq!(erased.status, StatusCode::OK, "{}", erased.body);
    assert_eq!(erased.body["calls"], stored, "{}", erased.body);
    let (_, calls) = t.acme.get("/v1/calls").await;
    assert_eq!(calls["calls"], json!([]), "{calls}");
    let again = t.acme.send(invoke(&t.acme)).await;
    assert_ne!(
        again.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        again.body
    );
    assert_eq!(model.overruns(), 0);
}

/// Sends the head of a POST to `path` declaring a body of `length` bytes,
/// and no body; what the server answers, read until it closes the
/// connection, within 5 s.
async fn head_only(caller: &Caller, path: &str, length: u64) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = caller.base.trim_start_matches("http://").to_owned();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n",
        caller.key.as_deref().expect("a key")
    );
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed before any body was sent")
        .expect("read the answer");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A message or a tool call the tenant's quota or write share will refuse
/// used to be read whole first (up to 1 MiB each). Its declared length now
/// decides before the body is read: the same 413 or 429 arrives at once,
/// for a request that declares a body and never sends it, and the
/// connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_quota_or_the_share_will_refuse_is_refused_before_it_is_read() {
    let model = MockModel::start().await;
    // 64 KiB/s: a bucket of 256 KiB.
    let t = keyed_with(&model, "[tenants]\nwrite_kib_per_s = 64\n").await;
    let a = t
        .admin
        .send(
            t.admin
                .request(reqwest::Method::PATCH, "/v1/tenants/acme/config")
                .json(&json!({ "max_storage_mb": 1 })),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // acme stores 240 KiB of its 1 MiB, and has share left.
    let acme = t.acme.session().await;
    model.push(Reply::text("Stored."));
    let stored = t.acme.say(&acme, &"y".repeat(240 * 1024)).await;
    assert_eq!(stored.status, StatusCode::OK, "{}", stored.body);

    // 1,000,000 bytes (under the 1 MiB cap on bodies) is more than is left.
    for path in [
        format!("/v1/sessions/{acme}/messages"),
        "/v1/tools/calculator/invoke".to_string(),
    ] {
        let answer = head_only(&t.acme, &path, 1_000_000).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains("STORAGE_QUOTA_EXCEEDED"),
            "{path}: {answer}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{path}: {answer}"
        );
    }
    // What fits is stored as before.
    model.push(Reply::text("Fine."));
    let fits = t.acme.say(&acme, &"z".repeat(100 * 1024)).await;
    assert_eq!(fits.status, StatusCode::OK, "{}", fits.body);

    // globex spends its share into debt: any body is refused unread.
    let globex = t.globex.session().await;
    for _ in 0..2 {
        model.push(Reply::text("Noted."));
        let sent = t.globex.say(&globex, &"x".repeat(200 * 1024)).await;
        assert_eq!(sent.status, StatusCode::OK, "{}", sent.body);
    }
    let answer = head_only(
        &t.globex,
        &format!("/v1/sessions/{globex}/messages"),
        500_000,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("RATE_LIMITED"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after"),
        "{answer}"
    );
    assert_eq!(model.overruns(), 0);
}

/// 40 turns at once against a 1,000-token budget: each used to see "under
/// budget" and spend its 1,000 tokens (40,000 in all). Each admitted turn
/// now sets aside an estimate until it ends, so the others are refused
/// (429, retry in a second: the budget is only set aside) and the spend
/// stays within one turn of the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_cannot_overspend_a_budget_many_times_over() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::with_usage(900, 100, Reply::text("Done."))));
    model.set_latency(Duration::from_millis(300));
    let t = keyed(&model).await;
    t.admin.set_budget("acme", 1_000).await;
    let mut sessions = Vec::new();
    for _ in 0..40 {
        sessions.push(t.acme.session().await);
    }
    let turns = sessions.iter().map(|s| t.acme.say(s, "Go."));
    let answers = futures::future::join_all(turns).await;
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    let refused: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(ok + refused.len(), 40, "every turn answered or refused");
    assert!(ok >= 1, "one turn runs");
    let set_aside = refused
        .iter()
        .find(|a| a.body["error"]["details"]["used_tokens"] == 0)
        .expect("a refusal while the first turn ran");
    assert_eq!(set_aside.body["error"]["code"], "BUDGET_EXCEEDED");
    assert_eq!(set_aside.retry_after, Some(1), "{}", set_aside.body);
    assert!(
        set_aside.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("set aside"),
        "{}",
        set_aside.body
    );
    let (_, report) = t.acme.usage("").await;
    let used = report["budget"]["used_tokens"].as_u64().expect("used");
    assert!(
        used <= 2_000,
        "{ok} turns ran, {used} tokens of a 1,000 budget spent"
    );
}

async fn next_frame(ws: &mut support::ws::Ws) -> Value {
    loop {
        let message = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .expect("a frame");
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).expect("a JSON frame");
        }
    }
}

// ---------------------------------------------------------------------------
// Durability
// ---------------------------------------------------------------------------

/// `cadre serve` as a child process, running open (tenant `default`, admin).
async fn serve(data: &Path, agents: &Path, model: &MockModel) -> support::server::Server {
    let (data, agents, url) = (data.to_path_buf(), agents.to_path_buf(), model.base_url());
    tokio::task::spawn_blocking(move || support::server::Server::start(&data, &agents, &url, &[]))
        .await
        .expect("the start thread finished")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_that_spent_a_budget_survives_kill_9_and_a_restart() {
    let model = MockModel::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let agents = agents();
    let mut server = serve(&data, agents.path(), &model).await;
    let open = Caller {
        base: server.base.clone(),
        client: reqwest::Client::new(),
        key: None,
    };
    open.set_budget("default", 100).await;
    let session = open.session().await;
    model.push(Reply::with_usage(90, 20, Reply::text("Hello.")));
    let turn = open.say(&session, "Hi").await;
    assert_eq!(turn.status, StatusCode::OK, "{}", turn.body);

    // Acknowledged turns are durable, and their usage with them.
    tokio::task::spawn_blocking(move || server.kill_9())
        .await
        .unwrap();
    let server = serve(&data, agents.path(), &model).await;
    let open = Caller {
        base: server.base.clone(),
        ..open
    };
    assert_eq!(open.token_usage(&session).await, counters(90, 20, 1));
    assert_budget_exceeded(&open.say(&session, "Again?").await, 110);
    assert_eq!(model.request_count(), 1, "{:?}", model.requests());
    assert_eq!(model.overruns(), 0);
}

/// `GET /v1/limits` shows a tenant's key the limits that apply to it, not
/// the runtime-wide live counters (every tenant's load); an admin sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_a_tenant_its_limits_and_only_an_admin_the_pools_load() {
    let model = MockModel::start().await;
    let t = keyed(&model).await;
    let session = t.acme.session().await;
    two_call_turn(&model);
    assert_eq!(
        t.acme.say(&session, "What is 6*7?").await.status,
        StatusCode::OK
    );

    let (status, mine) = t.globex.get("/v1/limits").await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    let pool = mine["concurrency"].as_object().expect("concurrency");
    for live in [
        "current_concurrent",
        "queue_length",
        "total_acquired",
        "total_rejected",
        "total_timeout",
        "tenants_running",
        "tenants_waiting",
    ] {
        assert!(!pool.contains_key(live), "a tenant sees {live}: {mine}");
    }
    assert!(pool["max_per_tenant"].as_u64().is_some(), "{mine}");
    for (_, b) in pool["buckets"].as_object().expect("buckets") {
        assert_eq!(
            b.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["limit"],
            "{mine}"
        );
    }

    let (status, all) = t.admin.get("/v1/limits").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert!(
        all["concurrency"]["total_acquired"].as_u64().unwrap() >= 1,
        "the admin sees acme's call: {all}"
    );
}
