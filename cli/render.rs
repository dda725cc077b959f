//! What the read commands print, from the data both paths share: the
//! store's records (`Session`, `StoredMessage`, `ToolCallRecord`,
//! `ToolDefinition`, `WorkflowRun`) or the HTTP API's JSON documents
//! (export, stats, workflow list, turn and workflow events, schedules and
//! their runs). The local
//! path builds those documents with the same library functions the server
//! uses, so `--url` changes where the data comes from, not what is printed.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::Value;

use cadre::store::{Session, StoredMessage, ToolCallRecord};
use cadre::tenants::{KeyInfo, KeyStatus};
use cadre::tools::ToolDefinition;
use cadre::workflow::WorkflowRun;

/// `cadre sessions list`: one line per session.
pub fn session_line(s: &Session) -> String {
    format!(
        "{}  {:<12} {:<18} {}",
        s.id, s.tenant, s.agent, s.created_at
    )
}

/// `cadre keys list`: one line per key: id, tenant, role, plan, created, status.
pub fn key_line(k: &KeyInfo) -> String {
    let role = match (k.admin, k.metrics) {
        (true, _) => "admin",
        (false, true) => "metrics",
        (false, false) => "tenant",
    };
    let status = match (k.status, k.expires_at, k.revoked_at) {
        (KeyStatus::Revoked, _, Some(at)) => format!("revoked {at}"),
        (KeyStatus::Expired, Some(at), _) => format!("expired {at}"),
        (KeyStatus::Active, Some(at), _) => format!("active until {at}"),
        (status, _, _) => format!("{status:?}").to_lowercase(),
    };
    format!(
        "{:<14} {:<20} {role:<7} {:<8} {} {status}",
        k.key_id,
        k.tenant,
        k.plan.as_str(),
        k.created_at
    )
}

/// `cadre keys create`: the key alone on stdout (it is shown once), what
/// it is on stderr.
pub fn created_key(key: &str, k: &KeyInfo) {
    println!("{key}");
    let role = match (k.admin, k.metrics) {
        (true, _) => ", admin",
        (false, true) => ", metrics only",
        (false, false) => "",
    };
    let expiry = k
        .expires_at
        .map(|at| format!(", expires {at}"))
        .unwrap_or_default();
    eprintln!(
        "key {} for tenant {} (plan {}{role}{expiry}): shown once, store it now",
        k.key_id,
        k.tenant,
        k.plan.as_str()
    );
}

/// What a schedule runs: `agent:NAME` or `workflow:NAME`.
fn schedule_target(s: &Value) -> String {
    match (s["agent"].as_str(), s["workflow"].as_str()) {
        (Some(agent), _) => format!("agent:{agent}"),
        (None, Some(workflow)) => format!("workflow:{workflow}"),
        (None, None) => "?".into(),
    }
}

/// When a schedule fires: `cron "EXPR" ZONE` or `every Ns`.
fn schedule_timing(s: &Value) -> String {
    match (s["cron"].as_str(), s["interval_s"].as_u64()) {
        (Some(cron), _) => format!("cron \"{cron}\" {}", text(&s["timezone"])),
        (None, Some(n)) => format!("every {n}s"),
        (None, None) => "?".into(),
    }
}

/// `cadre schedules list`: one line per schedule: id, what it runs, when,
/// its next fire (`firing` while a node fires it) and its newest run
/// (when it fired, its state and, once known, its turn's or run's status).
pub fn schedule_line(s: &Value, last: Option<&Value>) -> String {
    let next = match s["next_fire_at"].as_str() {
        Some(at) => at.to_string(),
        None => "firing".into(),
    };
    let last = match last {
        Some(r) => {
            let status = r["status"]
                .as_str()
                .map(|st| format!(" {st}"))
                .unwrap_or_default();
            format!("{} {}{status}", text(&r["fired_at"]), text(&r["state"]))
        }
        None => "never".into(),
    };
    let inactive = if s["active"] == Value::Bool(false) {
        "  inactive (its key is revoked or expired)"
    } else {
        ""
    };
    format!(
        "{}  {:<24} {:<34} next {next}  last {last}{inactive}",
        text(&s["id"]),
        schedule_target(s),
        schedule_timing(s)
    )
}

/// `cadre schedules create`: the id alone on stdout (for `ID=$(…)`), what
/// was made on stderr.
pub fn created_schedule(s: &Value) {
    println!("{}", text(&s["id"]));
    let next = s["next_fire_at"]
        .as_str()
        .map(|at| format!(", next fire {at}"))
        .unwrap_or_default();
    eprintln!(
        "schedule {}: {}, {}{next}",
        text(&s["id"]),
        schedule_target(s),
        schedule_timing(s)
    );
}

/// `cadre schedules runs`: one line per fire: slot, when it fired, state,
/// status, and the session and turn (or workflow run) it started.
pub fn schedule_run_line(r: &Value) -> String {
    let started = match (r["session_id"].as_str(), r["run_id"].as_str()) {
        (Some(session), _) => format!("session {session} turn {}", text(&r["turn_id"])),
        (None, Some(run)) => format!("run {run}"),
        (None, None) => String::new(),
    };
    let error = r["error"]
        .as_str()
        .map(|e| format!("  error: {e}"))
        .unwrap_or_default();
    format!(
        "{}  fired {}  {:<8} {:<18} {started}{error}",
        text(&r["slot"]),
        text(&r["fired_at"]),
        text(&r["state"]),
        r["status"].as_str().unwrap_or("-")
    )
    .trim_end()
    .to_string()
}

/// `cadre sessions show`: the session and its messages, from an export
/// document (`session` and `messages`).
pub fn show(doc: &Value) -> anyhow::Result<()> {
    let session: Session =
        serde_json::from_value(doc["session"].clone()).context("the export has no session")?;
    let messages: Vec<StoredMessage> =
        serde_json::from_value(doc["messages"].clone()).context("the export has no messages")?;
    println!(
        "session {} (agent {}, tenant {})",
        session.id, session.agent, session.tenant
    );
    for m in messages {
        let role = format!("{:?}", m.message.role).to_lowercase();
        let who = m
            .message
            .name
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let text = match (&m.message.content, m.message.tool_calls.is_empty()) {
            (_, false) => m
                .message
                .tool_calls
                .iter()
                .map(|c| format!("→ {}({})", c.name, c.arguments))
                .collect::<Vec<_>>()
                .join(" "),
            (Some(c), true) => c.clone(),
            (None, true) => String::new(),
        };
        println!("[{:>4}] {role}{who}: {text}", m.seq);
    }
    Ok(())
}

/// Any JSON document, pretty (export, summary, invoke results).
pub fn json(doc: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(doc)?);
    Ok(())
}

/// `cadre calls`: one line per call record.
pub fn call_line(c: &ToolCallRecord) -> String {
    let outcome = if c.is_success {
        "ok".to_string()
    } else {
        c.error_type.clone().unwrap_or_else(|| "failed".into())
    };
    format!(
        "{} {:<22} {:<18} {:>6} ms  {} {}",
        c.created_at,
        c.tool_name,
        outcome,
        c.execution_time_ms,
        c.caller_type,
        c.conversation_id
            .clone()
            .or(c.workflow_id.clone())
            .unwrap_or_default()
    )
}

/// `cadre stats`: the table of a `/v1/stats` document.
pub fn stats(doc: &Value) {
    println!(
        "{:<24} {:>8} {:>8} {:>8} {:>10}",
        "tool", "calls", "ok", "failed", "avg ms"
    );
    let Some(tools) = doc["tools"].as_object() else {
        return;
    };
    for (name, s) in tools {
        let n = |k: &str| s[k].as_u64().unwrap_or(0);
        let avg = s["avg_execution_time_ms"].as_f64().unwrap_or(0.0);
        println!(
            "{name:<24} {:>8} {:>8} {:>8} {avg:>10.1}",
            n("total_calls"),
            n("successful_calls"),
            n("failed_calls")
        );
    }
}

/// `cadre tools list`: one line per definition (name, plan, category,
/// side effects, per-minute limit, description).
pub fn tool_line(d: &ToolDefinition) -> String {
    let limit = d
        .rate_limit
        .per_minute
        .map(|n| format!(" {n}/min"))
        .unwrap_or_default();
    format!(
        "{:<24} {:<8} {:<10} {:<12}{limit}  {}",
        d.name,
        d.required_plan.as_str(),
        d.category,
        d.side_effects.as_str(),
        d.description
    )
}

/// `cadre workflow list`, from a `/v1/workflows` document (`workflows`,
/// `errors`); fails when a file did not load.
pub fn workflows(doc: &Value) -> anyhow::Result<()> {
    for w in doc["workflows"].as_array().into_iter().flatten() {
        let nodes: Vec<String> = w["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("{}({})", text(&n["id"]), text(&n["kind"])))
            .collect();
        println!("{:<20} {}", text(&w["name"]), text(&w["description"]));
        println!("{:<20} nodes: {}", "", nodes.join(", "));
    }
    let errors = doc["errors"].as_array().cloned().unwrap_or_default();
    for e in &errors {
        eprintln!("error: {}", text(&e["message"]));
    }
    if !errors.is_empty() {
        bail!("{} workflow file(s) did not load", errors.len());
    }
    Ok(())
}

/// One workflow event (`{"type": …}` as the SSE stream and the event bus
/// serialize it), prefixed with `at`; true when it ends the run.
pub fn workflow_event(at: &str, event: &Value) -> bool {
    let node = text(&event["node"]);
    let item = || format!("{node}[{}]", event["item"]);
    match event["type"].as_str().unwrap_or_default() {
        "node_started" => println!("{at} {node:<16} started"),
        "node_succeeded" => println!(
            "{at} {node:<16} succeeded ({} attempt(s))",
            event["attempts"]
        ),
        "node_failed" => println!("{at} {node:<16} failed: {}", text(&event["error"])),
        "node_skipped" => println!("{at} {node:<16} skipped: {}", text(&event["reason"])),
        "item_started" => println!("{at} {:<16} started", item()),
        "item_succeeded" => println!("{at} {:<16} succeeded", item()),
        "item_failed" => println!("{at} {:<16} failed: {}", item(), text(&event["error"])),
        "run_finished" => {
            println!("{at} run {}", text(&event["status"]));
            return true;
        }
        _ => {}
    }
    false
}

/// The end of `cadre workflow run`: the run's output (or its nodes'
/// outputs); fails when the run did.
pub fn workflow_result(run: &WorkflowRun) -> anyhow::Result<()> {
    let shown = match &run.output {
        Some(output) => output.clone(),
        None => serde_json::json!(
            run.nodes
                .iter()
                .map(|(id, n)| (id.clone(), n.output.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
        ),
    };
    println!("{}", serde_json::to_string_pretty(&shown)?);
    if let Some(error) = &run.error {
        bail!("run {} {}: {error}", run.id, run.status.as_str());
    }
    Ok(())
}

/// `cadre tools invoke`: the full `ToolExecutionResult`; fails when the
/// call did.
pub fn invoke_result(result: &Value) -> anyhow::Result<()> {
    json(result)?;
    if let Some(t) = result["error_type"].as_str() {
        bail!("the call failed ({t}): {}", text(&result["error"]));
    }
    Ok(())
}

/// Prints a turn's events as `cadre chat` shows them. Events are the JSON
/// the SSE stream sends (`{"type": …}`); `live` streams model text as it
/// comes (interactive), otherwise the answer is printed at the end.
pub struct TurnPrinter {
    live: bool,
    streamed: bool,
}

impl TurnPrinter {
    pub fn new(live: bool) -> Self {
        TurnPrinter {
            live,
            streamed: false,
        }
    }

    pub fn event(&mut self, event: &Value) {
        match event["type"].as_str().unwrap_or_default() {
            "turn_started" if self.live => eprint!("… thinking\r"),
            "tool_call_started" => {
                println!("[tool] {}({}) …", text(&event["name"]), event["arguments"]);
            }
            "tool_call_completed" => {
                let result = match (event.get("output"), event.get("error")) {
                    (Some(out), _) => format!("ok: {out}"),
                    (None, Some(err)) => format!("failed: {}", text(err)),
                    (None, None) => "no output".into(),
                };
                println!("[tool] {} -> {result}", text(&event["name"]));
            }
            "model_delta" if self.live => {
                self.streamed = true;
                print!("{}", text(&event["text"]));
                let _ = std::io::stdout().flush();
            }
            _ => {}
        }
    }

    /// A turn paused for confirmations (the reply's body): what waits,
    /// and how to decide it.
    pub fn paused(&self, outcome: &Value) {
        if self.streamed {
            println!();
        }
        for c in outcome["confirmations"].as_array().into_iter().flatten() {
            println!(
                "[waiting for approval] {} ({}): POST /v1/confirmations/{} {{\"approve\": true|false}} resumes turn {}",
                text(&c["tool_name"]),
                text(&c["summary"]),
                text(&c["confirmation_id"]),
                text(&outcome["turn_id"]),
            );
        }
    }

    /// The turn's end: its answer, unless it was streamed already.
    pub fn finish(&self, answer: &str) {
        if self.streamed {
            println!();
        } else {
            println!("{answer}");
        }
    }
}

/// A JSON string's text, or the value as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
