//! Listings read only the caller's data: `GET /v1/sessions`, `/v1/calls`,
//! `/v1/confirmations` and `/v1/workflows/runs` page through the caller's
//! tenant's rows (`limit`, `cursor`, `next`), never show another tenant's,
//! and still list rows a data dir held before the tenant indexes existed.
//!
//! Rows are written into the data dir through the store before the server
//! opens it (as keys are): the listings are what is tested, not how the
//! rows came to be.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use cadre::executor::confirmations::Confirmations;
use cadre::store::{Session, Store, ToolCallRecord, WriteOp, tables};
use cadre::tools::{CallerType, ExecutionContext};
use jiff::Timestamp;
use redb::{ReadableDatabase, ReadableTable};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, Client, spawn_app};

/// What one tenant holds: the ids each listing must return.
#[derive(Default, Debug)]
struct Held {
    sessions: BTreeSet<String>,
    calls: BTreeSet<String>,
    confirmations: BTreeSet<String>,
    runs: BTreeSet<String>,
}

/// Writes `n` sessions, calls, pending confirmations and workflow runs of
/// `tenant` through the store.
async fn hold(store: &Store, tenant: &str, n: usize) -> Held {
    let mut held = Held::default();
    let confirmations = Confirmations::new(store.clone(), Duration::from_secs(600));
    for i in 0..n {
        let session = Session {
            id: format!("s_{}", uuid::Uuid::now_v7().simple()),
            tenant: tenant.into(),
            agent: "helper".into(),
            user_id: None,
            plan: Default::default(),
            metadata: json!({"i": i}),
            created_at: Timestamp::now(),
            forked_from: None,
        };
        let record = ToolCallRecord {
            guardrails: Vec::new(),
            cached: false,
            record_id: uuid::Uuid::now_v7().to_string(),
            tool_name: if i % 2 == 0 { "calculator" } else { "echo" }.into(),
            tool_call_id: None,
            params: json!({}),
            output: None,
            is_success: true,
            error: None,
            error_type: None,
            execution_time_ms: 1,
            attempts: 1,
            caller_id: "test".into(),
            caller_type: "direct".into(),
            conversation_id: Some(session.id.clone()),
            workflow_id: None,
            user_id: None,
            tenant: Some(tenant.into()),
            created_at: Timestamp::now(),
            started_at: None,
            source_id: None,
            turn_id: None,
        };
        held.sessions.insert(session.id.clone());
        held.calls.insert(record.record_id.clone());
        store
            .write(
                vec![
                    WriteOp::PutSession(session),
                    WriteOp::RecordToolCall(Box::new(record)),
                ],
                false,
            )
            .await
            .expect("rows written");

        let mut ctx = ExecutionContext::new(CallerType::Direct, "u");
        ctx.tenant = Some(tenant.into());
        let pending = confirmations
            .create("order", json!({"i": i}), None, ctx, &format!("rec_{i}"))
            .await
            .expect("confirmation stored");
        held.confirmations.insert(pending.confirmation_id);

        let run_id = uuid::Uuid::now_v7().to_string();
        let run = json!({
            "id": run_id, "workflow": "wf", "status": "succeeded", "input": {},
            "tenant": tenant, "user_id": null, "nodes": {}, "output": null,
            "error": null, "created_at": Timestamp::now(), "finished_at": null, "resumes": 0,
        });
        store
            .put_doc_of(
                cadre::workflow::run::RUNS_NAMESPACE,
                tenant,
                &run_id,
                run,
                false,
            )
            .await
            .expect("run stored");
        held.runs.insert(run_id);
    }
    store.flush().await.expect("flushed");
    held
}

async fn create_key(store: &Store, tenant: &str) -> String {
    cadre::tenants::create_key(store, tenant, false)
        .await
        .expect("key created")
        .0
}

/// Walks a listing page by page with `limit`; the ids in the order served
/// and how many pages it took.
async fn walk(
    client: &Client,
    path: &str,
    field: &str,
    id: &str,
    limit: usize,
) -> (Vec<String>, usize) {
    let (mut ids, mut pages) = (Vec::new(), 0);
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let (status, body) = client.get(&url).await;
        assert_eq!(status, StatusCode::OK, "{url}: {body}");
        let items = body[field].as_array().expect("a list");
        assert!(items.len() <= limit, "{url}: a page over its limit");
        ids.extend(
            items
                .iter()
                .map(|i| i[id].as_str().expect("an id").to_string()),
        );
        pages += 1;
        match &body["next"] {
            Value::String(next) => cursor = Some(next.clone()),
            Value::Null => break,
            other => panic!("{url}: next is {other}"),
        }
        assert!(pages < 1_000, "{url}: the walk does not end");
    }
    (ids, pages)
}

/// Every listing of `client`'s tenant, walked 7 at a time, equals `held`,
/// each row exactly once, in the listing's order.
async fn assert_lists_exactly(client: &Client, held: &Held) {
    for (path, field, id, want, newest_first) in [
        ("/v1/sessions", "sessions", "id", &held.sessions, false),
        ("/v1/calls", "calls", "record_id", &held.calls, true),
        (
            "/v1/confirmations",
            "confirmations",
            "confirmation_id",
            &held.confirmations,
            false,
        ),
        ("/v1/workflows/runs", "runs", "id", &held.runs, true),
    ] {
        let (ids, pages) = walk(client, path, field, id, 7).await;
        let mut expected: Vec<String> = want.iter().cloned().collect();
        if newest_first {
            expected.reverse();
        }
        assert_eq!(
            ids, expected,
            "{path}: not each of the tenant's rows once, in order"
        );
        assert_eq!(pages, want.len().div_ceil(7).max(1), "{path}: pages");
    }
}

#[tokio::test]
async fn pages_walk_a_tenants_listings_once_and_never_show_another_tenants_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (acme_key, globex_key, acme, globex) = {
        let store = support::store::open_store(dir.path());
        let acme_key = create_key(&store, "acme").await;
        let globex_key = create_key(&store, "globex").await;
        // Interleaved, so another tenant's rows sit between the caller's.
        let mut acme = Held::default();
        let mut globex = Held::default();
        for _ in 0..4 {
            let a = hold(&store, "acme", 5).await;
            let g = hold(&store, "globex", 6).await;
            for (to, from) in [(&mut acme, a), (&mut globex, g)] {
                to.sessions.extend(from.sessions);
                to.calls.extend(from.calls);
                to.confirmations.extend(from.confirmations);
                to.runs.extend(from.runs);
            }
        }
        (acme_key, globex_key, acme, globex)
    };
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    assert_lists_exactly(&app.with_key(&acme_key), &acme).await;
    assert_lists_exactly(&app.with_key(&globex_key), &globex).await;

    // A filter pages within the tenant too: one conversation's calls.
    let conversation = acme.sessions.iter().next().expect("a session");
    let (ids, _) = walk(
        &app.with_key(&acme_key),
        &format!("/v1/calls?conversation_id={conversation}"),
        "calls",
        "record_id",
        1,
    )
    .await;
    assert_eq!(ids.len(), 1, "one call per session");
    let (ids, _) = walk(
        &app.with_key(&globex_key),
        &format!("/v1/calls?conversation_id={conversation}"),
        "calls",
        "record_id",
        5,
    )
    .await;
    assert!(
        ids.is_empty(),
        "another tenant's conversation lists nothing"
    );

    // The defaults keep today's shape: count is the page's size.
    let (status, body) = app.with_key(&acme_key).get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["count"], 20);
    assert_eq!(body["next"], Value::Null);
    let (status, body) = app
        .with_key(&acme_key)
        .get(&format!("/v1/sessions?cursor={}", "x".repeat(129)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// Turns a data dir written by this build into one written before the
/// tenant indexes: their tables dropped, the schema version back to 1, the
/// documents' "indexed" flags gone. What is left is what a version 1 build
/// wrote (the same rows, the same encodings).
fn make_old_format(dir: &Path) {
    let db = redb::Database::open(dir.join("cadre.redb")).expect("open the file");
    let txn = db.begin_write().expect("write");
    assert!(
        txn.delete_table(tables::SESSIONS_BY_TENANT)
            .expect("dropped")
    );
    assert!(
        txn.delete_table(tables::TOOL_CALLS_BY_TENANT)
            .expect("dropped")
    );
    assert!(txn.delete_table(tables::DOCS_BY_TENANT).expect("dropped"));
    assert!(txn.delete_table(tables::DOC_TENANTS).expect("dropped"));
    {
        let mut meta = txn.open_table(tables::META).expect("meta");
        meta.insert("schema_version", 1).expect("version");
        let flags: Vec<String> = meta
            .iter()
            .expect("meta rows")
            .map(|r| r.expect("row").0.value().to_string())
            .filter(|k| k.starts_with("docs_indexed:"))
            .collect();
        for flag in flags {
            meta.remove(flag.as_str()).expect("flag removed");
        }
    }
    txn.commit().expect("commit");
    let read = db.begin_read().expect("read");
    assert!(
        read.open_table(tables::SESSIONS_BY_TENANT).is_err(),
        "no index left"
    );
}

#[tokio::test]
async fn rows_written_before_the_tenant_indexes_are_listed_after_the_migration() {
    if support::redb_only("the migration of a redb file written before the tenant indexes") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (acme_key, acme, globex_key, globex) = {
        let store = support::store::open_store(dir.path());
        let acme_key = create_key(&store, "acme").await;
        let globex_key = create_key(&store, "globex").await;
        let acme = hold(&store, "acme", 9).await;
        let globex = hold(&store, "globex", 4).await;
        (acme_key, acme, globex_key, globex)
    };
    make_old_format(dir.path());
    let mut app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    assert_lists_exactly(&app.with_key(&acme_key), &acme).await;
    assert_lists_exactly(&app.with_key(&globex_key), &globex).await;

    // Once: a restart finds the file migrated and lists the same.
    app.stop();
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    assert_lists_exactly(&app.with_key(&acme_key), &acme).await;
}

/// A cursor is an id cadre wrote: printable ASCII, at most 128 characters,
/// as the document says; anything else is a 422 on every listing (a
/// 100-character non-ASCII cursor is 200 bytes, once let through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_that_is_not_printable_ascii_is_refused_on_every_listing() {
    let app = support::spawn_app(support::AppOptions::offline());
    let accented = "%C3%A9".repeat(100);
    for path in [
        "/v1/sessions",
        "/v1/calls",
        "/v1/confirmations",
        "/v1/workflows/runs",
    ] {
        for cursor in ["%C3%A9", accented.as_str(), "a%20b"] {
            let (status, body) = app.get(&format!("{path}?cursor={cursor}")).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {body}");
            assert_eq!(body["error"]["code"], "VALIDATION_ERROR", "{path}: {body}");
        }
    }
}

/// The ids of every page of `path` (a query string included), in order.
async fn session_ids(client: &Client, path: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_string(),
        };
        let (status, body) = client.get(&url).await;
        assert_eq!(status, StatusCode::OK, "{url}: {body}");
        for s in body["sessions"].as_array().expect("sessions") {
            ids.push(s["id"].as_str().expect("id").to_string());
        }
        match body["next"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return ids,
        }
    }
}

#[tokio::test]
async fn sessions_are_listed_newest_first_and_filtered_by_agent_and_user() {
    let app = spawn_app(AppOptions::offline());
    let mut made = Vec::new();
    for (agent, user) in [
        ("assistant", Some("alice")),
        ("brokerage", Some("alice")),
        ("assistant", Some("bob")),
        ("assistant", None),
        ("assistant", Some("alice")),
    ] {
        let mut body = json!({ "agent": agent });
        if let Some(user) = user {
            body["user_id"] = json!(user);
        }
        let (status, session) = app.post("/v1/sessions", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{session}");
        made.push((session["id"].as_str().unwrap().to_string(), agent, user));
    }
    let all: Vec<String> = made.iter().map(|(id, ..)| id.clone()).collect();
    let newest: Vec<String> = all.iter().rev().cloned().collect();

    assert_eq!(session_ids(&app.client, "/v1/sessions?limit=2").await, all);
    assert_eq!(
        session_ids(&app.client, "/v1/sessions?order=newest&limit=2").await,
        newest
    );
    let alices_assistant: Vec<String> = made
        .iter()
        .filter(|(_, agent, user)| *agent == "assistant" && *user == Some("alice"))
        .map(|(id, ..)| id.clone())
        .collect();
    assert_eq!(alices_assistant.len(), 2);
    assert_eq!(
        session_ids(
            &app.client,
            "/v1/sessions?agent=assistant&user_id=alice&order=newest&limit=1"
        )
        .await,
        alices_assistant.iter().rev().cloned().collect::<Vec<_>>()
    );
    assert_eq!(
        session_ids(&app.client, "/v1/sessions?user_id=bob&order=oldest").await,
        [made[2].0.clone()]
    );
    assert_eq!(
        session_ids(&app.client, "/v1/sessions?agent=brokerage").await,
        [made[1].0.clone()]
    );
    assert!(
        session_ids(&app.client, "/v1/sessions?agent=nobody")
            .await
            .is_empty()
    );

    for bad in [
        "/v1/sessions?order=sideways",
        "/v1/sessions?user_id=not%20a%20user",
    ] {
        let (status, body) = app.get(bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "VALIDATION_ERROR", "{bad}: {body}");
    }
    let long = "a".repeat(129);
    let (status, body) = app.get(&format!("/v1/sessions?agent={long}")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}
