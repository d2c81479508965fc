use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;
use tollgate_limiter::Key;
use tollgate_limiter::key::DEFAULT_IPV6_PREFIX;

use super::KeyExtractor;

/// Forwarding entries examined at most; a longer chain stops at the last
/// one examined, so a huge header costs bounded work.
const MAX_HOPS: usize = 32;

/// The peer address of a connection, for servers other than axum and
/// tonic: insert it into the request's extensions and [`ClientIp`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Which forwarding header a trusted proxy writes.
///
/// Exactly one is read: if [`ClientIp`] honoured both, a client could add
/// the one its proxy does not write and pass it through untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, most load
    /// balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// The client's IP address.
///
/// By default it is the socket's peer address, read from the request's
/// extensions: axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo`, plain or inside `TlsConnectInfo` on a TLS server
/// (feature `tonic`), or a [`PeerAddr`]. A request with none of them has
/// no key, and the layer's [`MissingKey`](crate::MissingKey) decides: by
/// default every such request is refused `400`, which is what an axum app
/// served without connect info sees for all of them.
///
/// When the peer is one of the [trusted proxies](Self::trust_proxies), the
/// forwarding header is walked **right to left**: each entry was appended by
/// the hop to its right, so the client is the first address from the right
/// that is not itself a trusted proxy. Entries further left were written by
/// the client and are never believed. A peer outside the trusted ranges is
/// the client, whatever headers it sends. An entry that does not parse
/// (`unknown`, an obfuscated name, garbage) stops the walk at the trusted
/// hop that passed it on, so such requests share that hop's limit rather
/// than choosing their own key.
///
/// The key is built by [`Key::ip`] (the `tollgate` CLI uses the same
/// function): IPv4 clients are keyed per address, IPv4-mapped IPv6
/// addresses (`::ffff:203.0.113.7`) count as that IPv4 address, and IPv6
/// clients are **grouped by /64 by default** (`2001:db8:1:2::/64`), since
/// one host commonly holds a whole /64 and could otherwise rotate
/// addresses for a fresh limit on every request. Change the grouping with
/// [`ipv6_prefix`](Self::ipv6_prefix), or key each IPv6 address on its own
/// with [`ipv6_per_address`](Self::ipv6_per_address).
///
/// A request with no peer address has no key: the layer's
/// [`MissingKey`](crate::MissingKey) policy decides.
///
/// Clones share the list of trusted proxies.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate_tower::extract::{ClientIp, KeyExtractor, PeerAddr};
///
/// let client_ip = ClientIp::new().trust_proxies(["10.0.0.0/8".parse()?]);
///
/// let mut via_proxy = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.1.2.3")
///     .body(())?;
/// via_proxy.extensions_mut().insert(PeerAddr("10.0.0.1:4000".parse()?));
/// // 10.1.2.3 is trusted; 203.0.113.9 is the first untrusted hop.
/// assert_eq!(client_ip.extract(&via_proxy).unwrap().as_str(), "203.0.113.9");
///
/// let mut direct = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1")
///     .body(())?;
/// direct.extensions_mut().insert(PeerAddr("192.0.2.7:5000".parse()?));
/// // Not from a trusted proxy: the header is ignored.
/// assert_eq!(client_ip.extract(&direct).unwrap().as_str(), "192.0.2.7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ProxyHeader,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            trusted: Arc::from([]),
            header: ProxyHeader::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl ClientIp {
    /// The socket's peer address; no proxy trusted; IPv6 grouped by /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the forwarding header from peers in these networks (a single
    /// address is a `/32` or `/128` network). A network of IPv4-mapped
    /// addresses (`::ffff:10.0.0.0/104`, as a dual-stack socket shows an
    /// IPv4 peer) is its IPv4 network (`10.0.0.0/8`), since addresses are
    /// looked up in that form.
    pub fn trust_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted = nets.into_iter().map(canonical_net).collect();
        self
    }

    /// Which forwarding header the trusted proxies write (default
    /// `X-Forwarded-For`).
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by their first `len` bits (default
    /// [64](DEFAULT_IPV6_PREFIX)); the key is then the network, e.g.
    /// `2001:db8:1:2::/64`. Use 48 or 56 where a client commonly holds a
    /// larger block. 128 (values above are taken as 128) keys each address
    /// on its own, like [`ipv6_per_address`](Self::ipv6_per_address). IPv4
    /// is always keyed per address.
    pub fn ipv6_prefix(mut self, len: u8) -> Self {
        self.ipv6_prefix = len.min(128);
        self
    }

    /// Keys each IPv6 address on its own (`2001:db8::1`), the opt-out from
    /// the /64 grouping: only for networks where every client has one
    /// fixed address, since a client holding a /64 gets a fresh limit with
    /// each of its 2^64 addresses.
    pub fn ipv6_per_address(self) -> Self {
        self.ipv6_prefix(128)
    }

    /// The client address, before grouping.
    pub fn client_ip<B>(&self, req: &http::Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?.ip().to_canonical();
        Some(self.walk(peer, req.headers()))
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    fn walk(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut current = peer;
        if !self.is_trusted(current) {
            return current;
        }
        let name: HeaderName = match self.header {
            ProxyHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ProxyHeader::Forwarded => FORWARDED,
        };
        // Several header lines form one list, in order. Entries are split
        // as bytes and read one by one: a proxy that appends to the
        // client's line (nginx's `$proxy_add_x_forwarded_for`) puts the
        // client's bytes and its own entry on one line, and bytes the
        // client wrote must not make the proxy's entry unreadable.
        let hops = headers
            .get_all(&name)
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','));
        for hop in hops.take(MAX_HOPS) {
            // An unreadable entry, like garbage: nothing left of it can be
            // believed.
            let Ok(hop) = std::str::from_utf8(hop) else {
                break;
            };
            let parsed = match self.header {
                ProxyHeader::XForwardedFor => parse_node(hop.trim()),
                ProxyHeader::Forwarded => forwarded_for(hop),
            };
            let Some(ip) = parsed else { break };
            current = ip.to_canonical();
            if !self.is_trusted(current) {
                break;
            }
        }
        current
    }
}

/// `net` in the form addresses are compared in: every address is
/// canonicalised (an IPv4-mapped one becomes IPv4) before it is looked up,
/// so a mapped network left as IPv6 would never match.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.addr().to_ipv4_mapped()
        && let Some(len) = v6.prefix_len().checked_sub(96)
        && let Ok(v4) = ipnet::Ipv4Net::new(v4, len)
    {
        return IpNet::V4(v4.trunc());
    }
    net.trunc()
}

fn peer_addr<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
        // Over TLS, tonic wraps the TCP info: read both, or every request
        // to a TLS server would have no key.
        let tcp = ext.get::<TcpConnectInfo>().or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(TlsConnectInfo::get_ref)
        });
        if let Some(addr) = tcp.and_then(TcpConnectInfo::remote_addr) {
            return Some(addr);
        }
    }
    let peer = ext.get::<PeerAddr>().map(|p| p.0);
    if peer.is_none() {
        warn_no_peer_once();
    }
    peer
}

/// A server that records no peer address makes every request keyless:
/// say so once, since the symptom (every request refused as keyless, or
/// none limited) does not name the cause.
fn warn_no_peer_once() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "ClientIp found no peer address in the request extensions; serve axum with \
             `into_make_service_with_connect_info::<SocketAddr>()`, enable the `axum` or \
             `tonic` feature, or insert a `PeerAddr`"
        );
    }
}

/// An address as proxies write it: `ip`, `ip:port`, `[v6]` or `[v6]:port`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// The `for=` parameter of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        parse_node(v)
    })
}

impl<B> KeyExtractor<http::Request<B>> for ClientIp {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        Some(Key::ip(self.client_ip(req)?, self.ipv6_prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(peer: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut r = http::Request::new(());
        for (k, v) in headers {
            r.headers_mut().append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        r
    }

    fn proxies() -> ClientIp {
        ClientIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()])
    }

    fn key(x: &ClientIp, r: &http::Request<()>) -> String {
        x.extract(r).unwrap().as_str().to_owned()
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let r = req(
            "203.0.113.5:1",
            &[
                ("x-forwarded-for", b"1.2.3.4"),
                ("forwarded", b"for=1.2.3.4"),
            ],
        );
        assert_eq!(key(&proxies(), &r), "203.0.113.5");
        assert_eq!(
            key(&proxies().header(ProxyHeader::Forwarded), &r),
            "203.0.113.5"
        );
    }

    #[test]
    fn walks_right_to_left_over_trusted_hops() {
        // The client prepended a fake 1.1.1.1; the real client is 198.51.100.7.
        let r = req(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", b"1.1.1.1, 198.51.100.7"),
                ("x-forwarded-for", b"10.9.9.9"),
            ],
        );
        assert_eq!(key(&proxies(), &r), "198.51.100.7");
    }

    #[test]
    fn only_the_configured_header_is_read() {
        let r = req(
            "10.0.0.1:1",
            &[
                ("forwarded", b"for=1.1.1.1"),
                ("x-forwarded-for", b"198.51.100.7"),
            ],
        );
        assert_eq!(key(&proxies(), &r), "198.51.100.7");
        let r = req(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", b"1.1.1.1"),
                (
                    "forwarded",
                    b"for=1.1.1.1, For=\"[2001:db8::1]:443\";proto=https",
                ),
            ],
        );
        assert_eq!(
            key(&proxies().header(ProxyHeader::Forwarded), &r),
            "2001:db8::/64"
        );
    }

    #[test]
    fn all_trusted_means_the_leftmost() {
        let r = req("10.0.0.1:1", &[("x-forwarded-for", b"10.0.0.7, 10.0.0.8")]);
        assert_eq!(key(&proxies(), &r), "10.0.0.7");
        let r = req("10.0.0.1:1", &[]);
        assert_eq!(key(&proxies(), &r), "10.0.0.1");
    }

    #[test]
    fn malformed_entries_stop_at_the_trusted_hop() {
        for bad in [
            &b"garbage"[..],
            b"",
            b" , ",
            b"unknown",
            b"1.2.3.4.5",
            b"\xff\xfe",
            b"[::1",
        ] {
            let r = req("10.0.0.1:1", &[("x-forwarded-for", bad)]);
            assert_eq!(key(&proxies(), &r), "10.0.0.1", "{bad:?}");
        }
        let r = req(
            "10.0.0.1:1",
            &[("x-forwarded-for", b"1.1.1.1, bogus, 10.0.0.2")],
        );
        assert_eq!(key(&proxies(), &r), "10.0.0.2");
        let r = req(
            "10.0.0.1:1",
            &[("forwarded", b"for=_hidden, for=unknown;by=x")],
        );
        assert_eq!(
            key(&proxies().header(ProxyHeader::Forwarded), &r),
            "10.0.0.1"
        );
        let r = req("10.0.0.1:1", &[("forwarded", b"proto=https")]);
        assert_eq!(
            key(&proxies().header(ProxyHeader::Forwarded), &r),
            "10.0.0.1"
        );
    }

    /// A proxy that appends to the client's line (nginx's
    /// `$proxy_add_x_forwarded_for`: `<client's value>, <peer>`) puts the
    /// client's bytes and its own entry on one line. Bytes the client
    /// wrote that are not UTF-8 must not discard the entry the proxy
    /// appended: the client would then be keyed as the proxy, a second
    /// budget it can switch to whenever its own is spent.
    #[test]
    fn client_bytes_cannot_discard_the_entry_its_proxy_appended() {
        for header in ["x-forwarded-for", "forwarded"] {
            let (client, appended): (&[u8], &[u8]) = if header == "forwarded" {
                (b"for=\xff", b", for=203.0.113.9")
            } else {
                (b"\xff\xfe", b", 203.0.113.9")
            };
            let line = [client, appended].concat();
            let r = req("10.0.0.1:1", &[(header, &line)]);
            let x = if header == "forwarded" {
                proxies().header(ProxyHeader::Forwarded)
            } else {
                proxies()
            };
            assert_eq!(key(&x, &r), "203.0.113.9", "{header}: {line:?}");
        }
        // A client-sent line of its own, then the proxy's: the same.
        let r = req(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", b"\xff"),
                ("x-forwarded-for", b"203.0.113.9"),
            ],
        );
        assert_eq!(key(&proxies(), &r), "203.0.113.9");
        // Unreadable bytes between trusted hops still stop the walk there.
        let r = req(
            "10.0.0.1:1",
            &[("x-forwarded-for", b"198.51.100.1, \xff, 10.0.0.2")],
        );
        assert_eq!(key(&proxies(), &r), "10.0.0.2");
    }

    #[test]
    fn ports_brackets_and_mapped_addresses() {
        let r = req("10.0.0.1:1", &[("x-forwarded-for", b"[2001:db8::5]:8080")]);
        assert_eq!(key(&proxies(), &r), "2001:db8::/64");
        let r = req("10.0.0.1:1", &[("x-forwarded-for", b"192.0.2.1:8080")]);
        assert_eq!(key(&proxies(), &r), "192.0.2.1");
        let r = req("[::ffff:192.0.2.9]:1", &[]);
        assert_eq!(key(&proxies(), &r), "192.0.2.9");
    }

    /// A proxy given as a dual-stack socket shows it (`::ffff:10.0.0.1`)
    /// is trusted: addresses are looked up in their IPv4 form.
    #[test]
    fn a_mapped_proxy_network_is_trusted() {
        for net in ["::ffff:10.0.0.0/104", "::ffff:10.0.0.1/128"] {
            let x = ClientIp::new().trust_proxies([net.parse().unwrap()]);
            for peer in ["[::ffff:10.0.0.1]:1", "10.0.0.1:1"] {
                let r = req(peer, &[("x-forwarded-for", b"198.51.100.7")]);
                assert_eq!(key(&x, &r), "198.51.100.7", "{net} {peer}");
            }
            // Only that network.
            let r = req("10.1.0.1:1", &[("x-forwarded-for", b"198.51.100.7")]);
            let want = if net.ends_with("/104") {
                "198.51.100.7"
            } else {
                "10.1.0.1"
            };
            assert_eq!(key(&x, &r), want, "{net}");
        }
    }

    #[test]
    fn ipv6_is_grouped_by_64_by_default() {
        let a = req("[2001:db8:1:2:aaaa::1]:1", &[]);
        let b = req("[2001:db8:1:2:bbbb::2]:1", &[]);
        let other = req("[2001:db8:1:3::1]:1", &[]);
        let x = ClientIp::new();
        assert_eq!(key(&x, &a), "2001:db8:1:2::/64");
        assert_eq!(x.extract(&a), x.extract(&b));
        assert_ne!(x.extract(&a), x.extract(&other));
        // IPv4 stays per address, mapped or not.
        assert_eq!(key(&x, &req("192.0.2.1:1", &[])), "192.0.2.1");
        assert_eq!(key(&x, &req("[::ffff:192.0.2.1]:1", &[])), "192.0.2.1");
        // A mapped address written by a trusted proxy is IPv4 too.
        let r = req("10.0.0.1:1", &[("x-forwarded-for", b"::ffff:198.51.100.7")]);
        assert_eq!(key(&proxies(), &r), "198.51.100.7");
    }

    #[test]
    fn ipv6_grouping_is_configurable() {
        let a = req("[2001:db8:1:2:aaaa::1]:1", &[]);
        let b = req("[2001:db8:1:2:bbbb::2]:1", &[]);
        assert_eq!(key(&ClientIp::new().ipv6_prefix(48), &a), "2001:db8:1::/48");
        let per_address = ClientIp::new().ipv6_per_address();
        assert_eq!(key(&per_address, &a), "2001:db8:1:2:aaaa::1");
        assert_ne!(per_address.extract(&a), per_address.extract(&b));
        assert_eq!(
            key(&ClientIp::new().ipv6_prefix(200), &a),
            "2001:db8:1:2:aaaa::1"
        );
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Whatever a client or proxy sends, the client is the peer (always,
        /// from an untrusted peer) or an address written in the header,
        /// and nothing panics.
        #[test]
        fn any_header_yields_the_peer_or_a_listed_address(
            raw in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        &b"10.0.0.9"[..], b"198.51.100.4", b"[2001:db8::1]:80", b"for=192.0.2.1",
                        b"for=\"[::1]\"", b"unknown", b",", b";", b" ", b"=", b"\"",
                    ]).prop_map(<[u8]>::to_vec),
                    proptest::collection::vec(0x20u8..0x7f, 0..8),
                    proptest::collection::vec(0x80u8..=0xff, 0..4),
                ],
                0..12,
            ),
            forwarded in proptest::bool::ANY,
            trusted_peer in proptest::bool::ANY,
        ) {
            let value: Vec<u8> = raw.concat();
            let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
            let peer = if trusted_peer { "10.0.0.1:1" } else { "203.0.113.5:1" };
            let Ok(value) = http::HeaderValue::from_bytes(&value) else {
                return Ok(());
            };
            let mut r = http::Request::new(());
            r.headers_mut().insert(HeaderName::from_static(name), value.clone());
            r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
            let x = proxies().header(if forwarded { ProxyHeader::Forwarded } else { ProxyHeader::XForwardedFor });
            let ip = x.client_ip(&r).unwrap();
            let peer_ip: IpAddr = peer.parse::<SocketAddr>().unwrap().ip();
            if !trusted_peer {
                proptest::prop_assert_eq!(ip, peer_ip);
            } else if ip != peer_ip {
                let text = String::from_utf8_lossy(value.as_bytes()).to_string();
                let listed = ip.to_string();
                proptest::prop_assert!(text.contains(&listed), "{} not in {:?}", listed, text);
            }
            proptest::prop_assert!(x.extract(&r).is_some());
        }
    }

    #[test]
    fn no_peer_no_key() {
        assert_eq!(proxies().extract(&http::Request::new(())), None);
    }

    #[test]
    fn long_chains_are_bounded() {
        let chain = vec!["10.0.0.3"; 10_000].join(",");
        let r = req("10.0.0.1:1", &[("x-forwarded-for", chain.as_bytes())]);
        assert_eq!(key(&proxies(), &r), "10.0.0.3");
    }
}
