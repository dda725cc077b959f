//! PostgreSQL store: the redb store's contract on PostgreSQL, for cluster
//! mode (several nodes on one database).
//!
//! conversation / executor ──write(ops, durable)──▶ writer task ──▶ one transaction, a SAVEPOINT per request
//!                          ◀──────── Ok once committed ──────────┘
//! http / conversation ──read──▶ a pooled connection ──▶ one query (or two)
//! runtime ──heartbeat / claim_session / release_session──▶ nodes, sessions(owner, epoch)
//!
//! Same methods, same semantics as the redb store ([`crate::store::Store`]); the
//! tables ([`schema`]) are real tables with real keys, every key `COLLATE
//! "C"` so pages and cursors come out in redb's byte order.
//!
//! Decisions:
//! - Its own tokio runtime on its own thread ("cadre-store-pg", two
//!   workers). Every query runs there: a pooled connection's driver task
//!   lives on the runtime that opened it, and cadre's callers run on many
//!   (actix arbiters, tests' runtimes) that may stop before the pool does.
//!   A call costs one hop between runtimes. [`PgStore::open`] is sync like
//!   [`crate::store::Store::open`]: it waits for that thread to connect and migrate.
//! - Pool: deadpool-postgres (in the cluster dependencies already; the
//!   field's pool for tokio-postgres, with `Fast` recycling and timeouts on
//!   waiting for and creating a connection, so an unreachable database
//!   shows as [`StoreHealth::Degraded`] within [`CONNECT_TIMEOUT`] instead
//!   of a hang). No TLS: the database is on the private network of the
//!   nodes (no TLS crate is pinned for it).
//! - Writes ([`writer`]): one writer task per node keeps the redb writer's
//!   contract: group commit of what is queued, durable when any request
//!   asks, write-behind held up to [`crate::store::HOLD_BEHIND`] and in order. A
//!   batch without a durable request commits with `SET LOCAL
//!   synchronous_commit = off`: the commit returns before its WAL is
//!   flushed, so a crash *of PostgreSQL* (not of cadre) may lose the last
//!   few hundred milliseconds of such commits, never part of one; the
//!   next durable commit flushes them too, as with redb.
//! - Each request of a batch runs in its own SAVEPOINT: a fenced request
//!   (its [`WriteOp::Fence`] epoch is stale, or its messages meet a seq
//!   already written) is rolled back alone with [`StoreError::Fenced`];
//!   the rest of the batch commits.
//! - Generation: PostgreSQL is never reopened, so it stays 0; `write_at`
//!   with another generation is refused like redb refuses a stale one.
//! - Late writes under an erased session are dropped by the writer
//!   ([`crate::store::erase::ErasedIds`]), as redb does; across nodes the epoch
//!   fence does it (an erased session has no row to match).
//! - Ownership ([`ownership`]) compares heartbeats with the database's
//!   clock (`now()`), never a node's.
//! - Key columns cannot hold NUL (PostgreSQL's `text`): the values of
//!   untrusted text a call record is keyed by (its tool name, ids) are
//!   stored with NUL as U+FFFD ([`column`]), as are the filters that read
//!   them; bodies (`json`) keep every text as sent.
//! - `docs.session_id` is the erase link: [`WriteOp::LinkDoc`] of a
//!   document not written yet links nothing (redb keeps the link row; every
//!   caller writes the document first).

mod docs;
mod idempotency;
mod import;
mod ownership;
mod reads;
mod schema;
mod tls;
mod writer;

use crate::store::backend::Writes;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use jiff::Timestamp;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::store::{NodeIdentity, Store, StoreError, StoreHealth, WriteOp};
pub use import::{IMPORT_NODE, Imported};

/// Longest a caller waits for a pooled connection, or for a new one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Connections per node.
pub const POOL_SIZE: usize = 16;
/// The suggested [`NodeIdentity::stale_after`]: a node whose heartbeat is
/// older than this (by the database's clock) is dead, its sessions may be
/// taken over.
pub const NODE_STALE_AFTER: Duration = Duration::from_secs(10);

/// The setting that names the database, for error messages.
pub const SETTING: &str = "--store / [cluster] store";
/// How the store's errors name this backend.
const BACKEND: &str = "PostgreSQL";

/// Connects to the PostgreSQL database at `url` as `node`, applies its
/// migrations and starts its writer: the [`Store`] of cluster mode. An
/// unreachable database is an error naming `--store` / `[cluster] store`
/// and the URL without its password.
pub fn open_store(url: &str, node: NodeIdentity) -> Result<Store, StoreError> {
    Ok(Store::with_backend(PgStore::open(url, node)?))
}

/// The driver's errors reach the store's callers as the store's own.
impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Backend {
            backend: BACKEND,
            source: Box::new(e),
        }
    }
}

/// The driver's error inside `e`, if `e` is one.
fn driver_error(e: &StoreError) -> Option<&tokio_postgres::Error> {
    match e {
        StoreError::Backend { source, .. } => source.downcast_ref(),
        _ => None,
    }
}

/// What every task of the store shares.
pub(crate) struct Shared {
    pool: Pool,
    node: NodeIdentity,
    /// `Some` while the database cannot be reached.
    outage: Mutex<Option<(Timestamp, Arc<str>)>>,
    /// Set at shutdown: only flushes pass.
    closed: AtomicBool,
    commit_latency: Arc<crate::metrics::Histogram>,
}

impl Shared {
    /// A pooled connection; the outage starts or ends with the answer.
    async fn client(&self) -> Result<Object, StoreError> {
        match self.pool.get().await {
            Ok(c) => {
                self.set_outage(None);
                Ok(c)
            }
            Err(e) => Err(self.unavailable(&e.to_string())),
        }
    }

    fn outage(&self) -> Option<(Timestamp, Arc<str>)> {
        self.outage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_outage(&self, outage: Option<(Timestamp, Arc<str>)>) {
        let mut slot = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        match (&*slot, outage) {
            (Some(_), None) => {
                tracing::info!("PostgreSQL is reachable again");
                *slot = None;
            }
            (None, Some(o)) => {
                tracing::error!(reason = %o.1, "PostgreSQL is unreachable");
                *slot = Some(o);
            }
            _ => {}
        }
    }

    /// Records the outage (if new) and returns the refusal to send.
    fn unavailable(&self, reason: &str) -> StoreError {
        self.set_outage(Some((Timestamp::now(), reason.into())));
        let (since, reason) = self.outage().unwrap_or((Timestamp::now(), reason.into()));
        StoreError::Unavailable { since, reason }
    }
}

/// Cheap to clone; every clone talks to the same pool and writer task.
/// When the last clone drops, the writer finishes what is queued and the
/// store's thread ends before the drop returns.
#[derive(Clone)]
pub struct PgStore {
    shared: Arc<Shared>,
    handle: Handle,
    inner: Arc<Inner>,
}

struct Inner {
    writer: Option<mpsc::UnboundedSender<writer::Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.writer.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl PgStore {
    /// Connects to `url`, applies the migrations ([`schema`]) and starts the
    /// writer. An unreachable database is an error naming the setting and
    /// the URL without its password.
    pub fn open(url: &str, node: NodeIdentity) -> Result<PgStore, StoreError> {
        let unreachable = |reason: String| StoreError::Unreachable {
            backend: BACKEND,
            url: redact(url),
            setting: SETTING,
            reason,
        };
        let (parsed, root) = tls::prepare(url);
        let mut config: tokio_postgres::Config = parsed
            .parse()
            .map_err(|e: tokio_postgres::Error| unreachable(e.to_string()))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name(format!("cadre {}", node.id));
        }
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls::connector(&config, root.as_deref()).map_err(unreachable)? {
            Some(tls) => Manager::from_config(config, tls, manager_config),
            None => Manager::from_config(config, tokio_postgres::NoTls, manager_config),
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (tx, rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("cadre-store-pg".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("cadre-store-pg-io")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let pool = match Pool::builder(manager)
                        .max_size(POOL_SIZE)
                        .runtime(Runtime::Tokio1)
                        .wait_timeout(Some(CONNECT_TIMEOUT))
                        .create_timeout(Some(CONNECT_TIMEOUT))
                        .recycle_timeout(Some(CONNECT_TIMEOUT))
                        .build()
                    {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    if let Err(e) = schema::migrate(&pool).await {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    if let Err(e) = idempotency::forget_marks(&pool, &node.id).await {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    let shared = Arc::new(Shared {
                        pool,
                        node,
                        outage: Mutex::new(None),
                        closed: AtomicBool::new(false),
                        commit_latency: Arc::new(crate::metrics::Histogram::default()),
                    });
                    let _ = ready_tx.send(Ok((shared.clone(), Handle::current())));
                    writer::Writer::new(shared).run(rx).await;
                });
            })
            .map_err(|e| unreachable(e.to_string()))?;
        let (shared, handle) = match ready_rx.recv() {
            Ok(Ok(ready)) => ready,
            Ok(Err(reason)) => {
                let _ = thread.join();
                return Err(unreachable(reason));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(unreachable("the store thread stopped".into()));
            }
        };
        Ok(PgStore {
            shared,
            handle,
            inner: Arc::new(Inner {
                writer: Some(tx),
                thread: Some(thread),
            }),
        })
    }

    /// The node this store writes as.
    pub fn node(&self) -> &NodeIdentity {
        &self.shared.node
    }

    async fn send(
        &self,
        ops: Vec<WriteOp>,
        durable: bool,
        generation: Option<u64>,
    ) -> Result<(), StoreError> {
        let (done, rx) = oneshot::channel();
        let writer = self.inner.writer.as_ref().ok_or(StoreError::WriterGone)?;
        writer
            .send(writer::Request {
                ops,
                durable,
                generation,
                behind: false,
                done,
            })
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    fn send_behind(&self, ops: Vec<WriteOp>, generation: Option<u64>) {
        if ops.is_empty() {
            return;
        }
        let (done, _) = oneshot::channel();
        if let Some(writer) = self.inner.writer.as_ref() {
            let _ = writer.send(writer::Request {
                ops,
                durable: false,
                generation,
                behind: true,
                done,
            });
        }
    }

    /// Runs `f` with a pooled connection on the store's runtime.
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Object, Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let shared = self.shared.clone();
        self.handle
            .spawn(async move {
                let client = shared.client().await?;
                f(client, shared).await
            })
            .await
            .map_err(|_| StoreError::WriterGone)?
    }
}

#[async_trait::async_trait]
impl Writes for PgStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// No file: an empty path (what the facade's `path` gives for PostgreSQL).
    fn path(&self) -> &std::path::Path {
        std::path::Path::new("")
    }

    /// How long the writer's commits take (each may carry many callers' writes).
    fn commit_latency(&self) -> &crate::metrics::Histogram {
        &self.shared.commit_latency
    }

    /// Whether the database was reachable at the last attempt (a write, a
    /// read, a heartbeat).
    fn health(&self) -> StoreHealth {
        match self.shared.outage() {
            None => StoreHealth::Ok,
            Some((since, reason)) => StoreHealth::Degraded {
                since,
                reason: reason.to_string(),
            },
        }
    }

    /// Refuses every later write with [`StoreError::Closed`]; flushes still pass.
    fn close_writes(&self) {
        self.shared.closed.store(true, Ordering::Release);
    }

    /// Always 0: PostgreSQL is never reopened under the store.
    fn generation(&self) -> u64 {
        0
    }

    /// Applies `ops` in one transaction (possibly shared with other
    /// callers'); with `durable`, returns once the commit is flushed.
    async fn write(&self, ops: Vec<WriteOp>, durable: bool) -> Result<(), StoreError> {
        self.send(ops, durable, None).await
    }

    /// [`Self::write`], refused with [`StoreError::Reopened`] unless
    /// `generation` is 0 (see [`Self::generation`]).
    async fn write_at(
        &self,
        generation: u64,
        ops: Vec<WriteOp>,
        durable: bool,
    ) -> Result<(), StoreError> {
        self.send(ops, durable, Some(generation)).await
    }

    /// Queues `ops` for the next commit without waiting (see
    /// [`super::Writes::write_behind`]): applied in the order sent.
    fn write_behind(&self, ops: Vec<WriteOp>) {
        self.send_behind(ops, None);
    }

    /// [`Self::write_behind`], refused unless `generation` is 0.
    fn write_behind_at(&self, generation: u64, ops: Vec<WriteOp>) {
        self.send_behind(ops, Some(generation));
    }
}

/// A text column's value: PostgreSQL's `text` cannot hold NUL, which
/// untrusted text may (a tool name a model made up), so NUL becomes U+FFFD
/// in key columns, here and in the filters that read them; the row's JSON
/// body keeps the text as sent.
pub(crate) fn column(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// `url` without its password (URL form `postgres://user:pw@host/db` and
/// key-value form `password=...`).
/// An error and its causes, `: `-joined (tokio-postgres' own text hides
/// why a TLS handshake failed: the certificate's problem is its source).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        let authority = match authority.rsplit_once('@') {
            Some((user, host)) => {
                let user = user.split_once(':').map_or(user, |(u, _)| u);
                format!("{user}@{host}")
            }
            None => authority.to_string(),
        };
        let tail = tail
            .split('&')
            .map(|p| {
                let (head, kv) = p.rsplit_once('?').map_or(("", p), |(h, kv)| (h, kv));
                if kv.starts_with("password=") {
                    format!(
                        "{head}{}password=***",
                        if head.is_empty() { "" } else { "?" }
                    )
                } else {
                    p.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("&");
        return format!("{scheme}://{authority}{tail}");
    }
    url.split_whitespace()
        .map(|kv| {
            if kv.starts_with("password=") {
                "password=***"
            } else {
                kv
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn urls_in_errors_carry_no_password() {
        assert_eq!(
            redact("postgres://cadre:s3cret@db:5432/cadre"),
            "postgres://cadre@db:5432/cadre"
        );
        assert_eq!(
            redact("postgres://cadre@db/cadre?password=s3cret&sslmode=disable"),
            "postgres://cadre@db/cadre?password=***&sslmode=disable"
        );
        assert_eq!(
            redact("host=db user=cadre password=s3cret"),
            "host=db user=cadre password=***"
        );
    }
}
