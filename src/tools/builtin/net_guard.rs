//! Network guard: where `http_request`, `fetch_page` and tool files' HTTP
//! entries ([`crate::tools::external`]) may connect (SSRF).
//!
//! handler ──GuardedClient::request(url)──▶ check_url (scheme, IP literal, allowlist)
//!                                              │ ok
//!                     reqwest ──Name──▶ GuardedResolver: lookup, drop refused addresses
//!                        │                      │ only checked addresses
//!                        ▼                      ▼
//!                 redirect hop ──▶ check_url again (max 5 hops) ──▶ connect
//!
//! The address check happens *after* DNS, in the resolver reqwest uses, so
//! the address reqwest connects to is the address that was checked: a name
//! that answers "public" to a first lookup and "127.0.0.1" to a second (DNS
//! rebinding) gains nothing, there is no second lookup. IP-literal hosts never
//! reach a resolver, so [`NetPolicy::check_url`] classifies them before the
//! request is built and again on every redirect hop.
//!
//! Refused: loopback, private (RFC 1918, fc00::/7, fec0::/10), link-local
//! (incl. the 169.254.169.254 metadata endpoint), unspecified and 0/8,
//! broadcast, multicast, CGNAT 100.64/10, documentation, benchmarking and
//! reserved ranges, and IPv6 forms that embed one of those IPv4 addresses
//! (IPv4-mapped, -compatible, -translated, NAT64 64:ff9b::/96, 6to4, Teredo).
//! Decimal, octal and hex IPv4 spellings (`http://2130706433/`,
//! `http://0177.0.0.1/`) are normalised to dotted quads by the `url` parser
//! before any of this runs.
//!
//! Exempt: hosts in the allowlist, as `host` (any port) or `host:port`. The
//! resolver only sees names, not ports, so a name listed only with ports is
//! reachable only on those ports: a URL naming it on another port is refused
//! by [`NetPolicy::check_url`] before it reaches the resolver.
//!
//! Owns: the address table and the refusal messages. Does not: decide what a
//! tool does with a response (see [`super::http`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect;
use url::{Host, Url};

/// Redirect hops followed before giving up.
pub const MAX_REDIRECTS: usize = 5;

/// Time allowed to open a TCP (and TLS) connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an address may not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrClass {
    Loopback,
    Private,
    LinkLocal,
    /// `0.0.0.0`, `::` and the rest of 0.0.0.0/8 ("this network").
    Unspecified,
    Broadcast,
    Multicast,
    /// 100.64.0.0/10, carrier-grade NAT.
    SharedCgnat,
    Documentation,
    Benchmarking,
    Reserved,
}

impl AddrClass {
    fn phrase(self) -> &'static str {
        match self {
            AddrClass::Loopback => "a loopback address",
            AddrClass::Private => "a private address",
            AddrClass::LinkLocal => "a link-local address",
            AddrClass::Unspecified => "an unspecified address",
            AddrClass::Broadcast => "a broadcast address",
            AddrClass::Multicast => "a multicast address",
            AddrClass::SharedCgnat => "a shared (CGNAT) address",
            AddrClass::Documentation => "a documentation address",
            AddrClass::Benchmarking => "a benchmarking address",
            AddrClass::Reserved => "a reserved address",
        }
    }
}

/// How an IPv6 address carries an IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// `::ffff:a.b.c.d`
    Mapped,
    /// `::a.b.c.d` (deprecated)
    Compatible,
    /// `::ffff:0:a.b.c.d` (SIIT)
    Translated,
    /// `64:ff9b::a.b.c.d`
    Nat64,
    /// `2002:AABB:CCDD::/48`
    SixToFour,
    /// `2001:0::/32`, client address stored inverted in the last 32 bits.
    Teredo,
}

impl Embedding {
    fn name(self) -> &'static str {
        match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::Translated => "IPv4-translated",
            Embedding::Nat64 => "NAT64",
            Embedding::SixToFour => "6to4",
            Embedding::Teredo => "Teredo",
        }
    }
}

/// The verdict on a refused address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub class: AddrClass,
    /// The IPv4 address the verdict is about, when it came embedded in IPv6.
    pub via: Option<(Embedding, Ipv4Addr)>,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.class.phrase())?;
        if let Some((embedding, v4)) = self.via {
            write!(f, " ({} {v4})", embedding.name())?;
        }
        Ok(())
    }
}

/// Why a URL or a resolved name may not be fetched. Every message starts with
/// `refused:` so callers and the model can tell policy from network failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("refused: {addr} is {blocked}")]
    Address { addr: IpAddr, blocked: Blocked },
    #[error("refused: {host} resolves to {addr}, which is {blocked}")]
    Resolved {
        host: String,
        addr: IpAddr,
        blocked: Blocked,
    },
    #[error("refused: {host} is allowlisted only on other ports, not on port {port}")]
    PortNotAllowlisted { host: String, port: u16 },
    #[error("refused: only http and https URLs may be fetched, not {scheme}:")]
    Scheme { scheme: String },
    #[error("refused: {url} has no host")]
    NoHost { url: String },
    #[error("refused: more than {max} redirects")]
    TooManyRedirects { max: usize },
    #[error("refused: a redirect from {from} to another origin ({to})")]
    CrossOriginRedirect { from: String, to: String },
}

/// `(network, prefix length, class)`, first match wins.
const V4_TABLE: &[(Ipv4Addr, u8, AddrClass)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, AddrClass::Unspecified),
    (Ipv4Addr::new(10, 0, 0, 0), 8, AddrClass::Private),
    (Ipv4Addr::new(100, 64, 0, 0), 10, AddrClass::SharedCgnat),
    (Ipv4Addr::new(127, 0, 0, 0), 8, AddrClass::Loopback),
    (Ipv4Addr::new(169, 254, 0, 0), 16, AddrClass::LinkLocal),
    (Ipv4Addr::new(172, 16, 0, 0), 12, AddrClass::Private),
    (Ipv4Addr::new(192, 0, 0, 0), 24, AddrClass::Reserved),
    (Ipv4Addr::new(192, 0, 2, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(192, 88, 99, 0), 24, AddrClass::Reserved),
    (Ipv4Addr::new(192, 168, 0, 0), 16, AddrClass::Private),
    (Ipv4Addr::new(198, 18, 0, 0), 15, AddrClass::Benchmarking),
    (Ipv4Addr::new(198, 51, 100, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(203, 0, 113, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(224, 0, 0, 0), 4, AddrClass::Multicast),
    (Ipv4Addr::new(255, 255, 255, 255), 32, AddrClass::Broadcast),
    (Ipv4Addr::new(240, 0, 0, 0), 4, AddrClass::Reserved),
];

/// Native IPv6 ranges; embedded IPv4 forms are handled before this table.
const V6_TABLE: &[(Ipv6Addr, u8, AddrClass)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, AddrClass::Unspecified),
    (Ipv6Addr::LOCALHOST, 128, AddrClass::Loopback),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        AddrClass::Private,
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        AddrClass::Reserved,
    ),
    (
        Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0),
        48,
        AddrClass::Benchmarking,
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        AddrClass::Documentation,
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        AddrClass::Documentation,
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        AddrClass::Private,
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddrClass::LinkLocal,
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddrClass::Private,
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        AddrClass::Multicast,
    ),
];

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddrClass> {
    V4_TABLE
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
        .map(|(_, _, class)| *class)
}

/// The IPv4 address an IPv6 address stands for, if it embeds one.
fn embedded_v4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from(bits as u32);
    let s = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() {
        return None;
    }
    if bits >> 32 == 0xffff {
        Some((Embedding::Mapped, low32))
    } else if bits >> 32 == 0 {
        Some((Embedding::Compatible, low32))
    } else if bits >> 32 == 0xffff_0000 {
        Some((Embedding::Translated, low32))
    } else if in_v6(ip, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96) {
        Some((Embedding::Nat64, low32))
    } else if s[0] == 0x2002 {
        let v4 = (u32::from(s[1]) << 16) | u32::from(s[2]);
        Some((Embedding::SixToFour, Ipv4Addr::from(v4)))
    } else if s[0] == 0x2001 && s[1] == 0 {
        Some((Embedding::Teredo, Ipv4Addr::from(!(bits as u32))))
    } else {
        None
    }
}

/// `None` when the address may be reached, else why not.
pub fn classify(ip: IpAddr) -> Option<Blocked> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|class| Blocked { class, via: None }),
        IpAddr::V6(v6) => {
            if let Some((embedding, v4)) = embedded_v4(v6) {
                return classify_v4(v4).map(|class| Blocked {
                    class,
                    via: Some((embedding, v4)),
                });
            }
            V6_TABLE
                .iter()
                .find(|(net, len, _)| in_v6(v6, *net, *len))
                .map(|(_, _, class)| Blocked {
                    class: *class,
                    via: None,
                })
        }
    }
}

/// A host as the allowlist and the URL checks compare it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostKey {
    Ip(IpAddr),
    /// Lower case, without a trailing dot.
    Name(String),
}

impl HostKey {
    fn from_host(host: Host<&str>) -> HostKey {
        match host {
            Host::Ipv4(v4) => HostKey::Ip(IpAddr::V4(v4)),
            Host::Ipv6(v6) => HostKey::Ip(IpAddr::V6(v6)),
            Host::Domain(d) => HostKey::name(d),
        }
    }

    fn name(name: &str) -> HostKey {
        HostKey::Name(name.trim_end_matches('.').to_ascii_lowercase())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowEntry {
    host: HostKey,
    /// `None`: every port.
    port: Option<u16>,
}

impl AllowEntry {
    /// `host`, `host:port`, `a.b.c.d[:port]`, `::1`, `[::1]` or `[::1]:port`;
    /// hosts go through the same parser as URL hosts, so `2130706433` and
    /// `127.0.0.1` name the same entry.
    fn parse(entry: &str) -> Option<AllowEntry> {
        let entry = entry.trim();
        if let Ok(ip) = entry.parse::<IpAddr>() {
            return Some(AllowEntry {
                host: HostKey::Ip(ip),
                port: None,
            });
        }
        let (host, port) = if entry.starts_with('[') {
            let close = entry.find(']')?;
            let rest = &entry[close + 1..];
            let port = match rest.strip_prefix(':') {
                Some(p) => Some(p.parse().ok()?),
                None if rest.is_empty() => None,
                None => return None,
            };
            (&entry[..=close], port)
        } else {
            match entry.rsplit_once(':') {
                Some((host, port)) => (host, Some(port.parse().ok()?)),
                None => (entry, None),
            }
        };
        if host.is_empty() {
            return None;
        }
        let host = match Host::parse(host).ok()? {
            Host::Domain(d) => HostKey::name(&d),
            Host::Ipv4(v4) => HostKey::Ip(IpAddr::V4(v4)),
            Host::Ipv6(v6) => HostKey::Ip(IpAddr::V6(v6)),
        };
        Some(AllowEntry { host, port })
    }
}

/// The address policy shared by the URL checks, the resolver and the
/// redirect policy.
#[derive(Debug, Clone, Default)]
pub struct NetPolicy {
    allow: Arc<Vec<AllowEntry>>,
}

impl NetPolicy {
    /// Entries that do not parse are skipped with a warning: a typo in the
    /// allowlist must not open anything.
    pub fn new(allowlist: &[String]) -> NetPolicy {
        let allow = allowlist
            .iter()
            .filter_map(|raw| {
                let parsed = AllowEntry::parse(raw);
                if parsed.is_none() {
                    tracing::warn!(entry = %raw, "ignoring malformed http_allowlist entry");
                }
                parsed
            })
            .collect();
        NetPolicy {
            allow: Arc::new(allow),
        }
    }

    fn permits(&self, host: &HostKey, port: u16) -> bool {
        self.allow
            .iter()
            .any(|e| &e.host == host && e.port.is_none_or(|p| p == port))
    }

    /// Whether any entry names this host (on any port). The resolver, which
    /// does not see ports, exempts these names; [`Self::check_url`] has
    /// already refused the ports that are not listed.
    fn names(&self, host: &HostKey) -> bool {
        self.allow.iter().any(|e| &e.host == host)
    }

    /// The check before a request is sent and on every redirect hop: scheme,
    /// IP-literal hosts, and ports of allowlisted names. Names that are not
    /// allowlisted pass here and are checked by [`GuardedResolver`].
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused::Scheme {
                scheme: url.scheme().to_string(),
            });
        }
        let host = url.host().ok_or_else(|| Refused::NoHost {
            url: url.to_string(),
        })?;
        let key = HostKey::from_host(host);
        let port = url.port_or_known_default().unwrap_or(80);
        if self.permits(&key, port) {
            return Ok(());
        }
        match key {
            HostKey::Ip(addr) => match classify(addr) {
                Some(blocked) => Err(Refused::Address { addr, blocked }),
                None => Ok(()),
            },
            HostKey::Name(ref name) if self.names(&key) => Err(Refused::PortNotAllowlisted {
                host: name.clone(),
                port,
            }),
            HostKey::Name(_) => Ok(()),
        }
    }

    /// What the resolver hands to reqwest: every address of an allowlisted
    /// name, else the addresses [`classify`] accepts; an error naming the
    /// first refused address when none is left.
    pub fn filter_resolved(
        &self,
        host: &str,
        addrs: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Refused> {
        if self.names(&HostKey::name(host)) {
            return Ok(addrs);
        }
        let mut first_refusal = None;
        let mut kept = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match classify(addr.ip()) {
                None => kept.push(addr),
                Some(blocked) => {
                    first_refusal.get_or_insert(Refused::Resolved {
                        host: host.to_string(),
                        addr: addr.ip(),
                        blocked,
                    });
                }
            }
        }
        match (kept.is_empty(), first_refusal) {
            (true, Some(refused)) => Err(refused),
            _ => Ok(kept),
        }
    }
}

/// A `reqwest` resolver that resolves with the system resolver and lets only
/// addresses the policy accepts through.
pub struct GuardedResolver {
    policy: NetPolicy,
}

impl GuardedResolver {
    pub fn new(policy: NetPolicy) -> Self {
        GuardedResolver { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if found.is_empty() {
                return Err(format!("{host} has no addresses").into());
            }
            let kept = policy.filter_resolved(&host, found)?;
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

/// Follows at most [`MAX_REDIRECTS`] hops, each one through
/// [`NetPolicy::check_url`]; with `same_origin`, only hops that keep the
/// first URL's scheme, host and port (another port of the same host is
/// another service).
pub fn redirect_policy(policy: NetPolicy, same_origin: bool) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        // `previous` starts with the original URL, which is not a hop.
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(Refused::TooManyRedirects { max: MAX_REDIRECTS });
        }
        if same_origin
            && let Some(first) = attempt.previous().first()
            && first.origin() != attempt.url().origin()
        {
            let refused = Refused::CrossOriginRedirect {
                from: first.origin().ascii_serialization(),
                to: attempt.url().origin().ascii_serialization(),
            };
            return attempt.error(refused);
        }
        match policy.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(refused),
        }
    })
}

/// What a [`GuardedClient`] does with a redirect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirects {
    /// Follow up to [`MAX_REDIRECTS`] hops, each checked by
    /// [`redirect_policy`].
    Checked,
    /// Like `Checked`, and every hop stays on the first URL's origin
    /// (tool-file HTTP entries: see [`crate::tools::external`]).
    SameOrigin,
    /// Return 3xx responses to the caller, which decides (and must send the
    /// next hop through [`GuardedClient::request`] again).
    Manual,
}

/// A `reqwest` client that can only reach what [`NetPolicy`] allows: no
/// proxy (a proxy would resolve names for us), the guarded resolver, checked
/// redirects, and a URL check before every request.
pub struct GuardedClient {
    policy: NetPolicy,
    client: reqwest::Client,
}

impl GuardedClient {
    pub fn new(
        allowlist: &[String],
        redirects: Redirects,
    ) -> Result<GuardedClient, reqwest::Error> {
        let policy = NetPolicy::new(allowlist);
        let redirect = match redirects {
            Redirects::Checked => redirect_policy(policy.clone(), false),
            Redirects::SameOrigin => redirect_policy(policy.clone(), true),
            Redirects::Manual => redirect::Policy::none(),
        };
        let client = reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(GuardedResolver::new(policy.clone()))
            .redirect(redirect)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("cadre/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(GuardedClient { policy, client })
    }

    pub fn policy(&self) -> &NetPolicy {
        &self.policy
    }

    /// A request builder for `url`, once `url` passed the policy.
    pub fn request(
        &self,
        method: reqwest::Method,
        url: Url,
    ) -> Result<reqwest::RequestBuilder, Refused> {
        self.policy.check_url(&url)?;
        Ok(self.client.request(method, url))
    }
}

/// The policy refusal behind a `reqwest` error (from the resolver or the
/// redirect policy), if that is what it was.
pub fn refusal(err: &reqwest::Error) -> Option<&Refused> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return Some(refused);
        }
        // `io::Error::source` skips the error it wraps; look inside.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<Refused>())
        {
            return Some(inner);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(ip: &str) -> Option<AddrClass> {
        classify(ip.parse().unwrap()).map(|b| b.class)
    }

    fn refused_message(url: &str, allow: &[&str]) -> Option<String> {
        let policy = NetPolicy::new(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        policy
            .check_url(&Url::parse(url).unwrap())
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn ipv4_ranges_are_classified() {
        use AddrClass::*;
        let cases = [
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("10.0.0.1", Some(Private)),
            ("10.255.255.255", Some(Private)),
            ("100.63.255.255", None),
            ("100.64.0.1", Some(SharedCgnat)),
            ("100.127.255.255", Some(SharedCgnat)),
            ("100.128.0.0", None),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("169.254.169.254", Some(LinkLocal)),
            ("169.254.0.1", Some(LinkLocal)),
            ("169.255.0.1", None),
            ("172.15.255.255", None),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.0", None),
            ("192.0.0.8", Some(Reserved)),
            ("192.0.2.1", Some(Documentation)),
            ("192.88.99.1", Some(Reserved)),
            ("192.167.255.255", None),
            ("192.168.1.1", Some(Private)),
            ("192.169.0.0", None),
            ("198.17.255.255", None),
            ("198.18.0.1", Some(Benchmarking)),
            ("198.19.255.255", Some(Benchmarking)),
            ("198.20.0.0", None),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("223.255.255.255", None),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.254", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("1.1.1.1", None),
            ("8.8.8.8", None),
            ("93.184.216.34", None),
        ];
        for (ip, want) in cases {
            assert_eq!(class(ip), want, "{ip}");
        }
    }

    #[test]
    fn native_ipv6_ranges_are_classified() {
        use AddrClass::*;
        let cases = [
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("fe80::1", Some(LinkLocal)),
            ("febf:ffff::1", Some(LinkLocal)),
            ("fc00::1", Some(Private)),
            ("fd12:3456::1", Some(Private)),
            ("fec0::1", Some(Private)),
            ("ff02::1", Some(Multicast)),
            ("ff0e::fb", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("3fff::1", Some(Documentation)),
            ("100::1", Some(Reserved)),
            ("2001:2::1", Some(Benchmarking)),
            ("64:ff9b:1::1", Some(Private)),
            ("2606:4700:4700::1111", None),
            ("2001:4860:4860::8888", None),
            ("fbff::1", None),
        ];
        for (ip, want) in cases {
            assert_eq!(class(ip), want, "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_embedding_ipv4_are_judged_by_the_ipv4_address() {
        use AddrClass::*;
        use Embedding::*;
        let cases = [
            ("::ffff:127.0.0.1", Some((Loopback, Mapped))),
            ("::ffff:7f00:1", Some((Loopback, Mapped))),
            ("::ffff:10.1.2.3", Some((Private, Mapped))),
            ("::ffff:169.254.169.254", Some((LinkLocal, Mapped))),
            ("::ffff:0.0.0.0", Some((Unspecified, Mapped))),
            ("::127.0.0.1", Some((Loopback, Compatible))),
            ("::192.168.0.1", Some((Private, Compatible))),
            ("::ffff:0:127.0.0.1", Some((Loopback, Translated))),
            ("64:ff9b::127.0.0.1", Some((Loopback, Nat64))),
            ("64:ff9b::a9fe:a9fe", Some((LinkLocal, Nat64))),
            ("2002:7f00:1::", Some((Loopback, SixToFour))),
            ("2002:c0a8:101::1", Some((Private, SixToFour))),
            // Teredo stores the client address inverted: !127.0.0.1.
            (
                "2001:0:4136:e378:8000:63bf:80ff:fffe",
                Some((Loopback, Teredo)),
            ),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
        ];
        for (ip, want) in cases {
            let got = classify(ip.parse().unwrap()).map(|b| (b.class, b.via.unwrap().0));
            assert_eq!(got, want, "{ip}");
        }
    }

    #[test]
    fn refusal_messages_name_the_address_and_its_class() {
        let blocked = |ip: &str| {
            let addr: IpAddr = ip.parse().unwrap();
            Refused::Address {
                addr,
                blocked: classify(addr).unwrap(),
            }
            .to_string()
        };
        assert_eq!(
            blocked("127.0.0.1"),
            "refused: 127.0.0.1 is a loopback address"
        );
        assert_eq!(
            blocked("169.254.169.254"),
            "refused: 169.254.169.254 is a link-local address"
        );
        assert_eq!(
            blocked("::ffff:127.0.0.1"),
            "refused: ::ffff:127.0.0.1 is a loopback address (IPv4-mapped 127.0.0.1)"
        );
        assert_eq!(
            blocked("100.64.0.1"),
            "refused: 100.64.0.1 is a shared (CGNAT) address"
        );
    }

    #[test]
    fn url_parser_normalises_odd_ipv4_spellings_before_the_check() {
        for url in [
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.0.0.1/",
            "http://0x7f000001/",
            "http://127.1/",
            "http://017700000001/",
            "http://127.0.0.1./",
        ] {
            assert_eq!(
                Url::parse(url).unwrap().host(),
                Some(Host::Ipv4(Ipv4Addr::LOCALHOST)),
                "{url}"
            );
            assert_eq!(
                refused_message(url, &[]).as_deref(),
                Some("refused: 127.0.0.1 is a loopback address"),
                "{url}"
            );
        }
    }

    #[test]
    fn ip_literal_urls_are_checked_before_sending() {
        for (url, class) in [
            ("http://[::1]:8080/", "loopback"),
            ("http://[::ffff:127.0.0.1]/", "loopback"),
            ("http://[::ffff:a9fe:a9fe]/", "link-local"),
            ("http://10.0.0.1/", "private"),
            ("https://172.16.0.1/", "private"),
            ("http://192.168.1.1/", "private"),
            ("http://169.254.169.254/latest/meta-data/", "link-local"),
            ("http://0.0.0.0/", "unspecified"),
            ("http://[::]/", "unspecified"),
            ("http://255.255.255.255/", "broadcast"),
            ("http://224.0.0.1/", "multicast"),
            ("http://100.64.1.1/", "CGNAT"),
            ("http://[fe80::1]/", "link-local"),
            ("http://[fd00::1]/", "private"),
        ] {
            let message = refused_message(url, &[]).unwrap_or_default();
            assert!(
                message.starts_with("refused: ") && message.contains(class),
                "{url}: {message}"
            );
        }
        assert_eq!(refused_message("http://8.8.8.8/", &[]), None);
        assert_eq!(refused_message("https://[2606:4700::1111]/", &[]), None);
        assert_eq!(refused_message("https://example.com/", &[]), None);
    }

    #[test]
    fn only_http_and_https_pass() {
        assert_eq!(
            refused_message("file:///etc/passwd", &[]).as_deref(),
            Some("refused: only http and https URLs may be fetched, not file:")
        );
        assert!(refused_message("gopher://example.com/", &[]).is_some());
        assert!(refused_message("ftp://example.com/", &[]).is_some());
    }

    #[test]
    fn allowlisted_hosts_are_exempt_on_their_ports() {
        assert_eq!(
            refused_message("http://127.0.0.1:8080/", &["127.0.0.1:8080"]),
            None
        );
        assert_eq!(refused_message("http://127.0.0.1:9/", &["127.0.0.1"]), None);
        assert!(refused_message("http://127.0.0.1:8081/", &["127.0.0.1:8080"]).is_some());
        assert_eq!(refused_message("http://[::1]:3000/", &["[::1]:3000"]), None);
        assert_eq!(refused_message("http://[::1]/", &["::1"]), None);
        assert!(refused_message("http://[::1]:3001/", &["[::1]:3000"]).is_some());
        // Entries and URLs go through the same host parser.
        assert_eq!(
            refused_message("http://127.0.0.1:80/", &["2130706433:80"]),
            None
        );
        assert_eq!(refused_message("http://10.0.0.1/", &["10.0.0.1:80"]), None);
        assert!(refused_message("https://10.0.0.1/", &["10.0.0.1:80"]).is_some());
        // Names: case and trailing dots do not matter; listed ports bind.
        assert_eq!(
            refused_message("http://Intranet.Local./", &["intranet.local"]),
            None
        );
        assert_eq!(
            refused_message("http://intranet.local:9000/", &["intranet.local:8000"]).as_deref(),
            Some("refused: intranet.local is allowlisted only on other ports, not on port 9000")
        );
        assert_eq!(
            refused_message("http://intranet.local:8000/", &["intranet.local:8000"]),
            None
        );
        // A mapped form of an allowlisted IPv4 address is not the same host.
        assert!(refused_message("http://[::ffff:127.0.0.1]:8080/", &["127.0.0.1:8080"]).is_some());
    }

    #[test]
    fn malformed_allowlist_entries_open_nothing() {
        let policy = NetPolicy::new(&[
            "".into(),
            ":80".into(),
            "host:notaport".into(),
            "[::1".into(),
            "[::1]x".into(),
            "127.0.0.1:99999".into(),
        ]);
        assert!(policy.allow.is_empty(), "{:?}", policy.allow);
    }

    #[test]
    fn resolved_addresses_are_filtered() {
        let policy = NetPolicy::new(&["internal.example:8443".into()]);
        let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };

        let only_loopback =
            policy.filter_resolved("localhost", vec![sa("127.0.0.1:0"), sa("[::1]:0")]);
        assert_eq!(
            only_loopback.unwrap_err().to_string(),
            "refused: localhost resolves to 127.0.0.1, which is a loopback address"
        );

        let mixed = policy
            .filter_resolved(
                "rebind.example",
                vec![sa("10.0.0.5:0"), sa("93.184.216.34:0")],
            )
            .unwrap();
        assert_eq!(mixed, vec![sa("93.184.216.34:0")]);

        let allowlisted = policy
            .filter_resolved("Internal.Example", vec![sa("10.0.0.5:0")])
            .unwrap();
        assert_eq!(allowlisted, vec![sa("10.0.0.5:0")]);
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_that_resolves_to_loopback() {
        let resolver = GuardedResolver::new(NetPolicy::default());
        let err = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        let refused = err.downcast_ref::<Refused>().expect("a policy refusal");
        assert!(
            refused
                .to_string()
                .starts_with("refused: localhost resolves to "),
            "{refused}"
        );

        let allowing = GuardedResolver::new(NetPolicy::new(&["localhost:8080".into()]));
        let addrs: Vec<_> = allowing
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
    }
}
