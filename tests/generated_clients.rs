//! Clients generated from `/openapi.json` (issue #32) run a whole session
//! without casts or hand-written types: create a session, send a message
//! that places an order held for approval, approve it, list the sessions.
//!
//! - Python: `openapi-python-client` (pinned in
//!   `tests/clients/requirements.txt`) generates `cadre_client`; the
//!   generation must print no warning (a warning means a model or an
//!   operation was dropped). The script checks each answer with
//!   `isinstance` on the generated models.
//! - TypeScript: `openapi-typescript` generates the `paths` types,
//!   `openapi-fetch` calls them, and `tsc --strict` must compile the
//!   program with no error (so no `any`, no cast) before Node runs it.
//!
//! The server is the offline one with the repository's agents: the
//! trading copilot holds "Buy 10 shares of AAPL" for approval.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::{AppOptions, spawn_app};

const PYTHON: &str = r#"
import json, sys
from cadre_client import Client
from cadre_client.api.sessions import create_session, send_message, list_sessions
from cadre_client.api.confirmations import decide_confirmation
from cadre_client.models import (CreateBody, Decision, DecisionOutcome, MessageBody, PlanName,
                                 SessionList, SessionView, TurnReply, TurnStatus)

client = Client(base_url=sys.argv[1], raise_on_unexpected_status=True)
session = create_session.sync(client=client, body=CreateBody(agent="trading-copilot", plan=PlanName.PRO))
assert isinstance(session, SessionView), session
reply = send_message.sync(session.id, client=client, body=MessageBody(content="Buy 10 shares of AAPL"))
assert isinstance(reply, TurnReply), reply
assert reply.status == TurnStatus.AWAITING_APPROVAL, reply.status
decided = decide_confirmation.sync(reply.confirmations[0].confirmation_id, client=client,
                                   body=Decision(approve=True))
assert isinstance(decided, DecisionOutcome), decided
listed = list_sessions.sync(client=client)
assert isinstance(listed, SessionList), listed
print(json.dumps({"session": session.id, "status": reply.status.value, "decided": str(decided.status),
                  "listed": [s.id for s in listed.sessions]}))
"#;

const TYPESCRIPT: &str = r#"
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const client = createClient<paths>({ baseUrl: process.argv[2] });
const created = await client.POST("/v1/sessions", { body: { agent: "trading-copilot", plan: "pro" } });
if (!created.data) throw new Error(`create: ${JSON.stringify(created.error)}`);
const session: string = created.data.id;
const sent = await client.POST("/v1/sessions/{id}/messages", {
  params: { path: { id: session } },
  body: { content: "Buy 10 shares of AAPL" },
});
if (!sent.data) throw new Error(`send: ${JSON.stringify(sent.error)}`);
if (!("confirmations" in sent.data)) throw new Error("the order was not held");
const status: string = sent.data.status;
const held = sent.data.confirmations?.[0];
if (!held) throw new Error("no confirmation");
const decided = await client.POST("/v1/confirmations/{id}", {
  params: { path: { id: held.confirmation_id } },
  body: { approve: true },
});
if (!decided.data) throw new Error(`decide: ${JSON.stringify(decided.error)}`);
const listed = await client.GET("/v1/sessions", {});
if (!listed.data) throw new Error(`list: ${JSON.stringify(listed.error)}`);
console.log(JSON.stringify({
  session, status, decided: decided.data.status, listed: listed.data.sessions.map((s) => s.id),
}));
"#;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check(report: &str, what: &str) -> Value {
    let report: Value = serde_json::from_str(report.trim())
        .unwrap_or_else(|e| panic!("{what} printed no JSON ({e}): {report}"));
    assert_eq!(report["status"], "awaiting_approval", "{what}: {report}");
    assert_eq!(report["decided"], "executed", "{what}: {report}");
    let session = report["session"].as_str().unwrap();
    assert!(
        report["listed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == session),
        "{what}: the new session is not listed: {report}"
    );
    report
}

async fn spec(base: &str, into: &Path) {
    let doc = reqwest::get(format!("{base}/openapi.json"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    std::fs::write(into, doc).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_generated_from_the_document_runs_a_session() {
    let app = spawn_app(AppOptions::offline());
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("openapi.json");
    spec(&app.base, &doc).await;
    let python = tokio::task::spawn_blocking(support::clients::python)
        .await
        .unwrap();
    let bin = python.parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(bin.join("openapi-python-client"))
        .args(["generate", "--meta", "none", "--path"])
        .arg(&doc)
        .arg("--output-path")
        .arg(dir.path().join("cadre_client"))
        .env("PATH", &path)
        .output()
        .expect("openapi-python-client runs");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "generation failed:\n{said}");
    assert!(
        !said.contains("Warning") && !said.contains("WARNING") && !said.contains("Unable"),
        "the generator dropped part of the document:\n{said}"
    );
    let dir_text = dir.path().display().to_string();
    let report =
        support::clients::python_ok(PYTHON, &[&app.base], &[("PYTHONPATH", dir_text.as_str())])
            .await;
    check(&report, "the generated Python client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_client_generated_from_the_document_compiles_strict_and_runs_a_session() {
    let app = spawn_app(AppOptions::offline());
    let node = tokio::task::spawn_blocking(support::clients::node_modules)
        .await
        .unwrap();
    // Inside the install's directory, so the imports find its packages.
    let dir = tempfile::tempdir_in(&node).unwrap();
    let doc = dir.path().join("openapi.json");
    spec(&app.base, &doc).await;
    let run = |args: &[&str], what: &str| {
        let out = Command::new("node")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("node runs");
        assert!(
            out.status.success(),
            "{what} failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let modules = node.join("node_modules");
    let cli = |package: &str, bin: &str| modules.join(package).join(bin).display().to_string();
    run(
        &[
            &cli("openapi-typescript", "bin/cli.js"),
            "openapi.json",
            "-o",
            "schema.d.ts",
        ],
        "openapi-typescript",
    );
    std::fs::write(dir.path().join("main.ts"), TYPESCRIPT).unwrap();
    run(
        &[
            &cli("typescript", "bin/tsc"),
            "--strict",
            "--noEmitOnError",
            "--target",
            "es2022",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--types",
            "node",
            "main.ts",
        ],
        "tsc --strict",
    );
    let report = run(&["main.js", &app.base], "the generated TypeScript client");
    check(&report, "the generated TypeScript client");
}
