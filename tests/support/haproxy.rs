//! A real HAProxy in front of cadre nodes, for the cluster tests.
//!
//! client ──▶ HAProxy (127.0.0.1:<free port>) ──hash of /v1/sessions/<id>──▶ node0 | node1 | node2
//!                 │ GET /readyz every 200 ms          ▲
//!                 └── stats socket ◀── the test reads which server is UP or DOWN
//!
//! [`Haproxy::start`] writes a config generated from the backends' addresses
//! into a temp dir and runs `haproxy -db` (foreground) on it; dropping the
//! value kills the process. Decisions:
//! - **The routing is `deploy/haproxy.cfg`'s**: `balance uri path-only depth
//!   3` with `hash-type consistent`. `depth 3` stops the hash at the fourth
//!   slash (HAProxy counts `depth + 1` slashes, see `get_server_uh`), so the
//!   key of `/v1/sessions/<id>/messages` is `/v1/sessions/<id>`: every path
//!   of one session hashes alike, and `path-only` keeps the authority of an
//!   absolute URI (HTTP/2) out of the key. Only the timings differ from
//!   production: checks every 200 ms, down after 2 failures, up after 1.
//! - **Which node answered is HAProxy's word**: every response carries
//!   `X-Cadre-Backend: <server name>` (`srv_name`), so a test needs nothing
//!   from the nodes to know where a request went.
//! - **Retries only where they are safe**: `retry-on conn-failure
//!   empty-response response-timeout` with `retries 2` and `option
//!   redispatch`, but `http-request disable-l7-retry` for a request that
//!   may have changed something (a method other than GET, HEAD, OPTIONS,
//!   PUT, DELETE) and carries no `Idempotency-Key`: HAProxy replays a
//!   request it sent whatever its method, and a POST that reached a node
//!   which died before answering may have run its turn. A connection that
//!   failed never reached a node, so `conn-failure` retries every method.
//!   Clients retry the rest with their `Idempotency-Key`.
//! - **Failed authentications counted per client at the balancer**: the
//!   nodes see every client at HAProxy's address, so their own per-address
//!   budget (`[api_limit] failed_auth_burst`) would let one client's wrong
//!   keys block everyone. HAProxy counts 401 answers per client address
//!   (a stick table) and answers 429 once 10 came in a minute.
//! - **State is observed, not waited for**: [`Haproxy::server_state`] reads
//!   `show stat` from the admin socket; [`Haproxy::wait_up`] and
//!   [`Haproxy::wait_down`] poll it until the health check changed its mind.
//! - **Never skipped**: a machine without `haproxy` gets Debian's package
//!   when the tests run as root (as CI does); otherwise the test panics
//!   saying what to install.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The response header naming the server HAProxy sent the request to.
pub const BACKEND_HEADER: &str = "x-cadre-backend";

/// How the backend balances: the hash key is `/v1/sessions/<id>`.
pub const BALANCE: &str = "balance uri path-only depth 3";

/// A server's state in HAProxy's `show stat` (the `status` column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerState {
    /// `UP`, or `UP 1/2` (up, one failed check seen).
    Up,
    /// `DOWN`, or `DOWN 1/2` (down, one good check seen).
    Down,
    /// Anything else (`MAINT`, `no check`, `NOLB` ...), verbatim.
    Other(String),
}

pub struct Haproxy {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    socket: PathBuf,
    log: PathBuf,
    /// Holds the config, the socket and the log.
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts HAProxy on a free loopback port in front of `backends`
    /// (`(server name, "127.0.0.1:PORT")`); returns once it accepts
    /// connections and answers on its admin socket.
    pub fn start(backends: &[(String, String)]) -> Haproxy {
        ensure_installed("haproxy", "haproxy");
        // A free port can be taken between our probe and HAProxy's bind:
        // try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            match Self::try_start(backends) {
                Ok(h) => return h,
                Err(e) => last_error = e,
            }
        }
        panic!("HAProxy did not start: {last_error}");
    }

    fn try_start(backends: &[(String, String)]) -> Result<Haproxy, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let socket = dir.path().join("admin.sock");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config(port, &socket, backends)).expect("write haproxy.cfg");
        let log = dir.path().join("haproxy.log");
        let stderr = std::fs::File::create(&log).expect("create haproxy.log");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(stderr.try_clone().expect("dup log"))
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawn haproxy: {e}"))?;
        let mut haproxy = Haproxy {
            child,
            base: format!("http://127.0.0.1:{port}"),
            socket,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = haproxy.child.try_wait().expect("poll haproxy") {
                return Err(format!(
                    "haproxy exited ({status}):\n{}",
                    haproxy.log_text()
                ));
            }
            let listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if listening && haproxy.stat().is_ok() {
                return Ok(haproxy);
            }
            if Instant::now() > deadline {
                return Err(format!("not ready in 10 s:\n{}", haproxy.log_text()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`, the address clients use.
    pub fn addr(&self) -> &str {
        &self.base
    }

    /// A client of the cluster through HAProxy, presenting no key.
    pub fn client(&self) -> super::Client {
        super::Client::new(&self.base)
    }

    /// What HAProxy's health check thinks of server `name` now.
    pub fn server_state(&self, name: &str) -> ServerState {
        let stat = self
            .stat()
            .unwrap_or_else(|e| panic!("HAProxy's stats: {e}"));
        let mut lines = stat.lines();
        let header = lines.next().unwrap_or_default().trim_start_matches("# ");
        let column = |wanted: &str| {
            header
                .split(',')
                .position(|c| c == wanted)
                .unwrap_or_else(|| panic!("no column {wanted} in `show stat`: {header}"))
        };
        let (sv, status) = (column("svname"), column("status"));
        let row = lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.get(sv) == Some(&name))
            .unwrap_or_else(|| panic!("HAProxy has no server {name}:\n{stat}"));
        let status = row[status];
        match status.split(' ').next() {
            Some("UP") => ServerState::Up,
            Some("DOWN") => ServerState::Down,
            _ => ServerState::Other(status.to_string()),
        }
    }

    /// Returns once the health check marked `name` up; panics after `within`.
    pub fn wait_up(&self, name: &str, within: Duration) {
        self.wait_state(name, ServerState::Up, within);
    }

    /// Returns once the health check marked `name` down; panics after `within`.
    pub fn wait_down(&self, name: &str, within: Duration) {
        self.wait_state(name, ServerState::Down, within);
    }

    fn wait_state(&self, name: &str, wanted: ServerState, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let state = self.server_state(name);
            if state == wanted {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} is {state:?}, not {wanted:?}, after {within:?}; haproxy log:\n{}",
                self.log_text()
            );
            // The check runs every 200 ms: poll a few times per check.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `show stat` from the admin socket: CSV, one row per proxy and server.
    fn stat(&self) -> Result<String, String> {
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"show stat\n")
            .map_err(|e| e.to_string())?;
        let mut out = String::new();
        stream.read_to_string(&mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// HAProxy's own output (alerts and warnings).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test config: `deploy/haproxy.cfg`'s routing and retry rules with
/// test timings, listening on `port`, its admin socket at `socket`.
pub fn config(port: u16, socket: &Path, backends: &[(String, String)]) -> String {
    let servers: String = backends
        .iter()
        .map(|(name, addr)| format!("    server {name} {addr} check\n"))
        .collect();
    format!(
        "global
    nbthread 1
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 1s
    timeout client 5m
    timeout server 5m
    timeout tunnel 1h
    timeout check 1s

frontend cadre
    bind 127.0.0.1:{port}
    stick-table type ip size 1m expire 10m store gpc0_rate(1m)
    http-request track-sc0 src
    http-request deny deny_status 429 if {{ sc0_gpc0_rate ge 10 }}
    http-response sc-inc-gpc0(0) if {{ status 401 }}
    default_backend nodes

backend nodes
    {BALANCE}
    hash-type consistent
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server inter 200ms fall 2 rise 1
    retries 2
    option redispatch
    retry-on conn-failure empty-response response-timeout
    acl replay_safe method GET HEAD OPTIONS PUT DELETE
    acl keyed req.hdr(Idempotency-Key) -m found
    http-request disable-l7-retry unless replay_safe or keyed
    http-response set-header X-Cadre-Backend %[srv_name]
{servers}",
        socket = socket.display()
    )
}

pub use super::ports::free_port;

pub use super::packages::ensure_installed;
