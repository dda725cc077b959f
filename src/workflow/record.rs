//! A run's stored form: one document for the run, one row per map element.
//!
//! runner / engine ──ops(run, changed elements)──▶ store.write ──▶ table workflow_runs (the run, no elements)
//!                                                             └─▶ table workflow_items (one row per element)
//! engine ──load(id)──▶ the run document + its element rows ──▶ WorkflowRun (as served)
//!
//! Decision: per-element rows rather than batched rewrites of the run. A
//! run document rewritten for every element costs O(elements) per element
//! (quadratic: 1,000 elements took 2.6 s, 4,000 took 46 s, with a 10 MB
//! write per element at 100,000); batching the rewrites only divides that
//! by the batch size. An element's result is written as its own row
//! (`"<run id>/<node>/<index, 10 digits>"` in the store's `workflow_items`
//! table, namespace [`ITEMS_NAMESPACE`]), so an element costs one small
//! row whatever the run's size; the run document (nodes, outputs, no
//! elements) is written only when a node or the run changes. Runs stored
//! before per-element rows keep their elements inside the document: a
//! node with no rows keeps what the document says.

use serde_json::Value;

use super::run::{RUNS_NAMESPACE, WorkflowRun};
use crate::store::{Store, StoreError, WriteOp};

/// The store namespace of map elements' rows.
pub const ITEMS_NAMESPACE: &str = "workflow_items";

fn item_key(run: &str, node: &str, k: usize) -> String {
    format!("{run}/{node}/{k:010}")
}

/// The run document: the run without its map elements.
pub fn doc(run: &WorkflowRun) -> Value {
    let mut doc = serde_json::to_value(run).unwrap_or(Value::Null);
    if let Some(nodes) = doc.get_mut("nodes").and_then(Value::as_object_mut) {
        for node in nodes.values_mut() {
            if let Some(node) = node.as_object_mut() {
                node.remove("items");
            }
        }
    }
    doc
}

/// The webhook event of a run that ended, if it has a `webhook`: in the
/// write of its final document, once ([`crate::webhooks`]); a resumed run
/// that ends again sends another (its `resumes` tell them apart).
fn webhook_op(run: &WorkflowRun) -> Option<WriteOp> {
    let url = run.webhook.clone()?;
    if !run.status.is_terminal() {
        return None;
    }
    let status = run.status.as_str();
    let mut data = serde_json::json!({
        "run_id": run.id,
        "workflow": run.workflow,
        "status": status,
    });
    if let Some(output) = &run.output {
        data["output"] = output.clone();
    }
    if let Some(error) = &run.error {
        data["error"] = error.clone().into();
    }
    if let Some(user) = &run.user_id {
        data["user_id"] = user.clone().into();
    }
    Some(crate::webhooks::outbox_op(crate::webhooks::Event {
        tenant: run.tenant.clone(),
        url,
        event_type: format!("run.{status}"),
        session_id: None,
        turn_id: None,
        run_id: Some(run.id.clone()),
        distinct: run.resumes.to_string(),
        anchor: run.created_at,
        data,
    }))
}

/// The writes of `run`: its document when `with_doc`, and the rows of the
/// elements named in `items` (`(node, index)`).
pub fn ops(run: &WorkflowRun, with_doc: bool, items: &[(String, usize)]) -> Vec<WriteOp> {
    let mut ops = Vec::with_capacity(items.len() + 2);
    if with_doc {
        ops.push(WriteOp::PutDoc {
            namespace: RUNS_NAMESPACE.into(),
            key: run.id.clone(),
            value: doc(run),
            tenant: Some(run.tenant.clone()),
        });
        ops.extend(webhook_op(run));
    }
    for (node, k) in items {
        let Some(item) = run
            .nodes
            .get(node)
            .and_then(|n| n.items.as_ref())
            .and_then(|items| items.get(*k))
        else {
            continue;
        };
        let value = match serde_json::to_value(item) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(run = %run.id, %node, item = k, error = %e, "map element not serialisable");
                continue;
            }
        };
        ops.push(WriteOp::PutDoc {
            namespace: ITEMS_NAMESPACE.into(),
            key: item_key(&run.id, node, *k),
            value,
            tenant: None,
        });
    }
    ops
}

/// Every element of every map node of `run`.
pub fn all_items(run: &WorkflowRun) -> Vec<(String, usize)> {
    run.nodes
        .iter()
        .flat_map(|(id, n)| (0..n.items.as_ref().map_or(0, Vec::len)).map(move |k| (id.clone(), k)))
        .collect()
}

/// `ops` of a run as written by the node that claimed it at `epoch`
/// ([`crate::store::Ownership::claim_run`]): refused whole once another node took it over.
pub fn fenced(run_id: &str, epoch: u64, mut ops: Vec<WriteOp>) -> Vec<WriteOp> {
    ops.insert(
        0,
        WriteOp::FenceRun {
            run_id: run_id.to_string(),
            epoch,
        },
    );
    ops
}

/// Writes the whole run: its document and every element. Unfenced: for
/// the write that creates a run (which makes this node its owner).
pub async fn save(store: &Store, run: &WorkflowRun, durable: bool) -> Result<(), StoreError> {
    store.write(ops(run, true, &all_items(run)), durable).await
}

/// [`save`] of a run this node claimed at `epoch`.
pub async fn save_fenced(
    store: &Store,
    run: &WorkflowRun,
    epoch: u64,
    durable: bool,
) -> Result<(), StoreError> {
    let ops = fenced(&run.id, epoch, ops(run, true, &all_items(run)));
    store.write(ops, durable).await
}

/// Reads a run's document into a run; `None` when absent.
pub async fn load(store: &Store, id: &str) -> Result<Option<WorkflowRun>, StoreError> {
    let Some(doc) = store.get_doc(RUNS_NAMESPACE, id).await? else {
        return Ok(None);
    };
    let mut run: WorkflowRun = serde_json::from_value(doc)?;
    attach_items(store, &mut run).await?;
    Ok(Some(run))
}

/// Puts the stored element rows of `run` back into its map nodes.
pub async fn attach_items(store: &Store, run: &mut WorkflowRun) -> Result<(), StoreError> {
    let prefix = format!("{}/", run.id);
    for (key, value) in store.list_docs(ITEMS_NAMESPACE, &prefix).await? {
        let rest = &key[prefix.len()..];
        let Some((node, k)) = rest.rsplit_once('/') else {
            continue;
        };
        let (Some(n), Ok(k)) = (run.nodes.get_mut(node), k.parse::<usize>()) else {
            continue;
        };
        let item = serde_json::from_value(value)?;
        let items = n.items.get_or_insert_with(Vec::new);
        if items.len() <= k {
            items.resize(k + 1, super::run::ItemRun::pending());
        }
        items[k] = item;
    }
    Ok(())
}
