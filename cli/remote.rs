//! `--url URL` (env `CADRE_URL`) and `--api-key KEY` (env `CADRE_API_KEY`):
//! the read and run commands talk to a running `cadre serve` over its HTTP
//! API instead of opening the data dir, which the server holds.
//!
//! command ──▶ [`run`] ──HTTP (Bearer key)──▶ /v1/… ──JSON──▶ [`render`] ──▶ stdout
//!
//! Decisions where the task was silent:
//! - Commands that check files on this machine (`tools check`, `config
//!   check`) or run the server (`serve`) ignore `--url`: [`run`] returns
//!   `None` for them and `main` runs them locally.
//! - `keys create|list|revoke` go to `/v1/keys` (the `--api-key` must be an
//!   admin key, or the server runs open) and print what the local commands
//!   print: the record comes back as the same `KeyInfo`.
//! - A JSON error body (`{"error": {"code", "message", "details"?}}`)
//!   becomes the command's error, `CODE (HTTP status): message`, so it is
//!   printed on stderr and the exit code is 1. A body that is not JSON is
//!   shown as text; a server that cannot be reached names the URL.
//! - `schedules list|create|delete|runs` exist only here: schedules are
//!   kept and fired by a running server. Without `--url` they ask the
//!   server that holds `--data-dir` (as every data-dir command does when a
//!   server holds it) and fail, saying so, when none does. `list` asks each
//!   schedule's newest run (`…/runs?limit=1`) for its "last" column.
//! - `memory search|get|put|delete` likewise (served by a running server;
//!   docs/memory.md): namespaces are written `users.u1` as in the API's
//!   query string; `search` prints one line per item (score, namespace,
//!   key, value as JSON), `get` the value.
//! - `chat` streams the turn (`Accept: text/event-stream`, the same events
//!   the in-process chat prints); `workflow run` starts the run, follows
//!   its SSE events (a run that ends before the stream opens shows only its
//!   result) and prints the final run as the local command does.
//! - Blocking use of reqwest's async client on a current-thread runtime: the
//!   CLI does one thing at a time, and reqwest's `blocking` feature would
//!   start a second runtime for nothing.

use std::time::Instant;

use anyhow::{Context, bail};
use reqwest::{Method, RequestBuilder, Response};
use serde_json::{Value, json};

use crate::render;
use crate::{
    Command, KeysCommand, MemoryCommand, SchedulesCommand, SessionsCommand, ToolsCommand,
    WorkflowCommand,
};
use cadre::store::{Session, ToolCallRecord};
use cadre::tenants::KeyInfo;
use cadre::tools::ToolDefinition;
use cadre::workflow::WorkflowRun;

/// Runs `command` against the server at `url`; `None` when the command is
/// local by nature (see the module doc).
pub fn run(url: &str, api_key: Option<&str>, command: &Command) -> Option<anyhow::Result<()>> {
    let remote = matches!(
        command,
        Command::Sessions { .. }
            | Command::Schedules { .. }
            | Command::Memory { .. }
            | Command::Calls { .. }
            | Command::Stats { .. }
            | Command::Chat { .. }
            | Command::Workflow { .. }
            | Command::Keys { .. }
            | Command::Tools {
                command: ToolsCommand::List { .. } | ToolsCommand::Invoke { .. },
            }
    );
    if !remote {
        return None;
    }
    let client = Client::new(url, api_key);
    Some(client.and_then(|c| c.command(command)))
}

struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

/// An error reply of the API, as the server wrote it.
fn api_error(status: reqwest::StatusCode, body: &Value) -> anyhow::Error {
    let error = &body["error"];
    let code = error["code"].as_str().unwrap_or("ERROR");
    let message = error["message"].as_str().unwrap_or("no message");
    let mut text = format!("{code} (HTTP {}): {message}", status.as_u16());
    if let Some(details) = error.get("details") {
        text.push_str(&format!("\ndetails: {details}"));
    }
    anyhow::anyhow!(text)
}

fn is_api_error(body: &Value) -> bool {
    body["error"].is_object() && body["error"]["code"].is_string()
}

impl Client {
    fn new(url: &str, key: Option<&str>) -> anyhow::Result<Client> {
        let parsed = url::Url::parse(url).with_context(|| format!("--url '{url}' is not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            bail!("--url '{url}' must be http:// or https://");
        }
        Ok(Client {
            base: url.trim_end_matches('/').to_string(),
            key: key.map(str::to_string),
            http: reqwest::Client::builder()
                .user_agent(concat!("cadre-cli/", env!("CARGO_PKG_VERSION")))
                .build()?,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// Sends, and reads the reply as JSON (status and body; `null` for an
    /// empty success).
    fn send(&self, request: RequestBuilder) -> anyhow::Result<(reqwest::StatusCode, Value)> {
        self.rt.block_on(async {
            let response = request
                .send()
                .await
                .with_context(|| format!("cannot reach cadre at {}", self.base))?;
            let status = response.status();
            let text = response.text().await.context("reading the reply")?;
            match serde_json::from_str::<Value>(&text) {
                Ok(body) => Ok((status, body)),
                // 204 No Content (a revoked key).
                Err(_) if status.is_success() && text.is_empty() => Ok((status, Value::Null)),
                Err(_) if status.is_success() => {
                    bail!("the server's reply is not JSON: {}", text.trim())
                }
                Err(_) => bail!("HTTP {}: {}", status.as_u16(), text.trim()),
            }
        })
    }

    /// A JSON request that must succeed; its body.
    fn call(&self, request: RequestBuilder) -> anyhow::Result<Value> {
        let (status, body) = self.send(request)?;
        if !status.is_success() || is_api_error(&body) {
            return Err(api_error(status, &body));
        }
        Ok(body)
    }

    fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(self.request(Method::GET, path))
    }

    fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.call(self.request(Method::POST, path).json(body))
    }

    /// Opens a Server-Sent Events stream; a JSON error reply fails here.
    fn stream(&self, request: RequestBuilder) -> anyhow::Result<Sse> {
        let request = request.header(reqwest::header::ACCEPT, "text/event-stream");
        let response = self.rt.block_on(async {
            request
                .send()
                .await
                .with_context(|| format!("cannot reach cadre at {}", self.base))
        })?;
        let status = response.status();
        if !status.is_success() {
            let text = self.rt.block_on(response.text()).unwrap_or_default();
            return Err(match serde_json::from_str::<Value>(&text) {
                Ok(body) => api_error(status, &body),
                Err(_) => anyhow::anyhow!("HTTP {}: {}", status.as_u16(), text.trim()),
            });
        }
        Ok(Sse {
            response,
            buffer: String::new(),
        })
    }

    fn command(&self, command: &Command) -> anyhow::Result<()> {
        match command {
            Command::Sessions { command } => self.sessions(command),
            Command::Calls {
                session,
                tool,
                workflow,
                limit,
                ..
            } => {
                let mut query = vec![("limit", limit.to_string())];
                for (k, v) in [
                    ("conversation_id", session),
                    ("tool", tool),
                    ("workflow_id", workflow),
                ] {
                    if let Some(v) = v {
                        query.push((k, v.clone()));
                    }
                }
                let body = self.call(self.request(Method::GET, "/v1/calls").query(&query))?;
                let calls: Vec<ToolCallRecord> = serde_json::from_value(body["calls"].clone())
                    .context("the server's call records")?;
                for c in &calls {
                    println!("{}", render::call_line(c));
                }
                Ok(())
            }
            Command::Stats { .. } => {
                render::stats(&self.get("/v1/stats")?);
                Ok(())
            }
            Command::Tools {
                command: ToolsCommand::List { plan, .. },
            } => {
                let mut query = vec![("view", "definitions".to_string())];
                if let Some(p) = plan {
                    query.push(("plan", p.clone()));
                }
                let body = self.call(self.request(Method::GET, "/v1/tools").query(&query))?;
                let defs: Vec<ToolDefinition> = serde_json::from_value(body["tools"].clone())
                    .context("the server's tool definitions")?;
                for d in &defs {
                    println!("{}", render::tool_line(d));
                }
                Ok(())
            }
            Command::Tools {
                command:
                    ToolsCommand::Invoke {
                        name,
                        params,
                        plan,
                        user_id,
                        ..
                    },
            } => {
                let params: Value =
                    serde_json::from_str(params).context("--params must be JSON")?;
                let body = json!({"params": params, "plan": plan, "user_id": user_id});
                let path = format!("/v1/tools/{}/invoke", segment(name));
                // Every reply of invoke is the full result, whatever its status;
                // only a request the API refused has the error shape.
                let (status, result) = self.send(self.request(Method::POST, &path).json(&body))?;
                if is_api_error(&result) {
                    return Err(api_error(status, &result));
                }
                render::invoke_result(&result)
            }
            Command::Workflow {
                command: WorkflowCommand::List { .. },
            } => render::workflows(&self.get("/v1/workflows")?),
            Command::Workflow {
                command:
                    WorkflowCommand::Run {
                        name,
                        input,
                        user_id,
                        ..
                    },
            } => self.workflow_run(name, input, user_id.as_deref()),
            Command::Chat {
                agent,
                plan,
                session,
                message,
                ..
            } => self.chat(agent, plan, session.as_deref(), message.clone()),
            Command::Keys { command } => self.keys(command),
            Command::Schedules { command } => self.schedules(command),
            Command::Memory { command } => self.memory(command),
            _ => unreachable!("run() passes only remote commands"),
        }
    }

    fn keys(&self, command: &KeysCommand) -> anyhow::Result<()> {
        match command {
            KeysCommand::Create {
                tenant,
                admin,
                plan,
                metrics,
                expires_at,
                ..
            } => {
                let body = json!({
                    "tenant": tenant,
                    "admin": admin,
                    "plan": plan,
                    "metrics": metrics,
                    "expires_at": expires_at,
                });
                let created = self.post("/v1/keys", &body)?;
                let key = created["key"].as_str().context("the server sent no key")?;
                let info: KeyInfo =
                    serde_json::from_value(created.clone()).context("the server's key record")?;
                render::created_key(key, &info);
                if let Some(notice) = created["notice"].as_str() {
                    eprintln!("note: {notice}");
                }
                Ok(())
            }
            KeysCommand::List { .. } => {
                let body = self.get("/v1/keys")?;
                let keys: Vec<KeyInfo> =
                    serde_json::from_value(body["keys"].clone()).context("the server's keys")?;
                for k in &keys {
                    println!("{}", render::key_line(k));
                }
                Ok(())
            }
            KeysCommand::Revoke { key_id, .. } => {
                let path = format!("/v1/keys/{}", segment(key_id));
                self.call(self.request(Method::DELETE, &path))?;
                println!("revoked {key_id}");
                Ok(())
            }
        }
    }

    fn memory(&self, command: &MemoryCommand) -> anyhow::Result<()> {
        let dotted = |namespace: &str| -> Vec<String> {
            if namespace.is_empty() {
                Vec::new()
            } else {
                namespace.split('.').map(str::to_string).collect()
            }
        };
        match command {
            MemoryCommand::Search {
                query,
                prefix,
                limit,
                ..
            } => {
                let body =
                    json!({"namespace_prefix": dotted(prefix), "query": query, "limit": limit});
                let found = self.post("/v1/memory/items/search", &body)?;
                for item in found["items"].as_array().into_iter().flatten() {
                    let namespace: Vec<&str> = item["namespace"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    println!(
                        "{:.3}  {}  {}  {}",
                        item["score"].as_f64().unwrap_or(0.0),
                        namespace.join("."),
                        item["key"].as_str().unwrap_or_default(),
                        item["value"]
                    );
                }
                Ok(())
            }
            MemoryCommand::Get { namespace, key, .. } => {
                let item = self.call(
                    self.request(Method::GET, "/v1/memory/items")
                        .query(&[("namespace", namespace), ("key", key)]),
                )?;
                println!("{}", serde_json::to_string_pretty(&item["value"])?);
                Ok(())
            }
            MemoryCommand::Put {
                namespace,
                key,
                value,
                ttl_s,
                ..
            } => {
                let value: Value =
                    serde_json::from_str(value).context("the value must be a JSON object")?;
                let mut body = json!({"namespace": dotted(namespace), "key": key, "value": value});
                if let Some(ttl) = ttl_s {
                    body["ttl_s"] = json!(ttl);
                }
                self.call(self.request(Method::PUT, "/v1/memory/items").json(&body))?;
                println!("stored {namespace} {key}");
                Ok(())
            }
            MemoryCommand::Delete { namespace, key, .. } => {
                self.call(
                    self.request(Method::DELETE, "/v1/memory/items")
                        .query(&[("namespace", namespace), ("key", key)]),
                )?;
                println!("deleted {namespace} {key}");
                Ok(())
            }
        }
    }

    fn schedules(&self, command: &SchedulesCommand) -> anyhow::Result<()> {
        match command {
            SchedulesCommand::List { .. } => {
                let mut cursor: Option<String> = None;
                loop {
                    let mut query = vec![("limit", "1000".to_string())];
                    query.extend(cursor.take().map(|c| ("cursor", c)));
                    let body =
                        self.call(self.request(Method::GET, "/v1/schedules").query(&query))?;
                    for s in body["schedules"].as_array().into_iter().flatten() {
                        let id = s["id"].as_str().context("a schedule without an id")?;
                        let runs =
                            self.get(&format!("/v1/schedules/{}/runs?limit=1", segment(id)))?;
                        println!("{}", render::schedule_line(s, runs["runs"].get(0)));
                    }
                    match body["next"].as_str() {
                        Some(next) => cursor = Some(next.to_string()),
                        None => return Ok(()),
                    }
                }
            }
            SchedulesCommand::Create {
                agent,
                message,
                session,
                workflow,
                input,
                cron,
                interval_s,
                timezone,
                user_id,
                webhook,
                catch_up,
                ..
            } => {
                let input: Option<Value> = input
                    .as_deref()
                    .map(serde_json::from_str)
                    .transpose()
                    .context("--input must be a JSON object")?;
                let mut body = json!({
                    "agent": agent, "message": message, "session": session,
                    "workflow": workflow, "input": input,
                    "cron": cron, "interval_s": interval_s, "timezone": timezone,
                    "user_id": user_id, "webhook": webhook, "catch_up": catch_up,
                });
                // Unset flags are left out, not sent as `null`.
                if let Some(fields) = body.as_object_mut() {
                    fields.retain(|_, v| !v.is_null());
                }
                render::created_schedule(&self.post("/v1/schedules", &body)?);
                Ok(())
            }
            SchedulesCommand::Delete { id, .. } => {
                let path = format!("/v1/schedules/{}", segment(id));
                self.call(self.request(Method::DELETE, &path))?;
                println!("deleted {id}");
                Ok(())
            }
            SchedulesCommand::Runs { id, limit, .. } => {
                let path = format!("/v1/schedules/{}/runs", segment(id));
                let body =
                    self.call(self.request(Method::GET, &path).query(&[("limit", limit)]))?;
                for r in body["runs"].as_array().into_iter().flatten() {
                    println!("{}", render::schedule_run_line(r));
                }
                Ok(())
            }
        }
    }

    fn sessions(&self, command: &SessionsCommand) -> anyhow::Result<()> {
        match command {
            SessionsCommand::List { .. } => {
                // Every page, as the data-dir command lists every session.
                let mut cursor: Option<String> = None;
                loop {
                    let mut query = vec![("limit", "1000".to_string())];
                    query.extend(cursor.take().map(|c| ("cursor", c)));
                    let body =
                        self.call(self.request(Method::GET, "/v1/sessions").query(&query))?;
                    let sessions: Vec<Session> = serde_json::from_value(body["sessions"].clone())
                        .context("the server's sessions")?;
                    for s in &sessions {
                        println!("{}", render::session_line(s));
                    }
                    match body["next"].as_str() {
                        Some(next) => cursor = Some(next.to_string()),
                        None => return Ok(()),
                    }
                }
            }
            SessionsCommand::Show { id, .. } => {
                render::show(&self.get(&format!("/v1/sessions/{}/export", segment(id)))?)
            }
            SessionsCommand::Export { id, .. } => {
                render::json(&self.get(&format!("/v1/sessions/{}/export", segment(id)))?)
            }
            SessionsCommand::Summary { id, .. } => {
                render::json(&self.get(&format!("/v1/sessions/{}/summary", segment(id)))?)
            }
        }
    }

    fn workflow_run(&self, name: &str, input: &str, user_id: Option<&str>) -> anyhow::Result<()> {
        let input: Value = serde_json::from_str(input).context("--input must be a JSON object")?;
        let run = self.post(
            &format!("/v1/workflows/{}/runs", segment(name)),
            &json!({"input": input, "user_id": user_id}),
        )?;
        let id = run["id"].as_str().context("the server's run has no id")?;
        println!("run {id} of {name}");
        let started = Instant::now();
        let path = format!("/v1/workflows/runs/{}/events", segment(id));
        let mut events = self.stream(self.request(Method::GET, &path))?;
        while let Some((event, data)) = self.rt.block_on(events.next())? {
            if event == "snapshot" {
                continue;
            }
            let at = format!("[{:>7.2}s]", started.elapsed().as_secs_f64());
            let event: Value = serde_json::from_str(&data).context("a workflow event")?;
            if render::workflow_event(&at, &event) {
                break;
            }
        }
        let run: WorkflowRun =
            serde_json::from_value(self.get(&format!("/v1/workflows/runs/{}", segment(id)))?)
                .context("the server's run")?;
        render::workflow_result(&run)
    }

    fn chat(
        &self,
        agent: &str,
        plan: &str,
        session: Option<&str>,
        message: Option<String>,
    ) -> anyhow::Result<()> {
        let session = match session {
            Some(id) => self.get(&format!("/v1/sessions/{}", segment(id)))?,
            None => self.post("/v1/sessions", &json!({"agent": agent, "plan": plan}))?,
        };
        let id = session["id"]
            .as_str()
            .context("the server's session has no id")?
            .to_string();
        let plan = session["plan"].as_str().unwrap_or(plan).to_string();
        let turn = |text: String, live: bool| self.turn(&id, text, live);
        if let Some(message) = message {
            return turn(message, false);
        }
        crate::repl::repl(
            &id,
            session["agent"].as_str().unwrap_or(agent),
            turn,
            || self.get(&format!("/v1/sessions/{}/summary", segment(&id))),
            || {
                let body = self.call(
                    self.request(Method::GET, "/v1/tools")
                        .query(&[("view", "definitions"), ("plan", plan.as_str())]),
                )?;
                let defs: Vec<ToolDefinition> = serde_json::from_value(body["tools"].clone())?;
                Ok(defs.into_iter().map(|d| (d.name, d.description)).collect())
            },
        )
    }

    /// One turn, streamed.
    fn turn(&self, id: &str, text: String, live: bool) -> anyhow::Result<()> {
        let path = format!("/v1/sessions/{}/messages", segment(id));
        let mut events = self.stream(
            self.request(Method::POST, &path)
                .json(&json!({"content": text})),
        )?;
        let mut printer = render::TurnPrinter::new(live);
        while let Some((event, data)) = self.rt.block_on(events.next())? {
            let body: Value = serde_json::from_str(&data).context("a turn event")?;
            match event.as_str() {
                "turn_completed" => {
                    printer.finish(body["answer"].as_str().unwrap_or_default());
                    return Ok(());
                }
                "turn_paused" => {
                    printer.paused(&body);
                    return Ok(());
                }
                "turn_interrupted" => bail!("a newer message in this session interrupted the turn"),
                "turn_failed" => {
                    let status = body["status"].as_u64().unwrap_or(500) as u16;
                    let status = reqwest::StatusCode::from_u16(status)
                        .unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
                    return Err(api_error(status, &body));
                }
                _ => printer.event(&body),
            }
        }
        bail!("the server closed the stream before the turn ended")
    }
}

/// A path segment, percent-encoded (ids and names are user input).
fn segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// A `text/event-stream` reply, read event by event.
struct Sse {
    response: Response,
    buffer: String,
}

impl Sse {
    /// The next `(event name, data)`; `None` when the stream ends. Comments
    /// (keep-alives) are skipped; an event without a name is `message`.
    async fn next(&mut self) -> anyhow::Result<Option<(String, String)>> {
        loop {
            if let Some(event) = take_event(&mut self.buffer) {
                return Ok(Some(event));
            }
            match self.response.chunk().await.context("reading the stream")? {
                Some(bytes) => self
                    .buffer
                    .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
                None => return Ok(take_event(&mut format!("{}\n\n", self.buffer))),
            }
        }
    }
}

/// Takes the first complete event off `buffer`; skips blocks with no data.
fn take_event(buffer: &mut String) -> Option<(String, String)> {
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut name = "message".to_string();
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => name = value.to_string(),
                "data" => data.push(value),
                _ => {}
            }
        }
        if !data.is_empty() {
            return Some((name, data.join("\n")));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_named_and_keep_alives_skipped() {
        let mut buffer =
            ":\n\nevent: turn_started\ndata: {\"a\":1}\n\ndata: x\ndata: y\n\nevent: half\ndata: z"
                .to_string();
        assert_eq!(
            take_event(&mut buffer),
            Some(("turn_started".into(), "{\"a\":1}".into()))
        );
        assert_eq!(
            take_event(&mut buffer),
            Some(("message".into(), "x\ny".into()))
        );
        assert_eq!(take_event(&mut buffer), None, "an unfinished event waits");
        assert_eq!(buffer, "event: half\ndata: z");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(segment("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(segment("01J-x_y.z"), "01J-x_y.z");
    }
}
