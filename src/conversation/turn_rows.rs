//! Turn records as rows: what the store keeps of a [`TurnRecord`], and the
//! record read back whole (issue #34, lean storage).
//!
//! actor (each step) ──[`row`]──▶ WriteOp::PutTurn (the lean row)
//! store.turn / turns_of / open_turn_of ──row──▶ [`read`] / [`read_all`]
//!     ──store.calls_by_id (one read for the page)──▶ the record as the turn saw it
//!
//! A turn's calls are already stored twice elsewhere: each call's record
//! (written by the executor, behind the turn's commit on the same writer,
//! so an acknowledged turn has its records) holds the arguments and the
//! output, and the turn's messages hold what the model said and saw. The
//! record used to repeat both, twice (in `tool_calls` and again in a
//! completed turn's `outcome.tool_calls`): a 2 KB argument and a 2 KB
//! output made a 9 KB row, which redb keeps in a 16 KB run of pages
//! (docs/performance.md, "Storage per turn"). So a row:
//! - **names its calls' records**: a call with a `record_id` is stored
//!   without its `output` (the record's `output` is the same value: the
//!   executor records the outcome it answers) and, when the executor said
//!   its record's `params` are the arguments as the model gave them
//!   (`arguments_recorded`), without its `arguments`;
//! - **keeps one list of calls**: a completed turn's `outcome.tool_calls`
//!   is the record's `tool_calls` and is not stored again.
//!
//! Everything else stays in the row: the status, error and source id of
//! each call (small, and what a listing of turns shows at a glance), the
//! phase, the answer. Rows written before this, and calls with no record
//! (refused before the executor, or cut by an interrupt), are whole and
//! read as they are.
//!
//! Decided here: a named record that is gone (its row lost to a failed
//! write-behind, which the writer logs) reads as `arguments: null` and no
//! `output`; the turn still reads. Reads cost one batch read of the page's
//! call records (`calls_by_id`), on redb and PostgreSQL alike: the rows are
//! the conversation's JSON, and neither store reads into them.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::machine::TurnRecord;
use crate::store::{Store, StoreError, ToolCallRecord};

/// The row to store for `record`.
pub fn row(record: &TurnRecord) -> Value {
    let mut row = serde_json::to_value(record).expect("turn records serialize");
    let Some(obj) = row.as_object_mut() else {
        return row;
    };
    if let Some(outcome) = obj.get_mut("outcome").and_then(Value::as_object_mut)
        && record
            .outcome
            .as_ref()
            .is_some_and(|o| o.tool_calls == record.tool_calls)
    {
        outcome.remove("tool_calls");
    }
    if let Some(calls) = obj.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (stored, call) in calls.iter_mut().zip(&record.tool_calls) {
            let Some(stored) = stored.as_object_mut() else {
                continue;
            };
            if call.record_id.is_some() {
                stored.remove("output");
                if call.arguments_recorded {
                    stored.remove("arguments");
                }
            }
        }
    }
    row
}

/// The record stored as `row`, whole again.
pub async fn read(store: &Store, row: Value) -> Result<TurnRecord, StoreError> {
    let mut rows = read_all(store, vec![row]).await?;
    let row = rows.pop().expect("one row in, one out");
    Ok(serde_json::from_value(row)?)
}

/// The rows of a page, whole again, as JSON (what a listing of turns
/// shows): one read of the call records they name.
pub async fn read_all(store: &Store, mut rows: Vec<Value>) -> Result<Vec<Value>, StoreError> {
    let mut wanted = Vec::new();
    for row in &rows {
        for call in calls(row) {
            if let Some(id) = named(call) {
                wanted.push(id.to_string());
            }
        }
    }
    let records: HashMap<String, ToolCallRecord> = if wanted.is_empty() {
        HashMap::new()
    } else {
        store
            .calls_by_id(wanted)
            .await?
            .into_iter()
            .map(|r| (r.record_id.clone(), r))
            .collect()
    };
    for row in &mut rows {
        fill(row, &records);
    }
    Ok(rows)
}

fn calls(row: &Value) -> &[Value] {
    row.get("tool_calls")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The record a stored call names, when the row left something to it.
fn named(call: &Value) -> Option<&str> {
    let id = call.get("record_id")?.as_str()?;
    (call.get("output").is_none() || call.get("arguments").is_none()).then_some(id)
}

fn fill(row: &mut Value, records: &HashMap<String, ToolCallRecord>) {
    let Some(obj) = row.as_object_mut() else {
        return;
    };
    if let Some(calls) = obj.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls.iter_mut().filter_map(Value::as_object_mut) {
            let Some(id) = call.get("record_id").and_then(Value::as_str) else {
                continue;
            };
            let record = records.get(id);
            fill_call(call, record);
        }
    }
    let calls = obj.get("tool_calls").cloned();
    if let (Some(outcome), Some(calls)) =
        (obj.get_mut("outcome").and_then(Value::as_object_mut), calls)
        && !outcome.contains_key("tool_calls")
    {
        outcome.insert("tool_calls".into(), calls);
    }
}

fn fill_call(call: &mut Map<String, Value>, record: Option<&ToolCallRecord>) {
    if !call.contains_key("arguments") {
        call.insert(
            "arguments".into(),
            record.map_or(Value::Null, |r| r.params.clone()),
        );
    }
    if !call.contains_key("output")
        && let Some(output) = record.and_then(|r| r.output.clone())
    {
        call.insert("output".into(), output);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::machine::CallReport;
    use serde_json::json;

    fn report(record_id: Option<&str>, recorded: bool) -> CallReport {
        CallReport {
            id: "call_1".into(),
            name: "echo".into(),
            arguments: json!({"text": "a long argument"}),
            is_success: true,
            output: Some(json!({"text": "a long output"})),
            error: None,
            error_type: None,
            source_id: None,
            record_id: record_id.map(str::to_string),
            arguments_recorded: recorded,
        }
    }

    fn record_of(id: &str) -> ToolCallRecord {
        serde_json::from_value(json!({
            "record_id": id, "tool_name": "echo", "tool_call_id": "call_1",
            "params": {"text": "a long argument"}, "output": {"text": "a long output"},
            "is_success": true, "error": null, "execution_time_ms": 1, "attempts": 1,
            "caller_id": "s", "caller_type": "conversation_agent",
            "conversation_id": "s", "workflow_id": null, "user_id": null,
            "created_at": "2026-12-06T00:00:00Z"
        }))
        .expect("a record")
    }

    #[test]
    fn a_named_call_leaves_its_payload_to_the_record_and_reads_back_whole() {
        let call = report(Some("r1"), true);
        let stored = json!({"tool_calls": [serde_json::to_value(&call).unwrap()]});
        let mut lean = stored.clone();
        let obj = lean["tool_calls"][0].as_object_mut().unwrap();
        obj.remove("output");
        obj.remove("arguments");
        let records = HashMap::from([("r1".to_string(), record_of("r1"))]);
        fill(&mut lean, &records);
        assert_eq!(lean, stored);
        // The record gone: the turn still reads, without the payload.
        let mut lean = json!({"tool_calls": [{"id": "call_1", "name": "echo",
            "is_success": true, "record_id": "r9"}]});
        fill(&mut lean, &HashMap::new());
        assert_eq!(lean["tool_calls"][0]["arguments"], Value::Null);
        assert!(lean["tool_calls"][0].get("output").is_none());
    }

    #[test]
    fn a_completed_turn_is_stored_once_without_its_calls_payloads() {
        let call = serde_json::to_value(report(Some("r1"), true)).unwrap();
        let summary =
            serde_json::to_value(crate::conversation::summary::ToolUsageSummary::from_calls(
                [("echo", crate::store::CallStatus::of(true, None))],
            ))
            .unwrap();
        let mut record: TurnRecord = serde_json::from_value(json!({
            "turn_id": "t1", "phase": "completed", "first_seq": 1, "rounds": 1,
            "model_calls": 2, "fallback": false, "tool_calls": [call],
            "started_at": "2026-12-06T00:00:00Z", "updated_at": "2026-12-06T00:00:00Z",
            "outcome": {"turn_id": "t1", "status": "completed", "answer": "done",
                "tool_calls": [call], "tool_usage_summary": summary,
                "citations": [], "ungrounded_citations": [], "iterations": 2,
                "fallback_used": false, "finish_reason": "stop"}
        }))
        .expect("a record");
        record.tool_calls[0].arguments_recorded = true;
        record.outcome.as_mut().unwrap().tool_calls[0].arguments_recorded = true;
        let lean = row(&record);
        let text = lean.to_string();
        assert!(!text.contains("a long"), "{text}");
        assert!(lean["outcome"].get("tool_calls").is_none());
        let mut back = lean.clone();
        fill(
            &mut back,
            &HashMap::from([("r1".to_string(), record_of("r1"))]),
        );
        assert_eq!(back, serde_json::to_value(&record).unwrap());
        // Arguments the record does not hold as given stay in the row.
        record.tool_calls[0].arguments_recorded = false;
        let lean = row(&record);
        assert!(lean["tool_calls"][0].get("arguments").is_some());
        assert!(lean["tool_calls"][0].get("output").is_none());
    }

    #[test]
    fn arguments_the_record_does_not_hold_as_given_stay_in_the_row() {
        let call = report(Some("r1"), false);
        let mut obj = serde_json::to_value(&call).unwrap();
        let o = obj.as_object_mut().unwrap();
        o.remove("output");
        // What `row` keeps of it: the arguments.
        assert!(named(&obj).is_some());
        assert!(obj.get("arguments").is_some());
        let unnamed = serde_json::to_value(report(None, true)).unwrap();
        assert!(named(&unnamed).is_none());
    }
}
