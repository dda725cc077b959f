//! Loopback ports for the servers the tests start (HAProxy, redis-server,
//! PostgreSQL, cadre nodes that keep their address across restarts).

use std::net::TcpListener;

/// A loopback port nothing listens on right now, for a server that binds
/// it later (HAProxy, redis-server, PostgreSQL, a cadre node that keeps its
/// address across restarts).
///
/// Chosen below the kernel's ephemeral range (`ip_local_port_range`): a
/// port from `bind(0)` lies inside it, so any outgoing connection on the
/// machine (a pool's, a client's, a health check's) may take it as its local
/// port before the server binds it; CI saw a cadre node fail to start that
/// way while other tests ran. Never the same port twice in one process.
pub fn free_port() -> u16 {
    use rand::Rng;
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    const FLOOR: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    if ephemeral_low > FLOOR + 1_000 {
        let mut rng = rand::rng();
        for _ in 0..1_000 {
            let port = rng.random_range(FLOOR..ephemeral_low);
            if !handed.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed.insert(port);
                return port;
            }
        }
    }
    // No room below the ephemeral range: the kernel's choice.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("probe a free port")
        .port();
    handed.insert(port);
    port
}
