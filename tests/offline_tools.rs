//! A team's own agents and tools on the offline model, through HTTP: the
//! parameters of a tool file filled from the question by their schema.
//!
//! Each test was checked to fail with its fix taken out.

mod support;

use serde_json::json;
use support::{AppOptions, spawn_app};

/// A command tool that answers the order it was asked about (its
/// parameters arrive as JSON on stdin).
const LOOKUP_ORDER: &str = "\
name: lookup_order
description: Look up an order by its id
parameters:
  - {name: order_id, type: string, required: true, description: The order's id}
entry: {type: external, command: [\"python3\", \"-c\", \"import json, sys; p = json.load(sys.stdin); print(json.dumps({'order': p['order_id'], 'status': 'shipped'}))\"]}
side_effects: none
";

fn agent_file(name: &str) -> String {
    format!(
        "name = \"{name}\"\nsystem_prompt = \"You answer questions about orders.\"\ntools = [\"lookup_order\"]\nmax_iterations = 3\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_sends_the_order_id_from_the_question_to_a_teams_tool() {
    let agents = support::agents_dir(&[("orders.toml", &agent_file("orders"))]);
    std::fs::create_dir(agents.path().join("tools")).unwrap();
    std::fs::write(agents.path().join("tools/lookup_order.yaml"), LOOKUP_ORDER).unwrap();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let session = app.session("orders").await;
    let (status, reply) = app.say(&session, "Where is my order A1001?").await;
    assert_eq!(status, 200, "{reply}");
    let (status, calls) = app.get("/v1/calls?tool=lookup_order").await;
    assert_eq!(status, 200, "{calls}");
    let calls = calls["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["params"],
        json!({"order_id": "A1001"}),
        "{calls:?}"
    );
    assert_eq!(calls[0]["is_success"], true, "{calls:?}");
    assert!(
        reply["answer"]
            .as_str()
            .unwrap_or_default()
            .contains("A1001"),
        "{reply}"
    );
}
