//! One suite of store behaviour, run against both backends: redb (a temp
//! dir) and PostgreSQL (a real server, [`support::postgres`], a database
//! per test).
//!
//! suite!(open) ──▶ mod redb { every check on dyn StoreBackend = RedbStore::open(tempdir) }
//!              └─▶ mod postgres { every check on a fresh PostgreSQL database }
//!
//! Each check is written once; the backends must agree on what it reads
//! back (order, paging cursors, counters, what an erase leaves). What only
//! the cluster backend does (fencing, ownership, heartbeats) is checked
//! after the suite.

mod support;

use cadre::identity::Plan;
use cadre::model::ChatMessage;
use cadre::store::idempotency::IdempotencyRecord;
use cadre::store::tables::{OWN_TABLES, SCHEMA_VERSION};
use cadre::store::turns::TurnWrite;
use cadre::store::usage::day_of;
use cadre::store::{
    CallFilter, Session, SessionFilter, StoreBackend, StoredMessage, StoredSummary, TokenUsage,
    ToolCallRecord, UsageDelta, WriteOp,
};
use jiff::Timestamp;
use serde_json::{Value, json};
use std::sync::Arc;

fn session(id: &str, tenant: &str) -> Session {
    Session {
        id: id.into(),
        tenant: tenant.into(),
        agent: "assistant".into(),
        user_id: Some("alice".into()),
        plan: Plan::Free,
        metadata: json!({"k": id}),
        created_at: Timestamp::now(),
        forked_from: None,
    }
}

fn msg(seq: u64, text: &str) -> StoredMessage {
    StoredMessage {
        seq,
        message: if seq % 2 == 1 {
            ChatMessage::user(text)
        } else {
            ChatMessage::assistant(text)
        },
        created_at: Timestamp::now(),
        rolled_back: false,
    }
}

fn append(session_id: &str, from: u64, texts: &[&str]) -> WriteOp {
    WriteOp::AppendMessages {
        session_id: session_id.into(),
        messages: texts
            .iter()
            .enumerate()
            .map(|(i, t)| msg(from + i as u64, t))
            .collect(),
    }
}

/// Record ids sort as they are made (like UUID v7): `r0001` < `r0002`.
fn call(n: u32, tenant: &str, tool: &str, conv: Option<&str>, wf: Option<&str>) -> ToolCallRecord {
    ToolCallRecord {
        guardrails: Vec::new(),
        cached: false,
        record_id: format!("r{n:04}"),
        tool_name: tool.into(),
        tool_call_id: Some(format!("call_{n}")),
        params: json!({"n": n}),
        output: Some(json!({"ok": n})),
        is_success: !n.is_multiple_of(3),
        error: None,
        error_type: None,
        execution_time_ms: u64::from(n),
        attempts: 1,
        caller_id: conv.unwrap_or("wf").into(),
        caller_type: "conversation_agent".into(),
        conversation_id: conv.map(Into::into),
        workflow_id: wf.map(Into::into),
        user_id: None,
        tenant: Some(tenant.into()),
        created_at: Timestamp::now(),
        started_at: None,
        source_id: None,
        turn_id: None,
    }
}

fn record(rec: ToolCallRecord) -> WriteOp {
    WriteOp::RecordToolCall(Box::new(rec))
}

fn texts(ms: &[StoredMessage]) -> Vec<String> {
    ms.iter()
        .map(|m| m.message.content.clone().unwrap_or_default())
        .collect()
}

fn ids(rs: &[ToolCallRecord]) -> Vec<&str> {
    rs.iter().map(|r| r.record_id.as_str()).collect()
}

fn usage(session: Option<&str>, tenant: &str, agent: &str, p: u64, c: u64) -> WriteOp {
    WriteOp::RecordUsage(UsageDelta {
        session_id: session.map(Into::into),
        tenant: tenant.into(),
        agent: agent.into(),
        day: day_of(Timestamp::now()),
        usage: TokenUsage::call(p, c),
    })
}

fn turn(session: &str, turn: &str, open: bool, key: Option<&str>) -> WriteOp {
    WriteOp::PutTurn(Box::new(TurnWrite {
        session_id: session.into(),
        turn_id: turn.into(),
        open,
        idempotency_key: key.map(Into::into),
        record: json!({"turn": turn, "open": open}),
    }))
}

/// Writes the checks once for a backend: `$open` is a block giving
/// `(Arc<dyn StoreBackend>, guard)`; the guard keeps the backend alive for
/// the test. The checks see only the trait (`cadre::store::backend`), so a
/// new backend is checked by one more `mod` with its own `$open`.
macro_rules! suite {
    ($open:expr) => {
        use super::*;

        #[tokio::test]
        async fn sessions_are_filtered_by_agent_and_user_and_listed_newest_first() {
            let (store, _guard) = $open;
            let held = [
                ("s01", "acme", "assistant", Some("alice")),
                ("s02", "acme", "brokerage", Some("alice")),
                ("s03", "acme", "assistant", Some("bob")),
                ("s04", "other", "assistant", Some("alice")),
                ("s05", "acme", "assistant", None),
                ("s06", "acme", "assistant", Some("alice")),
            ];
            let ops = held
                .iter()
                .map(|(id, tenant, agent, user)| {
                    WriteOp::PutSession(Session {
                        agent: (*agent).into(),
                        user_id: user.map(str::to_string),
                        ..session(id, tenant)
                    })
                })
                .collect();
            store.write(ops, true).await.unwrap();
            let page = |filter: SessionFilter, cursor: Option<&str>, limit| {
                let store = store.clone();
                let cursor = cursor.map(str::to_string);
                async move {
                    let p = store.sessions_matching("acme", filter, cursor, limit).await.unwrap();
                    let ids: Vec<String> = p.items.into_iter().map(|s| s.id).collect();
                    (ids, p.next)
                }
            };
            let newest = SessionFilter { newest_first: true, ..SessionFilter::default() };
            assert_eq!(page(newest.clone(), None, 2).await, (vec!["s06".into(), "s05".into()], Some("s05".into())));
            assert_eq!(page(newest.clone(), Some("s05"), 2).await, (vec!["s03".into(), "s02".into()], Some("s02".into())));
            assert_eq!(page(newest, Some("s02"), 2).await, (vec!["s01".into()], None));

            let alices_assistant = SessionFilter {
                agent: Some("assistant".into()),
                user_id: Some("alice".into()),
                newest_first: true,
            };
            assert_eq!(page(alices_assistant.clone(), None, 1).await, (vec!["s06".into()], Some("s06".into())));
            assert_eq!(page(alices_assistant.clone(), Some("s06"), 1).await, (vec!["s01".into()], None));
            let oldest = SessionFilter { newest_first: false, ..alices_assistant };
            assert_eq!(page(oldest, None, 10).await, (vec!["s01".into(), "s06".into()], None));
            let bob = SessionFilter { user_id: Some("bob".into()), ..SessionFilter::default() };
            assert_eq!(page(bob, None, 10).await, (vec!["s03".into()], None));
            let brokerage = SessionFilter { agent: Some("brokerage".into()), ..SessionFilter::default() };
            assert_eq!(page(brokerage, None, 10).await, (vec!["s02".into()], None));
        }

        #[tokio::test]
        async fn sessions_are_read_back_and_listed_per_tenant_in_id_order() {
            let (store, _guard) = $open;
            let mut ops: Vec<WriteOp> = ["s03", "s01", "s02", "s05", "s04"]
                .iter()
                .map(|id| {
                    let tenant = if *id == "s04" { "other" } else { "acme" };
                    WriteOp::PutSession(session(id, tenant))
                })
                .collect();
            ops.push(append("s02", 1, &["hi"]));
            store.write(ops, true).await.unwrap();
            let s01 = store.get_session("s01").await.unwrap().unwrap();
            assert_eq!(s01, Session { created_at: s01.created_at, ..session("s01", "acme") });
            let got = store.get_session("s03").await.unwrap().unwrap();
            assert_eq!((got.tenant.as_str(), got.metadata.clone()), ("acme", json!({"k": "s03"})));
            assert_eq!(store.get_session("nope").await.unwrap(), None);
            let all: Vec<String> = store.list_sessions().await.unwrap().into_iter().map(|s| s.id).collect();
            assert_eq!(all, ["s01", "s02", "s03", "s04", "s05"]);

            let p1 = store.sessions_of("acme", None, 2).await.unwrap();
            let p1_ids: Vec<_> = p1.items.iter().map(|s| s.id.as_str()).collect();
            assert_eq!((p1_ids, p1.next.as_deref()), (vec!["s01", "s02"], Some("s02")));
            let p2 = store.sessions_of("acme", p1.next, 2).await.unwrap();
            let p2_ids: Vec<_> = p2.items.iter().map(|s| s.id.as_str()).collect();
            assert_eq!((p2_ids, p2.next), (vec!["s03", "s05"], None));
            assert!(store.sessions_of("nobody", None, 10).await.unwrap().items.is_empty());

            // A session's last activity is its last message, else its creation.
            let page = store.sessions_with_activity(Some("s01".into()), 2).await.unwrap();
            let seen: Vec<_> = page.iter().map(|(s, _)| s.id.as_str()).collect();
            assert_eq!(seen, ["s02", "s03"]);
            let s02 = store.messages("s02").await.unwrap();
            assert_eq!(page[0].1, s02[0].created_at);
            assert_eq!(page[1].1, page[1].0.created_at);

            // Rewriting a session keeps one row.
            let mut s = store.get_session("s05").await.unwrap().unwrap();
            s.metadata = json!({"v": 2});
            store.write(vec![WriteOp::PutSession(s)], false).await.unwrap();
            assert_eq!(store.get_session("s05").await.unwrap().unwrap().metadata, json!({"v": 2}));
            assert_eq!(store.list_sessions().await.unwrap().len(), 5);
        }

        #[tokio::test]
        async fn messages_come_back_by_seq_in_every_window() {
            let (store, _guard) = $open;
            store
                .write(
                    vec![
                        WriteOp::PutSession(session("s", "acme")),
                        append("s", 1, &["one", "two", "three", "four", "five"]),
                        append("t", 1, &["other"]),
                    ],
                    false,
                )
                .await
                .unwrap();
            assert_eq!(texts(&store.messages("s").await.unwrap()), ["one", "two", "three", "four", "five"]);
            assert_eq!(texts(&store.messages_after("s", 3).await.unwrap()), ["four", "five"]);
            assert_eq!(texts(&store.messages_page("s", 1, 2).await.unwrap()), ["two", "three"]);
            let (recent, last) = store.recent_messages("s", 2).await.unwrap();
            assert_eq!((texts(&recent), last), (vec!["four".to_string(), "five".into()], 5));
            let (window, last) = store.unsummarised_messages("s", 2, 2).await.unwrap();
            assert_eq!((texts(&window), last), (vec!["four".to_string(), "five".into()], 5));
            let (window, last) = store.unsummarised_messages("s", 4, 10).await.unwrap();
            assert_eq!((texts(&window), last), (vec!["five".to_string()], 5));
            assert_eq!(store.message_count("s").await.unwrap(), 5);
            assert_eq!(store.message_count("missing").await.unwrap(), 0);
            let (none, last) = store.recent_messages("missing", 3).await.unwrap();
            assert!(none.is_empty() && last == 0);

            let stats = store.message_stats("s").await.unwrap();
            let all = store.messages("s").await.unwrap();
            assert_eq!((stats.count, stats.user_messages), (5, 3));
            assert_eq!(stats.last_at, Some(all[4].created_at));
            assert_eq!(store.message_stats("missing").await.unwrap().count, 0);

            store
                .write(vec![WriteOp::MarkRolledBack { session_id: "s".into(), seqs: vec![4, 5, 9] }], false)
                .await
                .unwrap();
            let flags: Vec<bool> = store.messages("s").await.unwrap().iter().map(|m| m.rolled_back).collect();
            assert_eq!(flags, [false, false, false, true, true]);

            let summary = StoredSummary { text: "so far".into(), covers_until_seq: 3, updated_at: Timestamp::now() };
            store
                .write(vec![WriteOp::PutSummary { session_id: "s".into(), summary: summary.clone() }], false)
                .await
                .unwrap();
            assert_eq!(store.get_summary("s").await.unwrap(), Some(summary));
            assert_eq!(store.get_summary("t").await.unwrap(), None);
        }

        /// A row that cannot be read back (nested deeper than serde_json
        /// reads, as an older cadre could store) never fails a listing: the
        /// listing answers without it.
        #[tokio::test]
        async fn a_call_record_that_does_not_decode_is_left_out_of_listings() {
            let (store, _guard) = $open;
            let mut poisoned = call(2, "acme", "calc", Some("c1"), None);
            let deep: Value = serde_json::from_str(&format!("{}1{}", "[".repeat(126), "]".repeat(126))).unwrap();
            poisoned.params = json!({"x": deep});
            store
                .write(vec![record(call(1, "acme", "calc", Some("c1"), None)), record(poisoned), record(call(3, "acme", "calc", Some("c1"), None))], false)
                .await
                .unwrap();
            assert_eq!(ids(&store.calls_for_conversation("c1").await.unwrap()), ["r0001", "r0003"]);
            let page = store.calls_of("acme", CallFilter::default(), None, 10).await.unwrap();
            assert_eq!(ids(&page.items), ["r0003", "r0001"]);
            let all = store.calls(CallFilter::default()).await.unwrap();
            assert_eq!(ids(&all), ["r0003", "r0001"]);
        }

        #[tokio::test]
        async fn call_records_are_listed_by_every_filter_newest_first_and_paged() {
            let (store, _guard) = $open;
            let ops = vec![
                record(call(1, "acme", "calc", Some("c1"), None)),
                record(call(2, "acme", "search", Some("c1"), None)),
                record(call(3, "acme", "calc", Some("c2"), None)),
                record(call(4, "acme", "calc", None, Some("w1"))),
                record(call(5, "globex", "calc", Some("c9"), None)),
                record(call(6, "acme", "calc", Some("c1"), Some("w1"))),
            ];
            store.write(ops, false).await.unwrap();
            let f = |conv: Option<&str>, wf: Option<&str>, tool: Option<&str>, tenant: Option<&str>, limit| CallFilter {
                conversation_id: conv.map(Into::into),
                workflow_id: wf.map(Into::into),
                tool: tool.map(Into::into),
                tenant: tenant.map(Into::into),
                limit,
            };
            let calls = |filter| {
                let store = store.clone();
                async move { store.calls(filter).await.unwrap() }
            };
            assert_eq!(ids(&calls(f(None, None, None, None, 0)).await), ["r0006", "r0005", "r0004", "r0003", "r0002", "r0001"]);
            assert_eq!(ids(&calls(f(Some("c1"), None, None, None, 0)).await), ["r0006", "r0002", "r0001"]);
            assert_eq!(ids(&calls(f(None, Some("w1"), None, None, 0)).await), ["r0006", "r0004"]);
            assert_eq!(ids(&calls(f(None, None, Some("calc"), None, 2)).await), ["r0006", "r0005"]);
            assert_eq!(ids(&calls(f(Some("c1"), None, Some("calc"), None, 0)).await), ["r0006", "r0001"]);
            assert_eq!(ids(&calls(f(None, None, None, Some("globex"), 0)).await), ["r0005"]);
            assert_eq!(ids(&store.calls_for_conversation("c1").await.unwrap()), ["r0001", "r0002", "r0006"]);
            assert_eq!(store.record_count().await.unwrap(), 6);

            let p1 = store.calls_of("acme", CallFilter::default(), None, 2).await.unwrap();
            assert_eq!((ids(&p1.items), p1.next.as_deref()), (vec!["r0006", "r0004"], Some("r0004")));
            let p2 = store.calls_of("acme", CallFilter::default(), p1.next, 2).await.unwrap();
            assert_eq!((ids(&p2.items), p2.next.as_deref()), (vec!["r0003", "r0002"], Some("r0002")));
            let p3 = store.calls_of("acme", CallFilter::default(), p2.next, 2).await.unwrap();
            assert_eq!((ids(&p3.items), p3.next), (vec!["r0001"], None));
            let by_tool = store.calls_of("acme", f(Some("c1"), None, Some("calc"), None, 0), None, 10).await.unwrap();
            assert_eq!(ids(&by_tool.items), ["r0006", "r0001"]);
            let wf = store.calls_of("acme", f(None, Some("w1"), None, None, 0), Some("r0006".into()), 10).await.unwrap();
            assert_eq!(ids(&wf.items), ["r0004"]);
            assert!(store.calls_of("globex", f(Some("c1"), None, None, None, 0), None, 10).await.unwrap().items.is_empty());

            // Tool counters: every recorded call but those of unknown tools.
            let mut unknown = call(7, "acme", "no_such_tool", Some("c1"), None);
            unknown.error_type = Some("TOOL_NOT_FOUND".into());
            store.write(vec![record(unknown)], false).await.unwrap();
            let calc = store.tool_stats("calc").await.unwrap();
            assert_eq!(
                (calc.total_calls, calc.successful_calls, calc.failed_calls, calc.total_execution_time_ms),
                (5, 3, 2, 1 + 3 + 4 + 5 + 6)
            );
            assert_eq!(store.tool_stats("no_such_tool").await.unwrap().total_calls, 0);
            let all: Vec<(String, u64)> = store.all_tool_stats().await.unwrap().into_iter().map(|(t, s)| (t, s.total_calls)).collect();
            assert_eq!(all, [("calc".to_string(), 5), ("search".into(), 1)]);
        }

        #[tokio::test]
        async fn documents_are_listed_by_prefix_and_tenant_moved_once_and_indexed_once() {
            let (store, _guard) = $open;
            store.put_doc("state", "u1/a", json!(1), false).await.unwrap();
            store.put_doc("state", "u1/b", json!(2), false).await.unwrap();
            store.put_doc("state", "u2/a", json!(3), false).await.unwrap();
            store.put_doc("state", "u1", json!(0), false).await.unwrap();
            let keys = |v: Vec<(String, Value)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
            assert_eq!(keys(store.list_docs("state", "u1/").await.unwrap()), ["u1/a", "u1/b"]);
            assert_eq!(keys(store.list_docs("state", "").await.unwrap()), ["u1", "u1/a", "u1/b", "u2/a"]);
            assert_eq!(store.get_doc("state", "u2/a").await.unwrap(), Some(json!(3)));
            store.delete_doc("state", "u2/a", false).await.unwrap();
            assert_eq!(store.get_doc("state", "u2/a").await.unwrap(), None);

            for k in ["k1", "k2", "k3"] {
                store.put_doc_of("pending", "acme", k, json!({"k": k}), false).await.unwrap();
            }
            store.put_doc_of("pending", "globex", "k4", json!({"k": "k4"}), false).await.unwrap();
            let p1 = store.docs_of("pending", "acme", None, 2, false).await.unwrap();
            assert_eq!((keys(p1.items), p1.next.as_deref()), (vec!["k1".to_string(), "k2".into()], Some("k2")));
            let p2 = store.docs_of("pending", "acme", p1.next, 2, false).await.unwrap();
            assert_eq!((keys(p2.items), p2.next), (vec!["k3".to_string()], None));
            let newest = store.docs_of("pending", "acme", None, 2, true).await.unwrap();
            assert_eq!((keys(newest.items), newest.next.as_deref()), (vec!["k3".to_string(), "k2".into()], Some("k2")));
            let older = store.docs_of("pending", "acme", Some("k2".into()), 2, true).await.unwrap();
            assert_eq!(keys(older.items), ["k1"]);
            // A rewrite without a tenant keeps the listing.
            store.put_doc("pending", "k1", json!({"k": "k1", "v": 2}), false).await.unwrap();
            assert_eq!(store.docs_of("pending", "acme", None, 10, false).await.unwrap().items.len(), 3);
            store.delete_doc("pending", "k3", false).await.unwrap();
            assert_eq!(keys(store.docs_of("pending", "acme", None, 10, false).await.unwrap().items), ["k1", "k2"]);

            // Of two moves of one key, one finds it.
            let (a, b) = tokio::join!(
                store.move_doc("pending", "k2", "decided", json!("yes"), true),
                store.move_doc("pending", "k2", "decided", json!("no"), true),
            );
            let found: Vec<Value> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
            assert_eq!(found, [json!({"k": "k2"})]);
            assert_eq!(store.get_doc("pending", "k2").await.unwrap(), None);
            assert!(store.get_doc("decided", "k2").await.unwrap().is_some());
            assert_eq!(keys(store.docs_of("pending", "acme", None, 10, false).await.unwrap().items), ["k1"]);
            assert_eq!(store.move_doc("pending", "gone", "decided", json!(1), false).await.unwrap(), None);

            // Documents written before the index: indexed once per namespace.
            store.put_doc("runs", "run1", json!({"tenant": "acme"}), false).await.unwrap();
            store.put_doc("runs", "run2", json!({"tenant": "globex"}), false).await.unwrap();
            store.put_doc("runs", "run3", json!({}), false).await.unwrap();
            fn tenant_of(v: &Value) -> Option<String> {
                v["tenant"].as_str().map(Into::into)
            }
            assert_eq!(store.index_docs("runs", tenant_of).await.unwrap(), Some(2));
            assert_eq!(store.index_docs("runs", tenant_of).await.unwrap(), None);
            assert_eq!(keys(store.docs_of("runs", "acme", None, 10, false).await.unwrap().items), ["run1"]);
        }

        #[tokio::test]
        async fn the_store_s_own_documents_keep_every_rule_of_documents_in_their_tables() {
            let (store, _guard) = $open;
            let keys = |v: Vec<(String, Value)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
            // Every namespace with a table of its own, and one of DOCS,
            // with the same key: each reads back its own document.
            let mut namespaces: Vec<&str> = OWN_TABLES.iter().map(|t| t.namespace).collect();
            namespaces.push("trading.orders");
            for ns in &namespaces {
                store.put_doc_of(ns, "acme", "k1", json!({"ns": ns, "k": 1}), false).await.unwrap();
                store.put_doc_of(ns, "acme", "k2/a", json!({"ns": ns, "k": 2}), false).await.unwrap();
                store.put_doc_of(ns, "globex", "k3", json!({"ns": ns, "k": 3}), false).await.unwrap();
            }
            for ns in &namespaces {
                assert_eq!(store.get_doc(ns, "k1").await.unwrap(), Some(json!({"ns": ns, "k": 1})), "{ns}");
                assert_eq!(keys(store.list_docs(ns, "").await.unwrap()), ["k1", "k2/a", "k3"], "{ns}");
                assert_eq!(keys(store.list_docs(ns, "k2/").await.unwrap()), ["k2/a"], "{ns}");
                let page = store.docs_of(ns, "acme", None, 1, true).await.unwrap();
                assert_eq!((keys(page.items), page.next.as_deref()), (vec!["k2/a".to_string()], Some("k2/a")), "{ns}");
                let page = store.docs_of(ns, "acme", page.next, 1, true).await.unwrap();
                assert_eq!((keys(page.items), page.next), (vec!["k1".to_string()], None), "{ns}");
            }
            store.delete_doc("workflow_items", "k2/a", false).await.unwrap();
            assert_eq!(store.get_doc("workflow_items", "k2/a").await.unwrap(), None);
            assert!(store.get_doc("workflow_runs", "k2/a").await.unwrap().is_some());
            assert_eq!(keys(store.docs_of("workflow_items", "acme", None, 10, false).await.unwrap().items), ["k1"]);

            // A confirmation decided: moved between two own tables, once,
            // still erased with its session.
            store.write(vec![WriteOp::PutSession(session("s-own", "acme"))], false).await.unwrap();
            store.put_doc_of_session("confirmations", "acme", "s-own", "cf", json!({"p": 1}), false).await.unwrap();
            let (a, b) = tokio::join!(
                store.move_doc("confirmations", "cf", "confirmations_decided", json!({"d": "approved"}), true),
                store.move_doc("confirmations", "cf", "confirmations_decided", json!({"d": "denied"}), true),
            );
            let found: Vec<Value> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
            assert_eq!(found, [json!({"p": 1})]);
            assert_eq!(store.get_doc("confirmations", "cf").await.unwrap(), None);
            assert!(store.get_doc("confirmations_decided", "cf").await.unwrap().is_some());
            store.put_doc_of_session("workflow_runs", "acme", "s-own", "run-of-s", json!({}), false).await.unwrap();
            let erased = store.erase_session("s-own").await.unwrap().unwrap();
            assert_eq!(erased.documents, 2);
            assert_eq!(store.get_doc("confirmations_decided", "cf").await.unwrap(), None);
            assert_eq!(store.get_doc("workflow_runs", "run-of-s").await.unwrap(), None);
            assert!(store.get_doc("confirmations_decided", "k1").await.unwrap().is_some());

            // Indexed once per namespace, in its own table.
            store.put_doc("api_keys", "old", json!({"tenant": "initech"}), false).await.unwrap();
            fn tenant_of(v: &Value) -> Option<String> {
                v["tenant"].as_str().map(Into::into)
            }
            assert_eq!(store.index_docs("api_keys", tenant_of).await.unwrap(), Some(1));
            assert_eq!(store.index_docs("api_keys", tenant_of).await.unwrap(), None);
            assert_eq!(keys(store.docs_of("api_keys", "initech", None, 10, false).await.unwrap().items), ["old"]);
        }

        #[tokio::test]
        async fn erasing_a_session_removes_everything_under_it_and_late_writes() {
            let (store, _guard) = $open;
            let ops = vec![
                WriteOp::PutSession(session("gone", "acme")),
                WriteOp::PutSession(session("kept", "acme")),
                append("gone", 1, &["a", "b"]),
                append("kept", 1, &["c"]),
                WriteOp::PutSummary {
                    session_id: "gone".into(),
                    summary: StoredSummary { text: "x".into(), covers_until_seq: 1, updated_at: Timestamp::now() },
                },
                record(call(1, "acme", "calc", Some("gone"), None)),
                record(call(2, "acme", "calc", Some("kept"), None)),
                usage(Some("gone"), "acme", "assistant", 10, 5),
                turn("gone", "t1", true, Some("key-1")),
            ];
            store.write(ops, false).await.unwrap();
            store.put_doc_of_session("confirmations", "acme", "gone", "cf1", json!({"s": "gone"}), false).await.unwrap();
            // Decided: moved, and still erased with its session.
            store.move_doc("confirmations", "cf1", "decided", json!({"d": 1}), false).await.unwrap();
            store.put_doc_of("confirmations", "acme", "cf2", json!({}), false).await.unwrap();

            let erased = store.erase_session("gone").await.unwrap().unwrap();
            assert_eq!((erased.tenant.as_str(), erased.messages, erased.calls, erased.documents), ("acme", 2, 1, 1));
            assert_eq!(store.erase_session("gone").await.unwrap(), None);
            assert_eq!(store.get_session("gone").await.unwrap(), None);
            assert_eq!(store.message_count("gone").await.unwrap(), 0);
            assert_eq!(store.get_summary("gone").await.unwrap(), None);
            assert!(store.session_usage("gone").await.unwrap().is_empty());
            assert_eq!(store.turn("gone", "t1").await.unwrap(), None);
            assert_eq!(store.turn_by_key("gone", "key-1").await.unwrap(), None);
            assert!(store.open_turns().await.unwrap().is_empty());
            assert_eq!(store.get_doc("decided", "cf1").await.unwrap(), None);
            assert!(store.calls_for_conversation("gone").await.unwrap().is_empty());
            // What stays: the other session, counters, the tenant's usage.
            assert_eq!(store.message_count("kept").await.unwrap(), 1);
            assert_eq!(store.record_count().await.unwrap(), 1);
            assert!(store.get_doc("confirmations", "cf2").await.unwrap().is_some());
            assert_eq!(store.tool_stats("calc").await.unwrap().total_calls, 2);
            let day = day_of(Timestamp::now());
            assert_eq!(store.tenant_usage("acme", day, day).await.unwrap().total_tokens, 15);

            // Late writes under the erased id store nothing under it.
            let late = vec![
                WriteOp::PutSession(session("gone", "acme")),
                append("gone", 3, &["late"]),
                record(call(3, "acme", "calc", Some("gone"), None)),
                usage(Some("gone"), "acme", "assistant", 1, 1),
            ];
            store.write(late, false).await.unwrap();
            assert_eq!(store.get_session("gone").await.unwrap(), None);
            assert_eq!(store.message_count("gone").await.unwrap(), 0);
            assert_eq!(store.record_count().await.unwrap(), 1);
            assert!(store.session_usage("gone").await.unwrap().is_empty());
            assert_eq!(store.tenant_usage("acme", day, day).await.unwrap().total_tokens, 17);
        }

        #[tokio::test]
        async fn stored_bytes_count_each_tenants_messages_until_their_session_is_erased() {
            let (store, _guard) = $open;
            let ops = vec![
                WriteOp::PutSession(session("sb1", "acme")),
                WriteOp::PutSession(session("sb2", "acme")),
                WriteOp::PutSession(session("sb3", "other")),
            ];
            store.write(ops, false).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), 0);
            let ops = vec![
                append("sb1", 1, &["one", "two two"]),
                append("sb2", 1, &["three three three"]),
                append("sb3", 1, &["four"]),
            ];
            store.write(ops, false).await.unwrap();
            store.write(vec![append("sb1", 3, &["five, and \u{e9}"])], true).await.unwrap();
            // Each message's stored JSON, as written.
            let bytes = |id: &'static str| {
                let store = store.clone();
                async move {
                    store.messages(id).await.unwrap().iter()
                        .map(|m| serde_json::to_vec(m).unwrap().len() as u64)
                        .sum::<u64>()
                }
            };
            let (b1, b2, b3) = (bytes("sb1").await, bytes("sb2").await, bytes("sb3").await);
            assert!(b1 > 0 && b2 > 0 && b3 > 0);
            assert_eq!(store.stored_bytes("acme").await.unwrap(), b1 + b2);
            assert_eq!(store.stored_bytes("other").await.unwrap(), b3);
            assert_eq!(store.stored_bytes("nobody").await.unwrap(), 0);

            store.erase_session("sb1").await.unwrap().unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), b2);
            // A late write under the erased id counts for nobody.
            store.write(vec![append("sb1", 4, &["late"])], true).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), b2);
            assert_eq!(store.stored_bytes("other").await.unwrap(), b3);
        }

        #[tokio::test]
        async fn records_outside_sessions_count_in_their_tenants_bytes_until_erased() {
            let (store, _guard) = $open;
            let len = |r: &ToolCallRecord| serde_json::to_vec(r).unwrap().len() as u64;
            store.write(vec![WriteOp::PutSession(session("cb1", "acme"))], false).await.unwrap();
            // A direct call held for a confirmation, then rewritten with its
            // outcome: it counts what it holds now.
            let mut held = call(1, "acme", "calculator", None, None);
            held.output = None;
            held.is_success = false;
            held.error_type = Some("pending_confirmation".into());
            store.write(vec![record(held.clone())], false).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), len(&held));
            let mut done = held.clone();
            done.output = Some(json!({"answer": "x".repeat(300)}));
            done.is_success = true;
            done.error_type = None;
            store.write(vec![record(done.clone())], true).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), len(&done));
            // A workflow node's record counts; a conversation's does not
            // (its messages do); another tenant's is its own; a record
            // without a tenant counts for nobody.
            let wf = call(2, "acme", "calculator", None, Some("run1"));
            let conv = call(3, "acme", "calculator", Some("cb1"), None);
            let other = call(4, "other", "calculator", None, None);
            let mut nobody = call(5, "x", "calculator", None, None);
            nobody.tenant = None;
            let ops = vec![record(wf.clone()), record(conv.clone()), record(other.clone()),
                record(nobody)];
            store.write(ops, true).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), len(&done) + len(&wf));
            assert_eq!(store.stored_bytes("other").await.unwrap(), len(&other));

            assert_eq!(store.erase_calls_outside_sessions("acme").await.unwrap(), 2);
            assert_eq!(store.stored_bytes("acme").await.unwrap(), 0);
            assert_eq!(store.stored_bytes("other").await.unwrap(), len(&other));
            let page = store.calls_of("acme", CallFilter::default(), None, 10).await.unwrap();
            assert_eq!(ids(&page.items), ["r0003"], "the session's record stays");
            let by_tool = CallFilter { tool: Some("calculator".into()), ..CallFilter::default() };
            assert_eq!(ids(&store.calls(by_tool).await.unwrap()), ["r0005", "r0004", "r0003"]);
            let by_run = CallFilter { workflow_id: Some("run1".into()), ..CallFilter::default() };
            assert!(store.calls(by_run).await.unwrap().is_empty());
            assert_eq!(store.erase_calls_outside_sessions("acme").await.unwrap(), 0);
            // A late rewrite of an erased record stores it again, counted.
            store.write(vec![record(done.clone())], true).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), len(&done));
        }

        #[tokio::test]
        async fn erasing_records_outside_sessions_goes_past_one_batch() {
            let (store, _guard) = $open;
            store.write(vec![WriteOp::PutSession(session("cb2", "acme"))], false).await.unwrap();
            // More records than one transaction looks at, the session's
            // records among them.
            let n = cadre::store::ERASE_CALLS_BATCH as u32 + 50;
            let recs: Vec<ToolCallRecord> = (1..=n)
                .map(|i| {
                    let conv = i.is_multiple_of(10).then_some("cb2");
                    call(i, "acme", "calculator", conv, None)
                })
                .collect();
            let outside: u64 = recs.iter()
                .filter(|r| r.conversation_id.is_none())
                .map(|r| serde_json::to_vec(r).unwrap().len() as u64)
                .sum();
            store.write(recs.into_iter().map(record).collect(), true).await.unwrap();
            assert_eq!(store.stored_bytes("acme").await.unwrap(), outside);
            let erased = store.erase_calls_outside_sessions("acme").await.unwrap();
            assert_eq!(erased, u64::from(n - n / 10));
            assert_eq!(store.stored_bytes("acme").await.unwrap(), 0);
            assert_eq!(store.record_count().await.unwrap(), u64::from(n / 10));
        }

        #[tokio::test]
        async fn turns_keys_and_open_turns_follow_their_records() {
            let (store, _guard) = $open;
            store
                .write(
                    vec![
                        turn("s1", "t1", false, Some("k1")),
                        turn("s1", "t2", false, None),
                        turn("s1", "t3", true, Some("k3")),
                        turn("s2", "t9", true, None),
                    ],
                    false,
                )
                .await
                .unwrap();
            assert_eq!(store.turn("s1", "t2").await.unwrap(), Some(json!({"turn": "t2", "open": false})));
            assert_eq!(store.turn_by_key("s1", "k3").await.unwrap().as_deref(), Some("t3"));
            assert_eq!(store.turn_by_key("s2", "k3").await.unwrap(), None);
            assert_eq!(store.open_turn_of("s1").await.unwrap(), Some(json!({"turn": "t3", "open": true})));
            let open = store.open_turns().await.unwrap();
            assert_eq!(open, [("s1".to_string(), "t3".to_string()), ("s2".into(), "t9".into())]);
            let p1 = store.turns_of("s1", None, 2).await.unwrap();
            assert_eq!((p1.items.len(), p1.next.as_deref()), (2, Some("t2")));
            let p2 = store.turns_of("s1", p1.next, 2).await.unwrap();
            assert_eq!((p2.items, p2.next), (vec![json!({"turn": "t3", "open": true})], None));

            store.write(vec![turn("s1", "t3", false, None)], false).await.unwrap();
            assert_eq!(store.open_turn_of("s1").await.unwrap(), None);
            assert_eq!(store.open_turns().await.unwrap().len(), 1);
        }

        #[tokio::test]
        async fn idempotency_records_replay_and_expire() {
            let (store, _guard) = $open;
            let at = |ms| Timestamp::from_millisecond(ms).unwrap();
            let rec = |ms, body: &str| IdempotencyRecord {
                fingerprint: "f".into(),
                status: 201,
                content_type: Some("application/json".into()),
                body: body.into(),
                stored_at: at(ms),
                running_node: None,
            };
            store.put_idempotency("acme", "k1", &rec(1_000, "{\"a\":1}")).await.unwrap();
            store.put_idempotency("acme", "k2", &rec(5_000, "{\"a\":2}")).await.unwrap();
            store.put_idempotency("globex", "k1", &rec(2_000, "{\"g\":1}")).await.unwrap();
            assert_eq!(store.idempotency_record("acme", "k1").await.unwrap(), Some(rec(1_000, "{\"a\":1}")));
            assert_eq!(store.idempotency_record("acme", "none").await.unwrap(), None);
            assert_eq!(store.sweep_idempotency(at(3_000)).await.unwrap(), 2);
            assert_eq!(store.idempotency_record("acme", "k1").await.unwrap(), None);
            assert!(store.idempotency_record("acme", "k2").await.unwrap().is_some());
        }

        #[tokio::test]
        async fn usage_adds_up_per_session_and_per_tenant_day_and_agent() {
            let (store, _guard) = $open;
            store
                .write(
                    vec![
                        usage(Some("s1"), "acme", "assistant", 100, 10),
                        usage(Some("s1"), "acme", "assistant", 50, 5),
                        usage(None, "acme", "analyst", 7, 3),
                        usage(Some("s2"), "globex", "assistant", 1, 1),
                    ],
                    false,
                )
                .await
                .unwrap();
            let s1 = store.session_usage("s1").await.unwrap();
            assert_eq!((s1.total_tokens, s1.model_calls), (165, 2));
            let day = day_of(Timestamp::now());
            let rows = store.usage_rows(None, day, day).await.unwrap();
            let seen: Vec<(&str, &str, u64)> = rows.iter().map(|r| (r.tenant.as_str(), r.agent.as_str(), r.usage.total_tokens)).collect();
            assert_eq!(seen, [("acme", "analyst", 10), ("acme", "assistant", 165), ("globex", "assistant", 2)]);
            assert_eq!(store.tenant_usage("acme", day, day).await.unwrap().total_tokens, 175);
            let yesterday = day.yesterday().unwrap();
            assert!(store.usage_rows(Some("acme"), yesterday, yesterday).await.unwrap().is_empty());
        }

        #[tokio::test]
        async fn a_write_fenced_at_the_epoch_of_a_claim_is_applied() {
            let (store, _guard) = $open;
            store.write(vec![WriteOp::PutSession(session("s", "acme"))], true).await.unwrap();
            let claim = store.claim_session("s").await.unwrap();
            assert_eq!(claim.took_over_from, None);
            let fence = WriteOp::Fence { session_id: "s".into(), epoch: claim.epoch };
            store.write(vec![fence, append("s", 1, &["mine"])], true).await.unwrap();
            assert_eq!(texts(&store.messages("s").await.unwrap()), ["mine"]);
            store.heartbeat().await.unwrap();
            store.release_session("s", claim.epoch).await.unwrap();

            // A workflow run: created by its writer, claimed, written fenced.
            store.put_doc_of("workflow_runs", "acme", "run1", json!({"status": "running"}), true).await.unwrap();
            store.put_doc_of("workflow_runs", "acme", "run2", json!({"status": "succeeded"}), true).await.unwrap();
            let claim = store.claim_run("run1").await.unwrap();
            assert_eq!(claim.took_over_from, None);
            let fence = WriteOp::FenceRun { run_id: "run1".into(), epoch: claim.epoch };
            let item = WriteOp::PutDoc {
                namespace: "workflow_items".into(),
                key: "run1/each/0000000000".into(),
                value: json!({"status": "succeeded"}),
                tenant: None,
            };
            store.write(vec![fence, item], true).await.unwrap();
            assert_eq!(store.list_docs("workflow_items", "run1/").await.unwrap().len(), 1);
            assert_eq!(store.cut_runs().await.unwrap(), ["run1"], "running runs only");
        }

        #[tokio::test]
        async fn text_with_nul_is_stored_and_found_as_sent() {
            let (store, _guard) = $open;
            let name = "calc\0ulator";
            let mut rec = call(1, "acme", name, Some("c\0"), None);
            rec.params = json!({"x": "a\0b"});
            store
                .write(vec![record(rec.clone()), append("s", 1, &["nul \0 here"])], true)
                .await
                .unwrap();
            let by_tool = CallFilter { tool: Some(name.into()), ..CallFilter::default() };
            assert_eq!(store.calls(by_tool).await.unwrap(), [rec.clone()]);
            assert_eq!(store.calls_for_conversation("c\0").await.unwrap(), [rec]);
            assert_eq!(store.tool_stats(name).await.unwrap().total_calls, 1);
            assert_eq!(texts(&store.messages("s").await.unwrap()), ["nul \0 here"]);
        }

        #[tokio::test]
        async fn writes_sent_behind_land_in_order_before_a_later_write() {
            let (store, _guard) = $open;
            for seq in 1..=50u64 {
                store.write_behind(vec![append("s", seq, &[&format!("m{seq}")])]);
            }
            store.write(vec![append("s", 51, &["last"])], true).await.unwrap();
            let all = store.messages("s").await.unwrap();
            let seqs: Vec<u64> = all.iter().map(|m| m.seq).collect();
            assert_eq!(seqs, (1..=51).collect::<Vec<_>>());
            assert_eq!(all[0].message.content.as_deref(), Some("m1"));
            store.flush().await.unwrap();
        }
    };
}

mod redb {
    suite!({
        let dir = tempfile::tempdir().unwrap();
        let backend = cadre::store::RedbStore::open(dir.path(), 64 << 20).unwrap();
        (std::sync::Arc::new(backend) as Arc<dyn StoreBackend>, dir)
    });
}

/// A data dir of schema 2, as cadre wrote it before the store's own kinds
/// of documents had tables: every one in DOCS, one of them indexed by
/// tenant and linked to a session.
fn schema_2_data_dir(dir: &std::path::Path) {
    use cadre::store::tables::*;
    std::fs::create_dir_all(dir).unwrap();
    let db = ::redb::Database::create(dir.join("cadre.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        txn.open_table(META)
            .unwrap()
            .insert("schema_version", 2)
            .unwrap();
        let s = serde_json::to_vec(&session("s2", "acme")).unwrap();
        txn.open_table(SESSIONS)
            .unwrap()
            .insert("s2", s.as_slice())
            .unwrap();
        txn.open_table(SESSIONS_BY_TENANT)
            .unwrap()
            .insert(("acme", "s2"), ())
            .unwrap();
        let mut messages = txn.open_table(MESSAGES).unwrap();
        for seq in [1, 2] {
            let m = serde_json::to_vec(&schema_2_message(seq)).unwrap();
            messages.insert(("s2", seq), m.as_slice()).unwrap();
        }
        drop(messages);
        // A direct tool call's record (no session), counted at open (schema 5).
        let rec = schema_2_call();
        let r = serde_json::to_vec(&rec).unwrap();
        txn.open_table(TOOL_CALLS)
            .unwrap()
            .insert(rec.record_id.as_str(), r.as_slice())
            .unwrap();
        txn.open_table(TOOL_CALLS_BY_TOOL)
            .unwrap()
            .insert((rec.tool_name.as_str(), rec.record_id.as_str()), ())
            .unwrap();
        let mut by_tenant = txn.open_table(TOOL_CALLS_BY_TENANT).unwrap();
        for facet in ["", "t:calculator"] {
            by_tenant
                .insert(("acme", facet, rec.record_id.as_str()), ())
                .unwrap();
        }
        drop(by_tenant);
        let mut docs = txn.open_table(DOCS).unwrap();
        for t in &OWN_TABLES {
            let body = json!({"ns": t.namespace, "tenant": "acme"}).to_string();
            docs.insert((t.namespace, "old-1"), body.as_bytes())
                .unwrap();
        }
        docs.insert(("trading.orders", "alice/1"), b"{\"qty\":1}".as_slice())
            .unwrap();
        txn.open_table(DOCS_BY_TENANT)
            .unwrap()
            .insert(("confirmations", "acme", "old-1"), ())
            .unwrap();
        txn.open_table(DOC_TENANTS)
            .unwrap()
            .insert(("confirmations", "old-1"), "acme")
            .unwrap();
        txn.open_table(DOCS_BY_SESSION)
            .unwrap()
            .insert(("s2", "confirmations", "old-1"), ())
            .unwrap();
        txn.open_table(DOC_SESSIONS)
            .unwrap()
            .insert(("confirmations", "old-1"), "s2")
            .unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("docs_indexed:confirmations", 1)
            .unwrap();
    }
    txn.commit().unwrap();
}

/// A message of [`schema_2_data_dir`], at a fixed time (the length of
/// its JSON depends on the time's digits).
fn schema_2_message(seq: u64) -> StoredMessage {
    StoredMessage {
        created_at: "2025-01-02T03:04:05.5Z".parse().unwrap(),
        ..msg(seq, "from before the count")
    }
}

/// The direct call's record of [`schema_2_data_dir`], at a fixed time.
fn schema_2_call() -> ToolCallRecord {
    ToolCallRecord {
        guardrails: Vec::new(),
        created_at: "2025-01-02T03:04:05.5Z".parse().unwrap(),
        ..call(9, "acme", "calculator", None, None)
    }
}

/// What the messages of [`schema_2_data_dir`] and its direct call's
/// record weigh: what its tenant stores.
fn schema_2_message_bytes() -> u64 {
    [1, 2]
        .map(|seq| serde_json::to_vec(&schema_2_message(seq)).unwrap().len() as u64)
        .iter()
        .sum::<u64>()
        + serde_json::to_vec(&schema_2_call()).unwrap().len() as u64
}

/// Redb schema 2 -> 3 -> 4: the documents move to their tables at open,
/// once, and the stored messages are counted.
mod redb_upgrade {
    use super::*;
    use cadre::store::Store;
    use cadre::store::erase::dump_file;

    fn tables_holding(path: &std::path::Path, key: &str) -> Vec<String> {
        let mut t: Vec<String> = dump_file(path)
            .unwrap()
            .into_iter()
            .filter(|r| {
                r.key.contains(key) && !r.table.contains("by_") && !r.table.starts_with("doc_")
            })
            .map(|r| r.table)
            .collect();
        t.sort();
        t
    }

    #[tokio::test]
    async fn a_schema_2_file_moves_its_documents_to_their_tables_at_open_once() {
        let dir = tempfile::tempdir().unwrap();
        schema_2_data_dir(dir.path());
        let file = dir.path().join("cadre.redb");
        for _ in 0..2 {
            let store = Store::open(dir.path()).unwrap();
            for t in &OWN_TABLES {
                assert_eq!(
                    store.get_doc(t.namespace, "old-1").await.unwrap(),
                    Some(json!({"ns": t.namespace, "tenant": "acme"})),
                    "{}",
                    t.namespace
                );
            }
            assert_eq!(
                store.get_doc("trading.orders", "alice/1").await.unwrap(),
                Some(json!({"qty": 1}))
            );
            let page = store
                .docs_of("confirmations", "acme", None, 10, false)
                .await
                .unwrap();
            assert_eq!(page.items.len(), 1);
            drop(store);
            let mut own: Vec<String> = OWN_TABLES.iter().map(|t| t.name().to_string()).collect();
            own.sort();
            assert_eq!(
                tables_holding(&file, "old-1"),
                own,
                "each in its table, none left in docs"
            );
            assert_eq!(tables_holding(&file, "alice/1"), ["docs"]);
            let version = dump_file(&file)
                .unwrap()
                .into_iter()
                .find(|r| r.table == "meta" && r.key.contains("schema_version"))
                .unwrap();
            assert_eq!(version.value, SCHEMA_VERSION.to_string());
        }
        // The messages already there were counted at open (schema 4), and
        // the record outside a session (schema 5).
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.stored_bytes("acme").await.unwrap(),
            schema_2_message_bytes()
        );
        drop(store);
        // The erase link came along: the session takes its confirmation.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.erase_session("s2").await.unwrap().unwrap().documents,
            1
        );
        assert_eq!(store.get_doc("confirmations", "old-1").await.unwrap(), None);
    }
}

mod postgres {
    suite!({
        let pg = super::support::postgres::Postgres::shared();
        let url = pg.database("conformance");
        let node = cadre::store::NodeIdentity {
            id: "node-a".into(),
            addr: None,
            stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
        };
        let backend = cadre::cluster::postgres::PgStore::open(&url, node).unwrap();
        (std::sync::Arc::new(backend) as Arc<dyn StoreBackend>, pg)
    });
}

/// The store's own kinds of documents are rows of their PostgreSQL tables,
/// and `cadre migrate` puts a schema 2 data dir's there too.
mod postgres_tables {
    use super::*;
    use cadre::cluster::postgres::open_store;
    use cadre::store::NodeIdentity;
    use support::postgres::Postgres;

    fn node() -> NodeIdentity {
        NodeIdentity {
            id: "node-a".into(),
            addr: None,
            stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
        }
    }

    fn counts(pg: &Postgres, url: &str) -> Vec<(String, String)> {
        let mut out = vec![(
            "docs".to_string(),
            pg.sql(
                url,
                "SELECT count(*) FROM docs WHERE namespace <> 'trading.orders'",
            ),
        )];
        for t in &OWN_TABLES {
            out.push((
                t.name().to_string(),
                pg.sql(url, &format!("SELECT count(*) FROM {}", t.name())),
            ));
        }
        out
    }

    fn expected(n: &str) -> Vec<(String, String)> {
        let mut out = vec![("docs".to_string(), "0".to_string())];
        out.extend(
            OWN_TABLES
                .iter()
                .map(|t| (t.name().to_string(), n.to_string())),
        );
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn own_documents_are_rows_of_their_own_tables() {
        let pg = Postgres::shared();
        let url = pg.database("own_tables");
        let store = open_store(&url, node()).unwrap();
        for t in &OWN_TABLES {
            store
                .put_doc_of(t.namespace, "acme", "k", json!({}), true)
                .await
                .unwrap();
        }
        store
            .put_doc("trading.orders", "alice/1", json!({}), true)
            .await
            .unwrap();
        assert_eq!(counts(&pg, &url), expected("1"));
        assert_eq!(pg.sql(&url, "SELECT count(*) FROM docs"), "1");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_schema_2_data_dir_migrates_into_the_own_tables() {
        let dir = tempfile::tempdir().unwrap();
        schema_2_data_dir(dir.path());
        let pg = Postgres::shared();
        let url = pg.database("migrate_v2");
        for _ in 0..2 {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_cadre"))
                .arg("migrate")
                .arg("--from")
                .arg(dir.path())
                .args(["--to", &url])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(counts(&pg, &url), expected("1"));
        }
        let store = open_store(&url, node()).unwrap();
        // Imported twice, counted once: the import recounts.
        assert_eq!(
            store.stored_bytes("acme").await.unwrap(),
            schema_2_message_bytes()
        );
        let page = store
            .docs_of("confirmations", "acme", None, 10, false)
            .await
            .unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(
            store.get_doc("trading.orders", "alice/1").await.unwrap(),
            Some(json!({"qty": 1}))
        );
        assert_eq!(
            store.erase_session("s2").await.unwrap().unwrap().documents,
            1
        );
        assert_eq!(store.get_doc("confirmations", "old-1").await.unwrap(), None);
    }
}

/// PostgreSQL migration 005 counts the records already stored outside a
/// session: a database at 004 (the table dropped, the migration unrecorded)
/// opened by this build.
mod postgres_upgrade {
    use super::*;
    use cadre::cluster::postgres::open_store;
    use support::postgres::Postgres;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migration_005_counts_the_records_already_outside_sessions() {
        let pg = Postgres::shared();
        let url = pg.database("call_bytes");
        let node = || cadre::store::NodeIdentity {
            id: "node-a".into(),
            addr: None,
            stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
        };
        let direct = call(1, "acme", "calculator", None, None);
        let conv = call(2, "acme", "calculator", Some("s"), None);
        let store = open_store(&url, node()).unwrap();
        store
            .write(vec![record(direct.clone()), record(conv)], true)
            .await
            .unwrap();
        drop(store);
        pg.sql(
            &url,
            "DROP TABLE tenant_call_bytes; DELETE FROM schema_migrations WHERE version = 5",
        );
        let store = open_store(&url, node()).unwrap();
        assert_eq!(
            store.stored_bytes("acme").await.unwrap(),
            serde_json::to_vec(&direct).unwrap().len() as u64
        );
        assert_eq!(store.erase_calls_outside_sessions("acme").await.unwrap(), 1);
        assert_eq!(store.stored_bytes("acme").await.unwrap(), 0);
    }
}

/// What only the cluster backend does: fencing, ownership, heartbeats.
mod cluster {
    use super::*;
    use cadre::cluster::postgres::open_store;
    use cadre::store::StoreError;
    use cadre::store::{NodeIdentity, Store};
    use support::postgres::Postgres;

    fn node(id: &str, addr: &str) -> NodeIdentity {
        NodeIdentity {
            id: id.into(),
            addr: Some(addr.into()),
            stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
        }
    }

    fn fence(epoch: u64) -> WriteOp {
        WriteOp::Fence {
            session_id: "s".into(),
            epoch,
        }
    }

    #[tokio::test]
    async fn a_stale_epoch_is_refused_whole_and_the_rest_of_the_batch_commits() {
        let pg = Postgres::shared();
        let url = pg.database("fence");
        let store = open_store(&url, node("node-a", "10.0.0.1:8080")).unwrap();
        store
            .write(vec![WriteOp::PutSession(session("s", "acme"))], true)
            .await
            .unwrap();
        // Held behind, it rides the next write's transaction: one batch.
        store.write_behind(vec![
            fence(7),
            append("s", 1, &["stale"]),
            record(call(1, "acme", "calc", Some("s"), None)),
        ]);
        store
            .write(vec![fence(1), append("s", 1, &["current"])], true)
            .await
            .unwrap();
        assert_eq!(texts(&store.messages("s").await.unwrap()), ["current"]);
        assert_eq!(store.record_count().await.unwrap(), 0);

        // Concurrent requests: each gets its own answer.
        let (stale, fine, other) = tokio::join!(
            store.write(vec![fence(2), append("s", 2, &["x"])], true),
            store.write(vec![fence(1), append("s", 2, &["two"])], true),
            store.write(vec![append("t", 1, &["elsewhere"])], false),
        );
        assert!(
            matches!(&stale, Err(StoreError::Fenced { session_id, epoch: 2 }) if session_id == "s"),
            "{stale:?}"
        );
        fine.unwrap();
        other.unwrap();

        // A seq written already is a fence too: the writer lost the session.
        let again = store
            .write(
                vec![fence(1), append("s", 2, &["again"]), append("u", 1, &["u"])],
                true,
            )
            .await;
        assert!(
            matches!(again, Err(StoreError::Fenced { epoch: 1, .. })),
            "{again:?}"
        );
        assert_eq!(
            texts(&store.messages("s").await.unwrap()),
            ["current", "two"]
        );
        assert_eq!(store.message_count("u").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_workflow_run_is_taken_over_only_from_a_dead_owner_and_fences_the_old_one() {
        let pg = Postgres::shared();
        let url = pg.database("claim_run");
        let a = open_store(&url, node("node-a", "10.0.0.1:8080")).unwrap();
        let b = open_store(&url, node("node-b", "10.0.0.2:8080")).unwrap();
        a.heartbeat().await.unwrap();
        b.heartbeat().await.unwrap();
        let run = |status: &str| json!({"status": status, "tenant": "acme"});
        a.put_doc_of("workflow_runs", "acme", "run1", run("running"), true)
            .await
            .unwrap();
        let item = |epoch: u64, v: &str| {
            vec![
                WriteOp::FenceRun {
                    run_id: "run1".into(),
                    epoch,
                },
                WriteOp::PutDoc {
                    namespace: "workflow_items".into(),
                    key: "run1/each/0000000000".into(),
                    value: json!(v),
                    tenant: None,
                },
            ]
        };

        // Its creator owns it at epoch 1; a live owner keeps it.
        let mine = a.claim_run("run1").await.unwrap();
        assert_eq!((mine.epoch, mine.took_over_from), (1, None));
        let owned = b.claim_run("run1").await;
        assert!(
            matches!(&owned, Err(StoreError::RunOwnedElsewhere { owner, .. }) if owner == "node-a"),
            "{owned:?}"
        );
        assert!(b.cut_runs().await.unwrap().is_empty());
        assert_eq!(a.cut_runs().await.unwrap(), ["run1"]);
        a.write(item(1, "a"), true).await.unwrap();

        // node-a's heartbeat goes stale: node-b finds the run and takes it.
        pg.sql(
            &url,
            "UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = 'node-a'",
        );
        assert_eq!(b.cut_runs().await.unwrap(), ["run1"]);
        let taken = b.claim_run("run1").await.unwrap();
        assert_eq!(
            (taken.epoch, taken.took_over_from.as_deref()),
            (2, Some("node-a"))
        );
        let late = a.write(item(1, "late"), true).await;
        assert!(
            matches!(late, Err(StoreError::RunFenced { .. })),
            "{late:?}"
        );
        let items = |s: &Store| {
            let s = s.clone();
            async move { s.list_docs("workflow_items", "run1/").await.unwrap() }
        };
        assert_eq!(
            items(&b).await[0].1,
            json!("a"),
            "the refused write left nothing"
        );
        b.write(item(2, "b"), true).await.unwrap();
        assert_eq!(items(&a).await[0].1, json!("b"));

        // A run nobody runs (finished) is anyone's to claim again.
        a.heartbeat().await.unwrap();
        b.put_doc("workflow_runs", "run1", run("failed"), true)
            .await
            .unwrap();
        let back = a.claim_run("run1").await.unwrap();
        assert_eq!(
            (back.epoch, back.took_over_from.as_deref()),
            (3, Some("node-b"))
        );
        assert!(matches!(
            b.write(item(2, "b2"), true).await,
            Err(StoreError::RunFenced { .. })
        ));
        assert!(matches!(
            b.claim_run("nope").await,
            Err(StoreError::RunFenced { epoch: 0, .. })
        ));
    }

    #[tokio::test]
    async fn a_session_is_taken_over_only_from_a_dead_or_idle_owner() {
        let pg = Postgres::shared();
        let url = pg.database("claim");
        let a = open_store(&url, node("node-a", "10.0.0.1:8080")).unwrap();
        let b = open_store(&url, node("node-b", "10.0.0.2:8080")).unwrap();
        a.heartbeat().await.unwrap();
        b.heartbeat().await.unwrap();
        // A new session has no owner: whichever node first runs it claims
        // it, not the node that created it (every create reaches one node).
        for id in ["s", "t"] {
            a.write(vec![WriteOp::PutSession(session(id, "acme"))], true)
                .await
                .unwrap();
        }
        let first = b.claim_session("t").await.unwrap();
        assert_eq!(
            (first.epoch, first.took_over_from),
            (2, None),
            "created by a, run by b"
        );

        let mine = a.claim_session("s").await.unwrap();
        assert_eq!((mine.epoch, mine.took_over_from), (2, None));
        let again = a.claim_session("s").await.unwrap();
        assert_eq!(again.epoch, 2, "not bumped by its own owner");
        let owned = b.claim_session("s").await;
        assert!(
            matches!(&owned, Err(StoreError::OwnedElsewhere { owner, addr: Some(addr), .. })
                if owner == "node-a" && addr == "10.0.0.1:8080"),
            "{owned:?}"
        );
        let unknown = b.claim_session("nope").await.unwrap();
        assert_eq!(unknown.epoch, 0);

        // node-a's heartbeat goes stale (by the database's clock).
        pg.sql(
            &url,
            "UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = 'node-a'",
        );
        let alive: Vec<(String, bool)> = b
            .nodes()
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.id, n.alive))
            .collect();
        assert_eq!(
            alive,
            [("node-a".to_string(), false), ("node-b".into(), true)]
        );
        let taken = b.claim_session("s").await.unwrap();
        assert_eq!(
            (taken.epoch, taken.took_over_from.as_deref()),
            (3, Some("node-a"))
        );
        let late = a
            .write(vec![fence(2), append("s", 1, &["late"])], true)
            .await;
        assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
        b.write(vec![fence(3), append("s", 1, &["b"])], true)
            .await
            .unwrap();
        assert_eq!(texts(&a.messages("s").await.unwrap()), ["b"]);

        // An idle release lets any node claim, with a new epoch; a release
        // with a stale epoch changes nothing.
        a.heartbeat().await.unwrap();
        a.release_session("s", 2).await.unwrap();
        assert!(matches!(
            a.claim_session("s").await,
            Err(StoreError::OwnedElsewhere { .. })
        ));
        b.release_session("s", 3).await.unwrap();
        let back = a.claim_session("s").await.unwrap();
        assert_eq!((back.epoch, back.took_over_from), (4, None));
        let fenced = b.write(vec![fence(3), append("s", 2, &["b2"])], true).await;
        assert!(
            matches!(fenced, Err(StoreError::Fenced { .. })),
            "{fenced:?}"
        );
    }

    #[tokio::test]
    async fn the_sweep_is_named_only_cut_turns_without_a_live_owner() {
        let pg = Postgres::shared();
        let url = pg.database("orphans");
        let a = open_store(&url, node("node-a", "10.0.0.1:8080")).unwrap();
        let b = open_store(&url, node("node-b", "10.0.0.2:8080")).unwrap();
        a.heartbeat().await.unwrap();
        b.heartbeat().await.unwrap();
        // Each node runs a turn of its own session (claimed first, as a
        // conversation does: a new session has no owner).
        for (store, id) in [(&a, "sa"), (&b, "sb")] {
            store
                .write(vec![WriteOp::PutSession(session(id, "acme"))], true)
                .await
                .unwrap();
            store.claim_session(id).await.unwrap();
            store
                .write(vec![turn(id, "t1", true, None)], true)
                .await
                .unwrap();
        }
        // Each node's own turns (an earlier process of it died), never the
        // other live node's.
        assert_eq!(a.orphaned_turn_sessions().await.unwrap(), ["sa"]);
        assert_eq!(b.orphaned_turn_sessions().await.unwrap(), ["sb"]);
        pg.sql(
            &url,
            "UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = 'node-a'",
        );
        assert_eq!(b.orphaned_turn_sessions().await.unwrap(), ["sa", "sb"]);
        // A finished turn is nobody's to take up.
        b.write(vec![turn("sb", "t1", false, None)], true)
            .await
            .unwrap();
        assert_eq!(b.orphaned_turn_sessions().await.unwrap(), ["sa"]);
    }

    #[tokio::test]
    async fn an_unreachable_database_is_an_error_naming_the_setting_without_the_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://cadre:s3cret@127.0.0.1:{port}/cadre");
        let err = open_store(&url, node("node-a", "x"))
            .err()
            .expect("refused");
        let text = err.to_string();
        assert!(text.contains("--store / [cluster] store"), "{text}");
        assert!(
            text.contains(&format!("postgres://cadre@127.0.0.1:{port}/cadre")),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[tokio::test]
    async fn a_lost_database_makes_writes_unavailable_and_health_degraded() {
        let pg = Postgres::start();
        let url = pg.database("lost");
        let store = open_store(&url, node("node-a", "x")).unwrap();
        store.put_doc("ns", "k", json!(1), true).await.unwrap();
        assert_eq!(store.health(), cadre::store::StoreHealth::Ok);
        drop(pg);
        let err = store.put_doc("ns", "k", json!(2), true).await;
        assert!(
            matches!(
                err,
                Err(StoreError::Unavailable { .. } | StoreError::CommitFailed(_))
            ),
            "{err:?}"
        );
        assert!(store.get_doc("ns", "k").await.is_err());
        assert!(
            matches!(store.health(), cadre::store::StoreHealth::Degraded { .. }),
            "{:?}",
            store.health()
        );
    }
}

/// `cadre migrate`: a data dir of a real run, copied into PostgreSQL, reads
/// back the same through the PostgreSQL store; a second run changes nothing.
mod migrate {
    use super::*;
    use cadre::cluster::postgres::open_store;
    use cadre::store::{NodeIdentity, Store};
    use reqwest::StatusCode;
    use support::postgres::Postgres;
    use support::server::Server;

    fn migrate(data: &std::path::Path, url: &str) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cadre"))
            .arg("migrate")
            .arg("--from")
            .arg(data)
            .args(["--to", url])
            .output()
            .expect("run cadre migrate");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_data_dir_of_a_real_run_reads_back_the_same_from_postgres() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut server = Server::start_offline(&data, &support::repo_agents());
        let client = server.client();
        let session = client.session("assistant").await;
        for question in ["what is (2+3)*4?", "and 7*6?"] {
            let (status, body) = client.say(&session, question).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        let pg = Postgres::shared();
        let url = pg.database("migrate");
        // While the server runs, the data dir is not copied.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cadre"))
            .arg("migrate")
            .arg("--from")
            .arg(&data)
            .args(["--to", &url])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("stop it first"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.sigterm();
        assert!(
            server
                .wait_exit(std::time::Duration::from_secs(20))
                .success()
        );

        let first = migrate(&data, &url);
        assert!(first.contains("messages"), "{first}");
        assert_eq!(
            migrate(&data, &url),
            first,
            "a second run copies the same rows"
        );

        let redb = Store::open(&data).unwrap();
        let node = NodeIdentity {
            id: "node-a".into(),
            addr: None,
            stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
        };
        let pg_store = open_store(&url, node).unwrap();
        let day = day_of(Timestamp::now());
        // Two turns with a tool call each: user, call, result, answer.
        assert_eq!(pg_store.message_count(&session).await.unwrap(), 8);
        assert_eq!(
            redb.list_sessions().await.unwrap(),
            pg_store.list_sessions().await.unwrap()
        );
        assert_eq!(
            redb.messages(&session).await.unwrap(),
            pg_store.messages(&session).await.unwrap()
        );
        let calls = redb.calls(CallFilter::default()).await.unwrap();
        assert!(!calls.is_empty());
        assert_eq!(calls, pg_store.calls(CallFilter::default()).await.unwrap());
        let tenant = calls[0].tenant.clone().unwrap();
        assert_eq!(
            redb.calls_of(&tenant, CallFilter::default(), None, 10)
                .await
                .unwrap(),
            pg_store
                .calls_of(&tenant, CallFilter::default(), None, 10)
                .await
                .unwrap()
        );
        assert_eq!(
            redb.all_tool_stats().await.unwrap(),
            pg_store.all_tool_stats().await.unwrap()
        );
        assert_eq!(
            redb.session_usage(&session).await.unwrap(),
            pg_store.session_usage(&session).await.unwrap()
        );
        assert_eq!(
            redb.usage_rows(None, day, day).await.unwrap(),
            pg_store.usage_rows(None, day, day).await.unwrap()
        );
        assert_eq!(
            redb.turns_of(&session, None, 10).await.unwrap(),
            pg_store.turns_of(&session, None, 10).await.unwrap()
        );
        assert_eq!(
            redb.get_summary(&session).await.unwrap(),
            pg_store.get_summary(&session).await.unwrap()
        );
        // The migrated session has no owner: the first claim takes it.
        let claim = pg_store.claim_session(&session).await.unwrap();
        assert_eq!((claim.epoch, claim.took_over_from), (2, None));
    }
}
