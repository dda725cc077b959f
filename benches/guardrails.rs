//! Guardrails: the CPU one stage's checks add to a turn (criterion).
//!
//! user message ─▶ input guardrails ─▶ store, model
//! tool output  ─▶ tool_output guardrails ─▶ record, model
//!
//! - `guardrails/text_2kb_typical`: a 2 KB user message through a typical
//!   input set: a card-number regex redaction, an e-mail regex redaction,
//!   `deny_topics` of 20 topics and `max_length` (the message holds one
//!   card number and one address, and no denied topic: every check runs).
//! - `guardrails/json_2kb_tool_output`: a 2 KB JSON tool output (twelve
//!   accounts) through `drop_fields` (`accounts.ssn`) and the e-mail
//!   redaction over every string leaf.
//! - `guardrails/text_2kb_none`: the same message with no guardrails (what
//!   every agent without any pays).
//!
//! The subject is cloned outside the measured part. Run:
//! `cargo bench --bench guardrails`.

use cadre::guardrails::{GuardrailConfig, Guardrails, Stage, Subject};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

const CARD: &str = r"\b(?:\d[ -]?){12,15}\d\b";
const EMAIL: &str = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}";

fn config(value: Value) -> GuardrailConfig {
    serde_json::from_value(value).expect("a valid guardrail")
}

fn text_set() -> Guardrails {
    let topics = [
        "payday loan",
        "crypto",
        "bitcoin",
        "gambling",
        "casino",
        "insider trading",
        "pump and dump",
        "tax evasion",
        "money laundering",
        "weapons",
        "explosives",
        "election",
        "politics",
        "religion",
        "medical advice",
        "diagnosis",
        "lawsuit",
        "competitor pricing",
        "layoffs",
        "salary",
    ];
    Guardrails::compile(&[
        config(json!({"name": "cards", "stage": "input", "kind": "regex",
            "pattern": CARD, "action": "redact", "replacement": "[card]"})),
        config(json!({"name": "emails", "stage": "input", "kind": "regex",
            "pattern": EMAIL, "action": "redact", "replacement": "[email]"})),
        config(
            json!({"name": "topics", "stage": "input", "kind": "deny_topics",
            "topics": topics}),
        ),
        config(json!({"name": "length", "stage": "input", "kind": "max_length", "max": 8000})),
    ])
    .unwrap()
}

/// About 2 KB of a support message, with one card number and one address.
fn message() -> String {
    let filler = "I have been a customer for a few years and my statement this month shows \
                  two charges I do not recognise, both from the same merchant on the same day. ";
    let mut text = String::from("Hello, ");
    while text.len() < 1900 {
        text.push_str(filler);
    }
    text.push_str("My card is 4111 1111 1111 1111 and you can reach me at jane.doe@example.com.");
    text
}

fn tool_output() -> Value {
    let accounts: Vec<Value> = (0..12)
        .map(|i| {
            json!({
                "id": format!("acc-{i:04}"),
                "holder": "Jane Doe",
                "ssn": "078-05-1120",
                "email": format!("holder{i}@example.com"),
                "balance": 1234.56 + i as f64,
                "currency": "EUR",
                "notes": "statement sent by post; no overdraft",
            })
        })
        .collect();
    json!({"accounts": accounts, "as_of": "2026-11-20T10:00:00Z"})
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("guardrails");
    let text = message();
    assert!((1900..2200).contains(&text.len()), "{}", text.len());

    let set = text_set();
    let checked = set.run_builtin(Stage::Input, None, Subject::Text(text.clone()));
    assert!(checked.passed() && checked.decisions.len() == 2);
    g.bench_function("text_2kb_typical", |b| {
        b.iter_batched(
            || Subject::Text(text.clone()),
            |subject| set.run_builtin(Stage::Input, None, subject),
            BatchSize::SmallInput,
        )
    });

    let output = tool_output();
    let size = serde_json::to_string(&output).unwrap().len();
    assert!((1800..2600).contains(&size), "{size}");
    let json_set = Guardrails::compile(&[
        config(
            json!({"name": "ssn", "stage": "tool_output", "kind": "drop_fields",
            "fields": ["accounts.ssn"]}),
        ),
        config(
            json!({"name": "emails", "stage": "tool_output", "kind": "regex",
            "pattern": EMAIL, "action": "redact", "replacement": "[email]"}),
        ),
    ])
    .unwrap();
    let checked = json_set.run_builtin(
        Stage::ToolOutput,
        Some("accounts"),
        Subject::Json(output.clone()),
    );
    assert!(checked.passed() && checked.decisions.len() == 2);
    g.bench_function("json_2kb_tool_output", |b| {
        b.iter_batched(
            || Subject::Json(output.clone()),
            |subject| json_set.run_builtin(Stage::ToolOutput, Some("accounts"), subject),
            BatchSize::SmallInput,
        )
    });

    let none = Guardrails::default();
    g.bench_function("text_2kb_none", |b| {
        b.iter_batched(
            || Subject::Text(text.clone()),
            |subject| none.run_builtin(Stage::Input, None, subject),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
