//! The client's address behind trusted reverse proxies.
//!
//! accepted connection (peer) ──[`TrustedProxies::client`]──▶ `ConnectInfo` of each request
//!     ──▶ failed-authentication budget ([`super::auth_limit`]), per-address
//!         API rate limit ([`super::caller`]), streams per caller
//!
//! Behind a balancer every request comes from the balancer's address, so
//! one client's wrong keys would spend every client's failed-login budget
//! and one client's flood every keyless caller's rate limit. With
//! `[server] trusted_proxies` (addresses or CIDR blocks) a request whose
//! peer is one of them is counted by the address its `X-Forwarded-For`
//! names instead.
//!
//! Decided:
//! - **Only from a trusted peer.** A client that reaches cadre directly
//!   and sends `X-Forwarded-For` is counted by its own address: the header
//!   is anyone's to write, the peer address is not. Empty list (the
//!   default): the header is never read.
//! - **The nearest untrusted hop.** Proxies append the address they saw,
//!   so the header is walked from the right, skipping trusted hops (a
//!   chain of proxies); the first untrusted address is the client. What
//!   the client itself wrote sits to the left of that and is never
//!   believed. A hop that does not parse ends the walk at the last good
//!   one; at most [`MAX_HOPS`] are read.
//! - **Connections still count by peer.** `max_connections_per_address`
//!   limits TCP connections before any header is read, so it counts the
//!   proxy: raise it for a balancer that holds many connections.
//! - `Forwarded` (RFC 7239) is not read: HAProxy and nginx send
//!   `X-Forwarded-For` (`option forwardfor`, `proxy_add_x_forwarded_for`).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::http::HeaderMap;
use ipnet::IpNet;

/// Hops of `X-Forwarded-For` read at most, from the right.
pub const MAX_HOPS: usize = 16;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// `[server] trusted_proxies`, parsed.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Arc<[IpNet]>);

impl TrustedProxies {
    /// Each entry an address (`10.0.0.5`, `::1`) or a block (`10.0.0.0/8`).
    pub fn parse(entries: &[String]) -> Result<TrustedProxies, String> {
        entries
            .iter()
            .map(|e| {
                let e = e.trim();
                IpNet::from_str(e)
                    .or_else(|_| IpAddr::from_str(e).map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| {
                        format!(
                            "server.trusted_proxies: '{e}' is neither an address nor a CIDR block"
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|nets| TrustedProxies(nets.into()))
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// Whom a request of `peer` is counted as.
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> SocketAddr {
        if self.0.is_empty() || !self.trusts(peer.ip()) {
            return peer;
        }
        let values: Vec<&str> = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let mut client = peer.ip();
        for hop in values
            .iter()
            .rev()
            .flat_map(|v| v.rsplit(','))
            .take(MAX_HOPS)
        {
            let Some(ip) = hop_address(hop.trim()) else {
                break;
            };
            client = ip.to_canonical();
            if !self.trusts(client) {
                break;
            }
        }
        if client == peer.ip() {
            peer
        } else {
            SocketAddr::new(client, 0)
        }
    }
}

/// `203.0.113.7`, `2001:db8::1`, `203.0.113.7:4711`, `[2001:db8::1]:4711`.
fn hop_address(hop: &str) -> Option<IpAddr> {
    IpAddr::from_str(hop)
        .ok()
        .or_else(|| SocketAddr::from_str(hop).ok().map(|s| s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn trusted(entries: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn peer(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 40_000)
    }

    fn client(t: &TrustedProxies, from: &str, xff: &[&str]) -> IpAddr {
        t.client(peer(from), &headers(xff)).ip()
    }

    #[test]
    fn only_a_trusted_peer_is_believed() {
        let none = TrustedProxies::default();
        assert_eq!(
            client(&none, "10.0.0.5", &["203.0.113.7"]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(
            client(&t, "192.0.2.1", &["203.0.113.7"]),
            "192.0.2.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client(&t, "10.0.0.5", &["203.0.113.7"]),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        // No header: the proxy itself.
        assert_eq!(
            t.client(peer("10.0.0.5"), &HeaderMap::new()),
            peer("10.0.0.5")
        );
    }

    #[test]
    fn the_nearest_untrusted_hop_is_the_client_not_what_it_wrote() {
        let t = trusted(&["10.0.0.0/8", "::1"]);
        // The client wrote 198.51.100.1; the proxies appended the rest.
        let xff = ["198.51.100.1, 203.0.113.7", "10.0.0.9"];
        assert_eq!(
            client(&t, "10.0.0.5", &xff),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client(&t, "::1", &["[2001:db8::7]:4711"]),
            "2001:db8::7".parse::<IpAddr>().unwrap()
        );
        // A garbled hop ends the walk at the last good one.
        assert_eq!(
            client(&t, "10.0.0.5", &["203.0.113.7, junk, 10.0.0.9"]),
            "10.0.0.9".parse::<IpAddr>().unwrap()
        );
        // Mapped IPv4 is IPv4.
        assert_eq!(
            client(&t, "::ffff:10.0.0.5", &["::ffff:203.0.113.7"]),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn at_most_max_hops_are_read() {
        let t = trusted(&["10.0.0.0/8"]);
        let mut hops = vec!["203.0.113.7".to_string()];
        hops.extend((0..MAX_HOPS).map(|i| format!("10.0.0.{i}")));
        let xff = hops.join(", ");
        // Every hop read was trusted: the leftmost read stands.
        assert_eq!(
            client(&t, "10.0.0.200", &[&xff]),
            "10.0.0.0".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn entries_are_addresses_or_blocks() {
        assert!(TrustedProxies::parse(&["10.0.0.0/8".into(), "::1".into()]).is_ok());
        let err = TrustedProxies::parse(&["proxy.internal".into()]).unwrap_err();
        assert!(err.contains("proxy.internal"), "{err}");
    }
}
