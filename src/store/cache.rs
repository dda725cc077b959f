//! The store's read cache: sessions and documents (tenant configs among
//! them) that every turn reads, kept after the first read so a turn does
//! not pay a blocking-thread hop and a read transaction for each.
//!
//! reader ──get──▶ cache ──miss──▶ redb read ──put (if no write raced it)──▶ cache
//! writer thread ──commit──▶ invalidate the keys it wrote (and bump the generation)
//!
//! Correctness rests on two rules. The writer invalidates every key a batch
//! touched after the commit and before any caller of the batch is answered,
//! so a read that starts after a write was acknowledged never sees the old
//! value. A reader that missed puts what it read only if no write touched
//! the cached tables meanwhile (a generation counter, checked and written
//! under one lock), so a value read before a commit cannot land in the
//! cache after that commit's invalidation. Absent documents are cached too
//! (most tenants have no config); absent sessions are not (unknown ids are
//! anyone's text). Bounded by entry count (moka, LRU/LFU); nothing expires
//! by time because every write goes through the one writer.

use std::sync::Mutex;

use serde_json::Value;

use super::{Session, WriteOp};

/// The sessions turns are running on: a resident conversation keeps its
/// own copy, so a larger cache only doubled what 100,000 idle sessions
/// hold (0.8 KB each).
const MAX_SESSIONS: u64 = 16_384;
const MAX_DOCS: u64 = 10_000;

pub(super) struct ReadCache {
    generation: Mutex<u64>,
    sessions: moka::sync::Cache<String, Session>,
    docs: moka::sync::Cache<(String, String), Option<Value>>,
}

impl ReadCache {
    pub(super) fn new() -> Self {
        ReadCache {
            generation: Mutex::new(0),
            sessions: moka::sync::Cache::new(MAX_SESSIONS),
            docs: moka::sync::Cache::new(MAX_DOCS),
        }
    }

    /// Taken before a read that may fill the cache.
    pub(super) fn generation(&self) -> u64 {
        *self.generation.lock().expect("cache lock")
    }

    pub(super) fn session(&self, id: &str) -> Option<Session> {
        self.sessions.get(id)
    }

    pub(super) fn put_session(&self, seen: u64, session: &Session) {
        let generation = self.generation.lock().expect("cache lock");
        if *generation == seen {
            self.sessions.insert(session.id.clone(), session.clone());
        }
    }

    pub(super) fn doc(&self, namespace: &str, key: &str) -> Option<Option<Value>> {
        self.docs.get(&(namespace.to_string(), key.to_string()))
    }

    pub(super) fn put_doc(&self, seen: u64, namespace: &str, key: &str, value: &Option<Value>) {
        let generation = self.generation.lock().expect("cache lock");
        if *generation == seen {
            self.docs
                .insert((namespace.to_string(), key.to_string()), value.clone());
        }
    }

    /// Forgets everything (the file went back to its last durable commit).
    pub(super) fn clear(&self) {
        let mut generation = self.generation.lock().expect("cache lock");
        self.sessions.invalidate_all();
        self.docs.invalidate_all();
        *generation += 1;
    }

    /// After a commit (or a failed one): forgets what `ops` wrote.
    pub(super) fn invalidate<'a>(&self, ops: impl Iterator<Item = &'a WriteOp>) {
        let mut generation = None;
        for op in ops {
            match op {
                WriteOp::PutSession(s) => {
                    generation.get_or_insert_with(|| self.generation.lock().expect("cache lock"));
                    self.sessions.invalidate(&s.id);
                }
                WriteOp::PutDoc { namespace, key, .. } | WriteOp::DeleteDoc { namespace, key } => {
                    generation.get_or_insert_with(|| self.generation.lock().expect("cache lock"));
                    self.docs.invalidate(&(namespace.clone(), key.clone()));
                }
                WriteOp::MoveDoc {
                    namespace,
                    key,
                    to_namespace,
                    ..
                } => {
                    generation.get_or_insert_with(|| self.generation.lock().expect("cache lock"));
                    self.docs.invalidate(&(namespace.clone(), key.clone()));
                    self.docs.invalidate(&(to_namespace.clone(), key.clone()));
                }
                WriteOp::PutDocsOnce { docs, .. } => {
                    generation.get_or_insert_with(|| self.generation.lock().expect("cache lock"));
                    for d in docs {
                        self.docs.invalidate(&(d.namespace.clone(), d.key.clone()));
                    }
                }
                WriteOp::DeleteSession { session_id, .. } => {
                    generation.get_or_insert_with(|| self.generation.lock().expect("cache lock"));
                    self.sessions.invalidate(session_id);
                    // Which documents went with it is known to the writer
                    // only; erasing is rare, so every document is forgotten.
                    self.docs.invalidate_all();
                }
                _ => {}
            }
        }
        if let Some(mut g) = generation {
            *g += 1;
        }
    }
}
