//! Documents on redb: which table a namespace's rows live in, and the
//! schema 3 move that put the store's own kinds there.
//!
//! writer (PutDoc · DeleteDoc · MoveDoc · IndexDocs · erase) ──▶ DocTables ──▶ DOCS (tools' namespaces)
//! readers (get_doc · list_docs · docs_of) ──▶ DocsRead ───────────────────└─▶ CONFIRMATIONS, WORKFLOW_RUNS ... (OWN_TABLES)
//!
//! A namespace with a table of its own ([`own_table`]) keys its rows by
//! the document key alone; every other namespace shares [`DOCS`], keyed by
//! (namespace, key). Callers never see the difference
//! ([`super::tables`] says why). The tenant index and the erase links stay
//! keyed by (namespace, key) for every namespace.

use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, Table, WriteTransaction};

use super::StoreError;
use super::tables::*;

type Shared<'t> = Table<'t, (&'static str, &'static str), &'static [u8]>;
type Own<'t> = Table<'t, &'static str, &'static [u8]>;

/// Every document table of one write transaction, each opened when first
/// touched (a turn's commit touches none of them).
pub(super) struct DocTables<'t> {
    txn: &'t WriteTransaction,
    shared: Option<Shared<'t>>,
    own: Vec<(&'static str, Own<'t>)>,
}

impl<'t> DocTables<'t> {
    pub(super) fn new(txn: &'t WriteTransaction) -> Self {
        DocTables {
            txn,
            shared: None,
            own: Vec::new(),
        }
    }

    fn shared(&mut self) -> Result<&mut Shared<'t>, StoreError> {
        if self.shared.is_none() {
            self.shared = Some(self.txn.open_table(DOCS)?);
        }
        Ok(self.shared.as_mut().expect("opened above"))
    }

    /// The table of its own `namespace` has, opened; `None` when it shares
    /// [`DOCS`].
    fn own(&mut self, namespace: &str) -> Result<Option<&mut Own<'t>>, StoreError> {
        let Some(t) = own_table(namespace) else {
            return Ok(None);
        };
        let at = match self.own.iter().position(|(ns, _)| *ns == t.namespace) {
            Some(at) => at,
            None => {
                self.own.push((t.namespace, self.txn.open_table(t.table)?));
                self.own.len() - 1
            }
        };
        Ok(Some(&mut self.own[at].1))
    }

    pub(super) fn insert(
        &mut self,
        namespace: &str,
        key: &str,
        value: &[u8],
    ) -> Result<(), StoreError> {
        match self.own(namespace)? {
            Some(t) => t.insert(key, value)?,
            None => self.shared()?.insert((namespace, key), value)?,
        };
        Ok(())
    }

    /// Whether a document is there.
    pub(super) fn contains(&mut self, namespace: &str, key: &str) -> Result<bool, StoreError> {
        Ok(match self.own(namespace)? {
            Some(t) => t.get(key)?.is_some(),
            None => self.shared()?.get((namespace, key))?.is_some(),
        })
    }

    /// Removes a document; its bytes when it was there.
    pub(super) fn remove(
        &mut self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let old = match self.own(namespace)? {
            Some(t) => t.remove(key)?.map(|v| v.value().to_vec()),
            None => self
                .shared()?
                .remove((namespace, key))?
                .map(|v| v.value().to_vec()),
        };
        Ok(old)
    }

    /// Every document of `namespace` whose key starts with `prefix`, by key.
    pub(super) fn with_prefix(
        &mut self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self.own(namespace)? {
            Some(t) => own_prefix(t, prefix),
            None => shared_prefix(self.shared()?, namespace, prefix),
        }
    }
}

/// The one table a read of `namespace` needs, open in a read transaction.
pub(super) enum DocsRead {
    Shared(ReadOnlyTable<(&'static str, &'static str), &'static [u8]>),
    Own(ReadOnlyTable<&'static str, &'static [u8]>),
}

impl DocsRead {
    pub(super) fn open(txn: &ReadTransaction, namespace: &str) -> Result<Self, StoreError> {
        Ok(match own_table(namespace) {
            Some(t) => DocsRead::Own(txn.open_table(t.table)?),
            None => DocsRead::Shared(txn.open_table(DOCS)?),
        })
    }

    pub(super) fn get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(match self {
            DocsRead::Own(t) => t.get(key)?.map(|v| v.value().to_vec()),
            DocsRead::Shared(t) => t.get((namespace, key))?.map(|v| v.value().to_vec()),
        })
    }

    pub(super) fn with_prefix(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self {
            DocsRead::Own(t) => own_prefix(t, prefix),
            DocsRead::Shared(t) => shared_prefix(t, namespace, prefix),
        }
    }
}

fn own_prefix(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    for row in t.range(prefix..)? {
        let (k, v) = row?;
        if !k.value().starts_with(prefix) {
            break;
        }
        out.push((k.value().to_string(), v.value().to_vec()));
    }
    Ok(out)
}

fn shared_prefix(
    t: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    namespace: &str,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    for row in t.range((namespace, prefix)..)? {
        let (k, v) = row?;
        let (ns, key) = k.value();
        if ns != namespace || !key.starts_with(prefix) {
            break;
        }
        out.push((key.to_string(), v.value().to_vec()));
    }
    Ok(out)
}

/// Schema 2 -> 3: moves the rows of every namespace of [`OWN_TABLES`] out
/// of [`DOCS`] into its table, in the opening transaction (all or
/// nothing); how many. Index and erase-link rows are keyed by namespace
/// and stay as they are. Idempotent: a namespace with no rows left in
/// `DOCS` moves nothing.
pub(super) fn migrate_v2(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let mut docs = txn.open_table(DOCS)?;
    let mut moved = 0;
    for t in &OWN_TABLES {
        let rows = shared_prefix(&docs, t.namespace, "")?;
        let mut own = txn.open_table(t.table)?;
        for (key, value) in &rows {
            own.insert(key.as_str(), value.as_slice())?;
            docs.remove((t.namespace, key.as_str()))?;
        }
        moved += rows.len() as u64;
    }
    Ok(moved)
}
