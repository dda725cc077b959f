//! The bodies of cadre's fuzz targets, kept apart from libFuzzer so the same
//! inputs can be replayed without it (`cargo test` in this folder replays
//! `seeds/`, `regressions/` and any local `corpus/`).
//!
//! Each function takes the raw fuzz input, feeds it to public library code,
//! and panics (the finding) when an invariant breaks: a panic inside cadre,
//! or an answer that contradicts the function's contract.
//!
//! | target | feeds | checks |
//! |---|---|---|
//! | `param_validation` | arbitrary bytes as the model's raw arguments, and arbitrary JSON values, to the validator of every builtin tool | no panic; `Ok` is an object that validates again to itself; `Err` lists at least one field error |
//! | `calculator` | arbitrary text to `calc_eval::evaluate` | no panic, no stack overflow; `Ok` is finite and formats |
//! | `tool_file` | arbitrary text as a `.yaml`/`.yml`/`.toml` tool file to `loader::parse_file` | no panic; an accepted file's schema compiles into a validator |
//! | `http_body` | arbitrary bytes as the JSON body of every POST route of a real server (loopback, in-memory tools) | never a 5xx; every error is `{"error": {"code", "message"}}` (invoke: a failed `ToolExecutionResult`) |
//! | `workflow_def` | arbitrary text as a workflow file to `definition::load`, against a fixed catalog ([`WORKFLOW_TOOLS`], [`WORKFLOW_AGENTS`]) | no panic, no stack overflow; an accepted workflow is acyclic, every node, tool and agent it names exists, and it lists as JSON; a refusal names the file |

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cadre::tools::builtin::{self, BuiltinContext, calc_eval};
use cadre::tools::loader;
use cadre::tools::validate::ParamValidator;
use cadre::workflow::definition::{self, Body, Catalog, SessionRef, Workflow};
use cadre::workflow::template::PathExpr;
use serde_json::Value;

/// Validators of every builtin tool, lax and strict, built once.
fn validators() -> &'static [(String, ParamValidator)] {
    static V: OnceLock<Vec<(String, ParamValidator)>> = OnceLock::new();
    V.get_or_init(|| {
        let ctx = BuiltinContext {
            store: cadre::store::Store::open_in_memory().expect("in-memory store"),
            data_dir: std::env::temp_dir().join("cadre-fuzz-no-data"),
            http_allowlist: Vec::new(),
        };
        let mut out = Vec::new();
        for (def, _) in builtin::all(&ctx) {
            for strict in [false, true] {
                let v = ParamValidator::new(&def.parameters, strict)
                    .unwrap_or_else(|e| panic!("builtin schema of {} compiles: {e}", def.name));
                out.push((format!("{} (strict: {strict})", def.name), v));
            }
        }
        out
    })
}

/// First byte picks the tool; the rest are the model's raw arguments, then
/// (if they parse) the same value through `validate`.
pub fn param_validation(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let all = validators();
    let (name, validator) = &all[pick as usize % all.len()];
    let raw = String::from_utf8_lossy(rest);
    check_validation(name, validator, validator.validate_raw(&raw));
    if let Ok(value) = serde_json::from_slice::<Value>(rest) {
        check_validation(name, validator, validator.validate(value));
    }
}

fn check_validation(
    name: &str,
    validator: &ParamValidator,
    result: Result<Value, Vec<cadre::tools::FieldError>>,
) {
    match result {
        Ok(params) => {
            assert!(params.is_object(), "{name}: accepted a non-object {params}");
            let again = validator.validate(params.clone());
            assert_eq!(
                again.as_ref().ok(),
                Some(&params),
                "{name}: validated parameters do not validate to themselves"
            );
        }
        Err(errors) => assert!(!errors.is_empty(), "{name}: refused without a reason"),
    }
}

/// The whole input as an expression.
pub fn calculator(data: &[u8]) {
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(x) = calc_eval::evaluate(expr) {
        assert!(x.is_finite(), "{expr:?} evaluated to {x}");
        let shown = calc_eval::format_number(x);
        assert!(!shown.is_empty());
    }
}

/// First byte picks the file kind; the rest is the file's text.
pub fn tool_file(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let path = match pick % 3 {
        0 => Path::new("fuzz.yaml"),
        1 => Path::new("fuzz.yml"),
        _ => Path::new("fuzz.toml"),
    };
    if let Ok(file) = loader::parse_file(path, text) {
        let schema = cadre::tools::schema::to_json_schema(&file.parameters)
            .expect("an accepted file's parameters convert");
        ParamValidator::new(&schema, true).expect("an accepted file's schema compiles");
    }
}

/// A real cadre on loopback (offline model, an agent with only pure tools,
/// in a temp dir), started once per process.
struct Server {
    addr: SocketAddr,
    session: String,
    _runtime: cadre::Runtime,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let data = tempfile::tempdir().expect("data dir");
        let agents = tempfile::tempdir().expect("agents dir");
        std::fs::write(
            agents.path().join("fuzz.toml"),
            "name = \"fuzz\"\nsystem_prompt = \"p\"\ntools = [\"calculator\", \"echo\"]\n",
        )
        .expect("agent file");
        let mut config = cadre::server_config::ServerConfig::default();
        config.api_limit.per_second = 1_000_000;
        config.api_limit.burst = 1_000_000;
        let runtime = cadre::Runtime::builder()
            .data_dir(data.path())
            .agents_dir(agents.path())
            .model_endpoint(cadre::model::ModelEndpoint {
                base_url: None,
                api_key: None,
                model: None,
            })
            .config(config)
            .workers(1)
            .listen("127.0.0.1:0".parse().unwrap())
            .start()
            .expect("cadre starts");
        let addr = runtime.addr().expect("listening");
        let (status, body) = post(addr, "/v1/sessions", br#"{"agent":"fuzz"}"#);
        assert_eq!(status, 201, "{body}");
        let session = serde_json::from_str::<Value>(&body).expect("session JSON")["id"]
            .as_str()
            .expect("session id")
            .to_owned();
        Server {
            addr,
            session,
            _runtime: runtime,
            _dirs: (data, agents),
        }
    })
}

/// One request on its own connection; (status, body text).
fn post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|e| panic!("POST {path}: no answer (hang or reset): {e}"));
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("POST {path}: no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The POST routes with JSON bodies (`{session}` is the server's session).
pub const HTTP_ROUTES: [&str; 8] = [
    "/v1/sessions",
    "/v1/sessions/{session}/messages",
    "/v1/tools/calculator/invoke",
    "/v1/tools/echo/invoke",
    "/v1/tools/calculator/validate",
    "/v1/tools/create_paper_order/validate",
    "/v1/tools/http_request/validate",
    "/v1/confirmations/conf_00000000000000000000000000000000",
];

/// First byte picks the route; the rest is the body.
pub fn http_body(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let server = server();
    let route = HTTP_ROUTES[pick as usize % HTTP_ROUTES.len()];
    let path = route.replace("{session}", &server.session);
    let (status, text) = post(server.addr, &path, body);
    let what = || format!("POST {route} {:?}", String::from_utf8_lossy(body));
    assert!(status < 500, "{}: HTTP {status}: {text}", what());
    if status < 400 {
        return;
    }
    let reply: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{}: HTTP {status} body is not JSON: {text}", what()));
    match &reply["error"] {
        Value::Object(error) => {
            let code = error
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            assert!(
                !code.is_empty() && !message.is_empty(),
                "{}: HTTP {status}: {text}",
                what()
            );
        }
        _ if route.ends_with("/invoke") => {
            assert_eq!(reply["is_success"], false, "{}: {text}", what());
            assert!(reply["error_type"].is_string(), "{}: {text}", what());
        }
        _ => panic!("{}: HTTP {status} without an error object: {text}", what()),
    }
}

/// The tools a fuzzed workflow may name: those of the shipped workflows
/// (`agents/workflows/*.toml`) and of the definition's unit tests.
pub const WORKFLOW_TOOLS: [&str; 13] = [
    "echo",
    "calculator",
    "emit",
    "gate",
    "fail",
    "get_price",
    "get_indicators",
    "get_news",
    "get_account_summary",
    "get_positions_list",
    "get_performance",
    "get_quotes",
    "http_request",
];

/// The agents a fuzzed workflow may name.
pub const WORKFLOW_AGENTS: [&str; 2] = ["analyst", "writer"];

struct FixedCatalog;

impl Catalog for FixedCatalog {
    fn has_tool(&self, name: &str) -> bool {
        WORKFLOW_TOOLS.contains(&name)
    }
    fn has_agent(&self, name: &str) -> bool {
        WORKFLOW_AGENTS.contains(&name)
    }
}

/// Where fuzzed workflow text claims to come from.
pub const WORKFLOW_PATH: &str = "agents/workflows/fuzz.toml";

/// `text` loaded as [`WORKFLOW_PATH`] against the fixed catalog.
pub fn load_workflow(text: &str) -> Result<Arc<Workflow>, definition::DefinitionError> {
    definition::load(Path::new(WORKFLOW_PATH), text, &FixedCatalog)
}

/// The whole input as the text of [`WORKFLOW_PATH`].
pub fn workflow_def(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(WORKFLOW_PATH);
    match load_workflow(text) {
        Ok(wf) => check_workflow(&wf, text),
        Err(e) => {
            assert_eq!(e.file(), path, "{text:?}: refusal names another file");
            let shown = e.to_string();
            assert!(
                shown.starts_with("agents/workflows/fuzz.toml: ") && shown.len() > 28,
                "{text:?}: refusal without the file or a reason: {shown}"
            );
        }
    }
}

/// What an accepted workflow promises, re-derived from its parts (not from
/// the compiler's own `needs` alone).
fn check_workflow(wf: &Workflow, text: &str) {
    let what = || format!("{text:?} accepted as {wf:?}");
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    assert!(
        name_ok(&wf.name) && wf.name != "runs",
        "{}: bad name",
        what()
    );
    assert!(!wf.nodes.is_empty(), "{}: no nodes", what());
    let index_of = |id: &str| wf.nodes.iter().position(|n| n.id == id);
    for (i, node) in wf.nodes.iter().enumerate() {
        let id = &node.id;
        assert!(name_ok(id), "{}: bad node id {id:?}", what());
        assert_eq!(index_of(id), Some(i), "{}: node id {id} used twice", what());
        // Every edge points at a node; `needs` is sorted without repeats.
        assert!(
            node.needs.iter().all(|&d| d < wf.nodes.len()),
            "{}: node {id} needs a node out of range: {:?}",
            what(),
            node.needs
        );
        assert!(
            node.needs.windows(2).all(|w| w[0] < w[1]),
            "{}: node {id}: needs not sorted and unique: {:?}",
            what(),
            node.needs
        );
        // Everything the node reads or waits for exists and is an edge.
        let needed = |other: &str, field: &str| {
            let j = index_of(other).unwrap_or_else(|| {
                panic!(
                    "{}: node {id}: {field} names missing node {other:?}",
                    what()
                )
            });
            assert!(
                node.needs.contains(&j),
                "{}: node {id}: {field} reads {other} but does not need it",
                what()
            );
        };
        for dep in &node.depends_on {
            needed(dep, "depends_on");
        }
        let is_map = node.map.is_some();
        let mut reads: Vec<(&str, &PathExpr)> = Vec::new();
        match &node.body {
            Body::Tool { tool, params } => {
                assert!(
                    WORKFLOW_TOOLS.contains(&tool.as_str()),
                    "{}: node {id}: unknown tool {tool:?}",
                    what()
                );
                reads.extend(params.paths().into_iter().map(|p| ("params", p)));
            }
            Body::Agent {
                agent,
                prompt,
                session,
            } => {
                assert!(
                    WORKFLOW_AGENTS.contains(&agent.as_str()),
                    "{}: node {id}: unknown agent {agent:?}",
                    what()
                );
                reads.extend(prompt.paths().map(|p| ("prompt", p)));
                if let SessionRef::Continue(other) = session {
                    needed(other, "session");
                    let target = &wf.nodes[index_of(other).unwrap()];
                    assert!(
                        other != id
                            && target.map.is_none()
                            && matches!(target.body, Body::Agent { .. }),
                        "{}: node {id} continues the session of {other}, not a plain agent node",
                        what()
                    );
                }
            }
        }
        for (field, p) in &reads {
            assert!(
                is_map || !p.needs_item(),
                "{}: node {id}: {field} reads {} outside a map node",
                what(),
                p.text
            );
        }
        if let Some(m) = &node.map {
            assert!(m.max_parallel >= 1, "{}: node {id}: max_parallel 0", what());
            assert!(
                !m.over.needs_item(),
                "{}: node {id}: map reads item",
                what()
            );
            reads.push(("map", &m.over));
        }
        if let Some(c) = &node.when {
            for p in c.paths() {
                assert!(!p.needs_item(), "{}: node {id}: when reads item", what());
                reads.push(("when", p));
            }
        }
        for (field, p) in reads {
            if let Some(other) = p.node() {
                needed(other, field);
            }
        }
        if let Some(t) = node.timeout {
            assert!(!t.is_zero(), "{}: node {id}: zero timeout", what());
        }
    }
    // Acyclic: Kahn's algorithm orders every node.
    let mut waiting: Vec<usize> = wf.nodes.iter().map(|n| n.needs.len()).collect();
    let mut ready: Vec<usize> = (0..wf.nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut ordered = 0;
    while let Some(i) = ready.pop() {
        ordered += 1;
        for (j, n) in wf.nodes.iter().enumerate() {
            if n.needs.contains(&i) {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.push(j);
                }
            }
        }
    }
    assert_eq!(
        ordered,
        wf.nodes.len(),
        "{}: the nodes have a cycle",
        what()
    );
    if let Some(output) = &wf.output {
        for p in output.paths() {
            assert!(!p.needs_item(), "{}: output reads {}", what(), p.text);
            if let Some(other) = p.node() {
                assert!(
                    index_of(other).is_some(),
                    "{}: output reads missing node {other:?}",
                    what()
                );
            }
        }
    }
    let listed = wf.to_json();
    assert_eq!(
        listed["nodes"].as_array().map(Vec::len),
        Some(wf.nodes.len()),
        "{}: listing {listed}",
        what()
    );
}

/// Every target, by name (for replaying files).
pub fn target(name: &str) -> Option<fn(&[u8])> {
    let f: fn(&[u8]) = match name {
        "param_validation" => param_validation,
        "calculator" => calculator,
        "tool_file" => tool_file,
        "http_body" => http_body,
        "workflow_def" => workflow_def,
        _ => return None,
    };
    Some(f)
}
