//! Connections: the accept loop in front of the router, and the limits that
//! keep one client's sockets from starving everyone else (slowloris).
//!
//! listener ──accept──▶ [`Connections::admit`] (per address · total) ──▶ hyper (HTTP/1.1, h2) ──▶ router
//!                            │ over a cap: close the oldest idle connection   │ request in flight ·
//!                            │ (of that address, or of all); none idle:       │ response body done
//!                            └─▶ refuse the new one                           └─▶ the connection's clock
//!
//! What a connection may hold, and for how long ([`ConnectionLimits`],
//! `[server]` in the config):
//! - **Header read timeout** (`header_read_timeout_s`, 10 s): a connection
//!   must deliver a complete request head this long after it opened, or it
//!   is closed. This is our own clock, not only hyper's: hyper's timer
//!   starts with the first byte it parses, and the HTTP/1-or-2 detection in
//!   front of it waits for bytes without one, so a socket that sends nothing
//!   would stay open. hyper's `header_read_timeout` is set too: it bounds
//!   every later request head on a kept-alive connection.
//! - **Idle keep-alive timeout** (`idle_timeout_s`, 5 s): a connection with
//!   no request in flight closes this long after its last response ended.
//!   hyper's head timer also runs while a kept-alive connection waits, so
//!   this may not exceed the header timeout (the config refuses it).
//! - **Caps** (`max_connections`, `max_connections_per_address`): counted
//!   per client address (IPv6 by /64, as [`super::auth_limit`] does) and in
//!   total. The total is kept below the process's open-files limit, which
//!   [`raise_open_files_limit`] raises from the soft to the hard limit at
//!   startup, leaving [`RESERVED_FILES`] for the store, logs, outbound HTTP
//!   and MCP children; so `accept` never fails with EMFILE.
//!
//! Decisions:
//! - **Who is dropped at a cap.** The connection with nothing in flight
//!   (idle or still unfinished: no complete request head yet) whose clock
//!   is oldest, among the same address's connections at the per-address
//!   cap and among all at the total cap. A connection with a request in
//!   flight, or a streaming response (SSE), is never dropped for a
//!   newcomer: when every connection is busy the newcomer is refused
//!   (closed at once). An attacker's idle sockets therefore make room for
//!   anyone's new connection, including the attacker's own next one, and
//!   never for itself at the expense of a request being served.
//! - **No Nagle** (`TCP_NODELAY`) on every accepted socket: responses are
//!   written whole or streamed in frames that must leave at once (SSE
//!   deltas, WebSocket frames); with Nagle a small write waits for the
//!   previous one's ACK, which the client delays up to 40 ms.
//! - **The clock** of a connection is its accept time, then the end of its
//!   last response; "oldest" compares these. Finding the oldest is a scan
//!   of the table (at most `max_connections` entries), done only when a cap
//!   is reached.
//! - **Upgraded connections** (WebSockets) leave the table once hyper hands
//!   the socket to the WebSocket handler: from then on they are bounded by
//!   the per-caller stream cap (`api_limit.max_streams`, [`super::streams`]).
//! - **Shutdown**: the listener closes, every connection is asked to finish
//!   (hyper's graceful shutdown: in-flight requests complete, idle ones
//!   close), and [`serve`] returns once all have; the caller bounds that
//!   wait with the shutdown grace.
//! - **Own accept loop** rather than `axum::serve`, which has no
//!   per-connection hook for these limits; it is hyper-util's documented
//!   server recipe (`auto::Builder`, `TowerToHyperService`), and it puts
//!   `ConnectInfo<SocketAddr>` on every request as axum's
//!   `into_make_service_with_connect_info` did.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;

use super::client_addr::TrustedProxies;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::auth_limit::client_of;

/// Open files kept out of the connection cap: the store, logs, outbound
/// HTTP (model, tools), MCP children and the listener itself.
pub const RESERVED_FILES: u64 = 128;

/// How long connections may take and how many may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From accept to a complete request head.
    pub header_read_timeout: Duration,
    /// From the end of a response to the next request head.
    pub idle_timeout: Duration,
    /// Open connections in total.
    pub max_connections: usize,
    /// Open connections of one client address.
    pub max_per_address: usize,
}

impl ConnectionLimits {
    /// These limits with the total kept below an open-files limit of
    /// `open_files` (`None`: unknown, left as configured).
    pub fn within_open_files(self, open_files: Option<u64>) -> ConnectionLimits {
        let Some(limit) = open_files else {
            return self;
        };
        let room = limit.saturating_sub(RESERVED_FILES).max(limit / 2).max(1);
        let max_connections = self
            .max_connections
            .min(usize::try_from(room).unwrap_or(usize::MAX));
        ConnectionLimits {
            max_connections,
            max_per_address: self.max_per_address.min(max_connections),
            ..self
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit and
/// returns the soft limit now in force (`None` where it cannot be read).
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write `limit`.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        if limit.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        // `rlim_t` is u64 on Linux, not on every unix.
        #[allow(clippy::unnecessary_cast)]
        Some(limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The open connections: who they belong to and whether they are busy.
/// Clones share the table.
#[derive(Clone)]
pub struct Connections {
    limits: ConnectionLimits,
    /// Whose `X-Forwarded-For` names the client ([`super::client_addr`]).
    trusted: TrustedProxies,
    // A std mutex: held for a few map operations, never across an await.
    table: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Entry>,
    per_address: HashMap<Option<IpAddr>, usize>,
}

struct Entry {
    address: Option<IpAddr>,
    /// Requests whose response has not finished.
    in_flight: usize,
    /// Whether a request head ever arrived (then the idle timeout applies).
    served: bool,
    /// Accept time, then the end of the last response.
    since: Instant,
    /// Cancelled to close the connection (dropped for a newcomer).
    close: CancellationToken,
    /// Woken when `in_flight` or `since` change.
    changed: Arc<Notify>,
}

impl Entry {
    fn idle(&self) -> bool {
        self.in_flight == 0
    }
}

/// One admitted connection: its id, and the token that closes it.
struct Admitted {
    id: u64,
    close: CancellationToken,
    changed: Arc<Notify>,
}

impl Connections {
    pub fn new(limits: ConnectionLimits) -> Connections {
        Connections {
            limits,
            trusted: TrustedProxies::default(),
            table: Arc::default(),
        }
    }

    /// Requests from these proxies count as the client their
    /// `X-Forwarded-For` names (`[server] trusted_proxies`).
    pub fn trusting(mut self, proxies: TrustedProxies) -> Connections {
        self.trusted = proxies;
        self
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for a connection from `peer` (closing the oldest idle one
    /// over a cap) and registers it, or `None`: refuse it.
    fn admit(&self, peer: IpAddr) -> Option<Admitted> {
        let address = client_of(peer);
        let mut table = self.lock();
        let of_address = table.per_address.get(&address).copied().unwrap_or(0);
        if of_address >= self.limits.max_per_address
            && !table.drop_oldest_idle(|e| e.address == address)
        {
            return None;
        }
        if table.open.len() >= self.limits.max_connections && !table.drop_oldest_idle(|_| true) {
            return None;
        }
        table.next_id += 1;
        let id = table.next_id;
        let close = CancellationToken::new();
        let changed = Arc::new(Notify::new());
        table.open.insert(
            id,
            Entry {
                address,
                in_flight: 0,
                served: false,
                since: Instant::now(),
                close: close.clone(),
                changed: changed.clone(),
            },
        );
        *table.per_address.entry(address).or_default() += 1;
        Some(Admitted { id, close, changed })
    }

    /// A request arrived on `id`: busy until the guard drops.
    fn begin(&self, id: u64) -> InFlight {
        if let Some(e) = self.lock().open.get_mut(&id) {
            e.in_flight += 1;
            e.served = true;
            e.changed.notify_one();
        }
        InFlight {
            connections: self.clone(),
            id,
        }
    }

    fn end(&self, id: u64) {
        if let Some(e) = self.lock().open.get_mut(&id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.since = Instant::now();
            e.changed.notify_one();
        }
    }

    fn remove(&self, id: u64) {
        self.lock().remove(id);
    }

    /// When `id` has nothing in flight: the moment it expires; `None`
    /// while busy. `Err` once it left the table.
    fn deadline(&self, id: u64) -> Result<Option<Instant>, ()> {
        let table = self.lock();
        let e = table.open.get(&id).ok_or(())?;
        if !e.idle() {
            return Ok(None);
        }
        let allowed = if e.served {
            self.limits.idle_timeout
        } else {
            self.limits.header_read_timeout
        };
        Ok(Some(e.since + allowed))
    }

    /// Resolves when `id` has been idle (or unfinished) for its timeout.
    async fn expired(&self, id: u64, changed: Arc<Notify>) {
        loop {
            let notified = changed.notified();
            match self.deadline(id) {
                Err(()) => return,
                Ok(None) => notified.await,
                Ok(Some(at)) if at <= Instant::now() => return,
                Ok(Some(at)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = notified => {}
                    }
                }
            }
        }
    }
}

impl Table {
    /// Closes the idle connection with the oldest clock among those
    /// `eligible`; false when there is none.
    fn drop_oldest_idle(&mut self, eligible: impl Fn(&Entry) -> bool) -> bool {
        let oldest = self
            .open
            .iter()
            .filter(|(_, e)| e.idle() && eligible(e))
            .min_by_key(|(_, e)| e.since)
            .map(|(id, _)| *id);
        match oldest {
            Some(id) => {
                if let Some(e) = self.remove(id) {
                    e.close.cancel();
                }
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.open.remove(&id)?;
        if let Some(n) = self.per_address.get_mut(&e.address) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&e.address);
            }
        }
        Some(e)
    }
}

/// A request in flight on a connection; its drop (when the response body
/// is done or dropped) restarts the connection's idle clock.
struct InFlight {
    connections: Connections,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.connections.end(self.id);
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves,
/// then lets open connections finish their requests and returns once they
/// have (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    connections: Connections,
    shutdown: impl Future<Output = ()>,
) {
    let limits = connections.limits;
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of files or memory: back off rather than spin.
                    tracing::error!(error = %e, "accept error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(admitted) = connections.admit(peer.ip()) else {
            tracing::debug!(%peer, "connection refused: at the connection cap and none idle");
            drop(stream);
            continue;
        };
        tasks.spawn(serve_connection(
            stream,
            peer,
            app.clone(),
            connections.clone(),
            admitted,
            limits,
            stop.clone(),
        ));
    }
    drop(listener);
    stop.cancel();
    tasks.close();
    tasks.wait().await;
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    connections: Connections,
    admitted: Admitted,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let Admitted { id, close, changed } = admitted;
    // No Nagle: a streamed reply is many small writes (SSE deltas,
    // WebSocket frames), and Nagle holds each one back while the previous
    // is unacknowledged, which meets the client's delayed ACK: deltas 2 ms
    // apart arrived 40 ms late at p99 (`cargo bench --bench sse_latency`).
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
    }
    let tracking = connections.clone();
    let service = tower::service_fn(move |mut request: hyper::Request<Incoming>| {
        let in_flight = tracking.begin(id);
        let client = tracking.trusted.client(peer, request.headers());
        request.extensions_mut().insert(ConnectInfo(client));
        let app = app.clone();
        async move {
            let response = app.oneshot(request.map(Body::new)).await?;
            // The guard lives as long as the body: a streamed response keeps
            // the connection busy until its last frame.
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(conn);
    let expired = connections.expired(id, changed);
    tokio::pin!(expired);
    let mut finishing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                break;
            }
            _ = close.cancelled() => {
                tracing::debug!(%peer, "connection dropped for a newcomer at the connection cap");
                break;
            }
            _ = &mut expired => {
                tracing::debug!(%peer, "connection closed: header read or idle timeout");
                break;
            }
            _ = stop.cancelled(), if !finishing => {
                finishing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    connections.remove(id);
}

/// Errors of one connection that `accept` reports (the peer gave up before
/// it was accepted); the listener is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            max_connections: total,
            max_per_address: per_address,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test(start_paused = true)]
    async fn at_the_address_cap_the_oldest_idle_connection_of_that_address_goes() {
        let c = Connections::new(limits(10, 2));
        let first = c.admit(A).unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        let second = c.admit(A).unwrap();
        let other = c.admit(B).unwrap();
        let third = c.admit(A).unwrap();
        assert!(first.close.is_cancelled());
        assert!(!second.close.is_cancelled());
        assert!(!other.close.is_cancelled());
        assert!(!third.close.is_cancelled());
        assert_eq!(c.open(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn busy_connections_are_never_dropped_and_the_newcomer_is_refused() {
        let c = Connections::new(limits(2, 2));
        let a = c.admit(A).unwrap();
        let b = c.admit(B).unwrap();
        let _busy_a = c.begin(a.id);
        let _busy_b = c.begin(b.id);
        assert!(c.admit(A).is_none());
        assert!(c.admit(B).is_none());
        drop(_busy_b);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(c.admit(A).is_some(), "B's idle connection makes room");
        assert!(b.close.is_cancelled());
        assert!(!a.close.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unfinished_connection_expires_after_the_header_timeout_an_idle_one_after_the_idle_timeout()
     {
        let c = Connections::new(limits(10, 10));
        let fresh = c.admit(A).unwrap();
        let start = Instant::now();
        c.expired(fresh.id, fresh.changed.clone()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));

        let used = c.admit(A).unwrap();
        drop(c.begin(used.id));
        let start = Instant::now();
        c.expired(used.id, used.changed.clone()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[test]
    fn the_total_stays_below_the_open_files_limit() {
        let l = limits(4096, 256).within_open_files(Some(1024));
        assert_eq!(l.max_connections, 1024 - RESERVED_FILES as usize);
        assert_eq!(l.max_per_address, 256);
        let l = limits(4096, 256).within_open_files(Some(100));
        assert_eq!(l.max_connections, 50);
        assert_eq!(l.max_per_address, 50);
        assert_eq!(
            limits(4096, 256).within_open_files(None).max_connections,
            4096
        );
    }
}
