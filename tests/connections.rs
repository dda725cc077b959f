//! Hostile connections against the real `cadre serve` binary, on loopback:
//! sockets that send nothing or half a request head (slowloris) cannot
//! starve a keyed client or the health probes, and are closed after the
//! header timeout (an idle kept-alive one after the idle timeout); health
//! probes are never rate limited; an open (keyless)
//! server answers only loopback host names, and WebSockets only from
//! loopback pages (DNS rebinding), checked against the live key ring.
//!
//! Other client addresses are loopback aliases (127.0.0.2, 127.0.0.3): the
//! server counts connections per client address. Timeouts are 1 s here
//! (10 s and 5 s by default) so the file runs in seconds.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::header::{HOST, ORIGIN};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, repo_agents};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

const KEYED_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const PROBE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

async fn admin_key(dir: &Path) -> String {
    let store = cadre::store::Store::open(dir).expect("open the data dir");
    let (key, _) = cadre::tenants::create_key(&store, "acme", true)
        .await
        .expect("key created");
    key
}

/// Lowers the server's open-files limit (soft and hard) to `n`, as
/// `ulimit -n` in front of it would, once it has started.
fn limit_open_files(server: &Server, n: u64) {
    let new = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: a plain syscall on a valid pointer, on our own child.
    let rc = unsafe {
        libc::prlimit(
            server.pid(),
            libc::RLIMIT_NOFILE,
            &new,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(
        rc,
        0,
        "set RLIMIT_NOFILE: {}",
        std::io::Error::last_os_error()
    );
}

/// Whether the server closed `socket`: a read ends (EOF or reset) within
/// `within`.
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, socket.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A response (a 408 for the half-sent head): read on to the end.
            Ok(Ok(_)) => continue,
        }
    }
}

fn addr_of(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_sockets_do_not_starve_a_keyed_client_or_health_and_are_closed_after_the_header_timeout()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = admin_key(&data).await;
    let server = Server::start_offline_with(
        &data,
        &repo_agents(),
        &[
            ("CADRE_SERVER_HEADER_READ_TIMEOUT_S", "1"),
            ("CADRE_SERVER_IDLE_TIMEOUT_S", "1"),
            ("CADRE_SERVER_MAX_CONNECTIONS", "128"),
            ("CADRE_SERVER_MAX_CONNECTIONS_PER_ADDRESS", "32"),
        ],
    );
    // More attacking sockets than the server has files.
    limit_open_files(&server, 256);
    let addr = addr_of(&server);

    let mut attack = Vec::new();
    for i in 0..300 {
        let mut socket = TcpStream::connect(&addr).await.expect("connect");
        if i % 2 == 0 {
            socket
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .await
                .expect("half a request head");
        }
        attack.push(socket);
    }

    let keyed = server
        .client()
        .with_local_address(KEYED_CLIENT, Duration::from_secs(1))
        .with_key(&key);
    let probe = server
        .client()
        .with_local_address(PROBE, Duration::from_secs(1));
    // The attacker's own address too: a new connection there pushes out
    // the attacker's oldest unfinished one.
    let same_address = server
        .client()
        .with_local_address(IpAddr::V4(Ipv4Addr::LOCALHOST), Duration::from_secs(1));
    for round in 0..5 {
        let started = Instant::now();
        let (status, body) = keyed.try_get("/v1/tools").await.unwrap_or_else(|e| {
            panic!(
                "round {round}: the keyed client was not served: {e}\n{}",
                server.log_tail()
            )
        });
        assert_eq!(status, StatusCode::OK, "{body}");
        for client in [&probe, &same_address] {
            let (status, body) = client.try_get("/healthz").await.unwrap_or_else(|e| {
                panic!(
                    "round {round}: /healthz did not answer: {e}\n{}",
                    server.log_tail()
                )
            });
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        // Keep attacking: fresh sockets replace the ones closed.
        for _ in 0..20 {
            attack.push(TcpStream::connect(&addr).await.expect("connect"));
        }
    }

    // Every attacking socket is closed: dropped for a newcomer, or at the
    // header timeout (1 s) at the latest.
    for socket in attack.iter_mut() {
        assert!(
            closed_within(socket, Duration::from_secs(3)).await,
            "an attacking socket is still open"
        );
    }

    // A lone unfinished request head is closed after the header timeout,
    // not before.
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut socket, Duration::from_secs(3)).await);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline_with(
        &dir.path().join("data"),
        &repo_agents(),
        &[
            ("CADRE_SERVER_HEADER_READ_TIMEOUT_S", "3"),
            ("CADRE_SERVER_IDLE_TIMEOUT_S", "1"),
        ],
    );
    let mut socket = TcpStream::connect(addr_of(&server)).await.unwrap();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = socket.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // The whole response is in: the connection waits, kept alive.
    let started = Instant::now();
    assert!(closed_within(&mut socket, Duration::from_secs(5)).await);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
        "closed after {waited:?}: the idle timeout is 1 s, the header timeout 3 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_are_never_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline_with(
        &dir.path().join("data"),
        &repo_agents(),
        &[
            ("CADRE_API_LIMIT_PER_SECOND", "1"),
            ("CADRE_API_LIMIT_BURST", "2"),
        ],
    );
    let client = server.client();
    let mut limited = false;
    for _ in 0..3 {
        let (status, _) = client.get("/openapi.json").await;
        limited |= status == StatusCode::TOO_MANY_REQUESTS;
    }
    assert!(limited, "the address is over its rate");
    for _ in 0..5 {
        for probe in ["/healthz", "/readyz"] {
            let (status, body) = client.get(probe).await;
            assert_eq!(status, StatusCode::OK, "{probe}: {body}");
        }
    }
}

/// `GET path` with `Host: host`.
async fn get_as(client: &Client, host: &str, path: &str) -> (StatusCode, Value) {
    support::client::send(client.request(Method::GET, path).header(HOST, host)).await
}

fn forbidden_host(answer: &(StatusCode, Value)) -> bool {
    answer.0 == StatusCode::FORBIDDEN && answer.1["error"]["code"] == "FORBIDDEN_HOST"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_server_answers_only_loopback_host_names_until_the_first_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let client = server.client();
    let port = addr_of(&server).rsplit_once(':').unwrap().1.to_owned();

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_owned(),
    ] {
        let answer = get_as(&client, &host, "/v1/sessions").await;
        assert_eq!(answer.0, StatusCode::OK, "{host}: {}", answer.1);
    }
    for path in ["/v1/sessions", "/v1/tenants/default/config", "/healthz"] {
        let answer = get_as(&client, &format!("rebound.example:{port}"), path).await;
        assert!(forbidden_host(&answer), "{path}: {answer:?}");
    }
    // A tool run, the attack that matters most.
    let answer = support::client::send(
        client
            .request(Method::POST, "/v1/tools/calculator/invoke")
            .header(HOST, "rebound.example")
            .json(&json!({"params": {"expression": "1+1"}})),
    )
    .await;
    assert!(forbidden_host(&answer), "{answer:?}");
    // `/mcp` answers the same status and code as every other route.
    let answer = support::client::send(
        client
            .request(Method::POST, "/mcp")
            .header(HOST, "rebound.example")
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
    )
    .await;
    assert!(forbidden_host(&answer), "{answer:?}");

    // The first key ends open mode: from the next request on, keys guard
    // the server and host names are not checked.
    let (status, created) = support::client::send(
        client
            .request(Method::POST, "/v1/keys")
            .json(&json!({"tenant": "acme", "admin": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let keyed = client.with_key(created["key"].as_str().unwrap());
    let answer = get_as(&keyed, "rebound.example", "/v1/sessions").await;
    assert_eq!(answer.0, StatusCode::OK, "{answer:?}");
}

/// Opens the visitor WebSocket of `session` with `origin`; the status of a
/// refused upgrade, or 101.
async fn ws_status(server: &Server, session: &str, origin: &str) -> (u16, String) {
    let url = format!(
        "{}/v1/sessions/{session}/ws",
        server.base.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert(ORIGIN, origin.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => (response.status().as_u16(), String::new()),
        Err(tungstenite::Error::Http(response)) => {
            let body = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            (response.status().as_u16(), body)
        }
        Err(e) => panic!("WebSocket handshake failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_server_refuses_websockets_from_other_sites() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let session = server.client().session("assistant").await;

    let (status, body) = ws_status(&server, &session, "http://rebound.example").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("FORBIDDEN_HOST"), "{body}");
    let (status, body) = ws_status(&server, &session, "null").await;
    assert_eq!(status, 403, "{body}");

    let (status, body) = ws_status(&server, &session, "http://localhost:3000").await;
    assert_eq!(status, 101, "{body}");
}

/// `TCP_NODELAY` of the socket of this process whose local port is
/// `local` and whose peer's port is `peer`: the server's end of a
/// connection, found among this process's descriptors (the app runs in it).
fn nodelay_of_server_end(local: u16, peer: u16) -> Option<bool> {
    fn port(addr: &libc::sockaddr_storage) -> Option<u16> {
        (addr.ss_family as i32 == libc::AF_INET).then(|| {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { &*(addr as *const _ as *const libc::sockaddr_in) };
            u16::from_be(v4.sin_port)
        })
    }
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: plain getsockname/getpeername/getsockopt on a descriptor
        // number; on one that is not a socket (or closed since) they fail.
        unsafe {
            let mut addr: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = std::mem::size_of_val(&addr) as libc::socklen_t;
            if libc::getsockname(fd, &mut addr as *mut _ as *mut _, &mut len) != 0
                || port(&addr) != Some(local)
            {
                continue;
            }
            let mut addr: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = std::mem::size_of_val(&addr) as libc::socklen_t;
            if libc::getpeername(fd, &mut addr as *mut _ as *mut _, &mut len) != 0
                || port(&addr) != Some(peer)
            {
                continue;
            }
            let mut on: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &mut on as *mut _ as *mut _,
                &mut len,
            ) == 0
            {
                return Some(on != 0);
            }
        }
    }
    None
}

/// Streamed replies (SSE deltas, WebSocket frames) are small writes that
/// must leave at once: with Nagle each waits for the previous one's ACK,
/// which the client delays up to 40 ms (the SSE benchmark's p99 was 40 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_connections_send_without_nagle() {
    let app = support::spawn_app(support::AppOptions::offline());
    let server: std::net::SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut client = TcpStream::connect(server).await.unwrap();
    client
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    // Answered: the connection went through the accept loop.
    let mut head = [0u8; 12];
    client.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let ours = client.local_addr().unwrap().port();
    assert_eq!(
        nodelay_of_server_end(server.port(), ours),
        Some(true),
        "the server's end of the connection has TCP_NODELAY"
    );
}

/// Issue #29 (low): an open server answers a balancer's plain health probe,
/// HTTP/1.0 with no `Host` (HAProxy's `option httpchk GET /readyz`), which
/// marked every node down; every other route still needs a loopback name,
/// and the refusal says how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_server_answers_health_probes_without_a_host() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let addr = addr_of(&server);
    let raw = |request: &'static str| {
        let addr = addr.clone();
        async move {
            let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
            socket.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            socket.read_to_end(&mut answer).await.unwrap();
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    for probe in [
        "GET /readyz HTTP/1.0\r\n\r\n",
        "GET /healthz HTTP/1.0\r\n\r\n",
    ] {
        let answer = raw(probe).await;
        assert!(answer.starts_with("HTTP/1.0 200"), "{probe:?}: {answer}");
    }
    let answer = raw("GET /v1/sessions HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 403"), "{answer}");
    assert!(
        answer.contains("FORBIDDEN_HOST") && answer.contains("create an API key"),
        "{answer}"
    );
}
