//! What `web_fetch` may connect to. Every hop of every fetch is checked here: its scheme and port, an
//! address written in the URL (which never reaches a resolver), and every address a host name
//! resolves to ([`GuardedResolver`], which hands the connector only the addresses it checked, so a
//! name cannot resolve to a public address for the check and a private one for the connection).
//! Search-provider calls are the one exception: their addresses come from the configuration.
//!
//! A refusal names the rule it broke (`loopback`, `private`, `link-local`, …), so the model, the log
//! and the operator's allowlist all speak of the same thing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The rules a URL or an address can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Not `http` or `https`.
    Scheme,
    /// A port outside `fetch.ports`.
    Port,
    /// 127.0.0.0/8, ::1, `localhost` and its subdomains.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10.
    Private,
    /// 169.254/16 (cloud metadata at 169.254.169.254), fe80::/10.
    LinkLocal,
    /// 100.64/10, carrier-grade NAT.
    Cgnat,
    /// 224/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// Documentation, benchmarking, protocol-assignment and future-use ranges, Teredo, discard-only.
    Reserved,
    /// A name that resolves to no address at all.
    Unresolvable,
}

impl Rule {
    /// The rule's name in refusals, logs and the `rule` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Scheme => "scheme",
            Rule::Port => "port",
            Rule::Loopback => "loopback",
            Rule::Private => "private",
            Rule::LinkLocal => "link-local",
            Rule::Cgnat => "cgnat",
            Rule::Multicast => "multicast",
            Rule::Unspecified => "unspecified",
            Rule::Broadcast => "broadcast",
            Rule::Reserved => "reserved",
            Rule::Unresolvable => "unresolvable",
        }
    }

    /// Every rule, for metrics catalogues and docs.
    pub const ALL: [Rule; 11] = [
        Rule::Scheme,
        Rule::Port,
        Rule::Loopback,
        Rule::Private,
        Rule::LinkLocal,
        Rule::Cgnat,
        Rule::Multicast,
        Rule::Unspecified,
        Rule::Broadcast,
        Rule::Reserved,
        Rule::Unresolvable,
    ];

    fn describe(self) -> &'static str {
        match self {
            Rule::Loopback => "a loopback address",
            Rule::Private => "a private address",
            Rule::LinkLocal => "a link-local address",
            Rule::Cgnat => "a carrier-grade NAT (shared) address",
            Rule::Multicast => "a multicast address",
            Rule::Unspecified => "an unspecified address",
            Rule::Broadcast => "the broadcast address",
            Rule::Reserved => "a reserved address",
            Rule::Scheme | Rule::Port | Rule::Unresolvable => "",
        }
    }
}

/// Why a URL was not fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail} (rule `{}`)", .rule.name())]
pub struct Refusal {
    pub rule: Rule,
    pub detail: String,
}

impl Refusal {
    fn address(rule: Rule, what: &str, ip: IpAddr, embedded: Option<Ipv4Addr>) -> Self {
        let detail = match embedded {
            Some(v4) => format!("{what} is {ip}, which embeds {v4}, {}", rule.describe()),
            None if what == ip.to_string() => format!("{ip} is {}", rule.describe()),
            None => format!("{what} resolves to {ip}, {}", rule.describe()),
        };
        let detail = if ip == IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)) { format!("{detail} (cloud metadata)") } else { detail };
        Self { rule, detail }
    }
}

/// A range of addresses, `10.0.0.0/8` or `fd00::/8` (a bare address is its own /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.trim().parse().map_err(|_| format!("`{text}` is not an address range such as 10.0.0.0/8"))?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => {
                p.trim().parse::<u8>().ok().filter(|p| *p <= bits).ok_or_else(|| format!("`{text}`: the prefix must be 0..{bits}"))?
            }
        };
        Ok(Self { network, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// The rule an IPv4 address breaks, None for a public one.
pub fn classify_v4(ip: Ipv4Addr) -> Option<Rule> {
    Some(if in_v4(ip, [0, 0, 0, 0], 8) {
        Rule::Unspecified
    } else if ip.is_loopback() {
        Rule::Loopback
    } else if ip.is_private() {
        Rule::Private
    } else if ip.is_link_local() {
        Rule::LinkLocal
    } else if in_v4(ip, [100, 64, 0, 0], 10) {
        Rule::Cgnat
    } else if ip.is_multicast() {
        Rule::Multicast
    } else if ip.is_broadcast() {
        Rule::Broadcast
    } else if ip.is_documentation()
        || in_v4(ip, [192, 0, 0, 0], 24)
        || in_v4(ip, [198, 18, 0, 0], 15)
        || in_v4(ip, [240, 0, 0, 0], 4)
        || in_v4(ip, [192, 88, 99, 0], 24)
    {
        Rule::Reserved
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 address carries to a v4 destination (mapped, compatible, NAT64, 6to4):
/// such an address must be judged by what it reaches.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // ::a.b.c.d (IPv4-compatible, deprecated but still routed by some stacks); :: and ::1 are not.
    if s[..6].iter().all(|x| *x == 0) && u128::from(ip) > 1 {
        return Some(low);
    }
    // NAT64: 64:ff9b::/96 and the local-use 64:ff9b:1::/48.
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6].iter().all(|x| *x == 0) || s[2] == 1) {
        return Some(low);
    }
    // 6to4: 2002:AABB:CCDD::/48 reaches AA.BB.CC.DD.
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    None
}

/// The rule an IPv6 address breaks (on its own or through an embedded IPv4 address).
pub fn classify_v6(ip: Ipv6Addr) -> Option<Rule> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(Rule::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Rule::Loopback);
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    Some(if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
        Rule::Private
    } else if s[0] & 0xffc0 == 0xfe80 {
        Rule::LinkLocal
    } else if s[0] & 0xff00 == 0xff00 {
        Rule::Multicast
    } else if (s[0] == 0x2001 && (s[1] == 0x0db8 || s[1] == 0))
        || (s[0] == 0x0100 && s[1..4].iter().all(|x| *x == 0))
        || s[0] & 0xe000 != 0x2000
    {
        // Documentation, Teredo (an obfuscated v4 destination), discard-only, and everything outside
        // 2000::/3, the only global unicast space allocated.
        Rule::Reserved
    } else {
        return None;
    })
}

pub fn classify(ip: IpAddr) -> Option<Rule> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// The checks of one `web_fetch` configuration.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Empty: any port.
    ports: Vec<u16>,
    /// Exact names (lowercase, no trailing dot) and `.suffix` entries for `*.suffix`.
    allow_hosts: Vec<String>,
    allow_cidrs: Vec<Cidr>,
}

impl Policy {
    /// From the `fetch` block (already validated: a bad CIDR is an error there, dropped here).
    pub fn new(ports: &[u16], allow_hosts: &[String], allow_cidrs: &[String]) -> Self {
        Self {
            ports: ports.to_vec(),
            allow_hosts: allow_hosts
                .iter()
                .map(|h| {
                    let h = h.trim().trim_end_matches('.').to_ascii_lowercase();
                    match h.strip_prefix("*.") {
                        Some(suffix) => format!(".{suffix}"),
                        None => h,
                    }
                })
                .collect(),
            allow_cidrs: allow_cidrs.iter().filter_map(|c| Cidr::parse(c).ok()).collect(),
        }
    }

    /// Whether `host` (a name) is on the allowlist: its addresses are then not checked.
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allow_hosts.iter().any(|entry| match entry.strip_prefix('.') {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(entry.as_str()),
            None => *entry == host,
        })
    }

    /// Checks one address that `what` (a host name, or the address itself) stands for.
    pub fn check_ip(&self, what: &str, ip: IpAddr) -> Result<(), Refusal> {
        let canonical = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if self.allow_cidrs.iter().any(|c| c.contains(ip) || c.contains(canonical)) {
            return Ok(());
        }
        match classify(ip) {
            None => Ok(()),
            Some(rule) => {
                let embedded = match ip {
                    IpAddr::V6(v6) => embedded_v4(v6),
                    IpAddr::V4(_) => None,
                };
                Err(Refusal::address(rule, what, ip, embedded))
            }
        }
    }

    /// Everything that can be judged from the URL alone: scheme, port, an address in the URL, and
    /// the names that mean this machine. Names are judged again by [`GuardedResolver`] once resolved.
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal {
                rule: Rule::Scheme,
                detail: format!("the scheme `{}:` is not fetched (only http and https)", url.scheme()),
            });
        }
        let port = url.port_or_known_default().unwrap_or(0);
        if !self.ports.is_empty() && !self.ports.contains(&port) {
            let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            return Err(Refusal {
                rule: Rule::Port,
                detail: format!("port {port} is not one of the allowed ports ({}; runs.lead.web.fetch.ports)", ports.join(", ")),
            });
        }
        match url.host() {
            // The URL parser has already turned decimal, octal and hex forms into the address.
            Some(url::Host::Ipv4(v4)) => self.check_ip(&v4.to_string(), IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => self.check_ip(&v6.to_string(), IpAddr::V6(v6)),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                if (name == "localhost" || name.ends_with(".localhost")) && !self.host_allowed(&name) {
                    return Err(Refusal { rule: Rule::Loopback, detail: format!("{name} names this machine, a loopback address") });
                }
                Ok(())
            }
            None => Err(Refusal { rule: Rule::Scheme, detail: "the URL has no host".to_owned() }),
        }
    }

    /// Resolves `host` and checks every address (an allowlisted name is not checked); the addresses
    /// returned are the ones to connect to.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        let addrs: Vec<SocketAddr> =
            tokio::net::lookup_host((host, port)).await.map_err(|e| ResolveError::Lookup(format!("{host}: {e}")))?.collect();
        if addrs.is_empty() {
            return Err(ResolveError::Refused(Refusal { rule: Rule::Unresolvable, detail: format!("{host} resolves to no address") }));
        }
        if !self.host_allowed(host) {
            // One bad address refuses the name: a resolver answering with a mix is either misconfigured
            // or playing games, and the connector would try them in turn.
            for addr in &addrs {
                self.check_ip(host, addr.ip()).map_err(ResolveError::Refused)?;
            }
        }
        Ok(addrs)
    }
}

/// Why [`Policy::resolve`] gave no addresses.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(Refusal),
    #[error("cannot resolve {0}")]
    Lookup(String),
}

/// reqwest's resolver for fetches: resolves, checks every address, and gives the connector exactly
/// the checked ones. A refused name fails the connection with the [`Refusal`] as its source.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub policy: Arc<Policy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let addrs = policy.resolve(name.as_str(), 0).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The refusal somewhere in an error's source chain (a resolver's refusal travels inside reqwest's
/// and hyper's errors).
pub fn find_refusal<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        if let Some(ResolveError::Refused(refusal)) = e.downcast_ref::<ResolveError>() {
            return Some(refusal);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(url: &str) -> Option<&'static str> {
        let url = Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        Policy::new(&[80, 443], &[], &[]).check_url(&url).err().map(|r| r.rule.name())
    }

    #[test]
    fn addresses_in_urls_are_judged_in_every_spelling() {
        for (url, rule) in [
            ("http://127.0.0.1/", "loopback"),
            ("http://127.1/", "loopback"),
            ("http://2130706433/", "loopback"),
            ("http://0x7f000001/", "loopback"),
            ("http://0177.0.0.1/", "loopback"),
            ("http://0x7f.0.0.1/", "loopback"),
            ("http://[::1]/", "loopback"),
            ("http://[::ffff:127.0.0.1]/", "loopback"),
            ("http://[::ffff:7f00:1]/", "loopback"),
            ("http://[::127.0.0.1]/", "loopback"),
            ("http://[64:ff9b::a00:1]/", "private"),
            ("http://[2002:a9fe:a9fe::]/", "link-local"),
            ("http://localhost/", "loopback"),
            ("http://LocalHost./", "loopback"),
            ("http://api.localhost/", "loopback"),
            ("http://10.1.2.3/", "private"),
            ("http://172.16.0.1/", "private"),
            ("http://172.31.255.255/", "private"),
            ("http://192.168.1.1/", "private"),
            ("http://169.254.169.254/latest/meta-data/", "link-local"),
            ("http://100.64.0.1/", "cgnat"),
            ("http://100.127.255.255/", "cgnat"),
            ("http://0.0.0.0/", "unspecified"),
            ("http://0/", "unspecified"),
            ("http://224.0.0.1/", "multicast"),
            ("http://255.255.255.255/", "broadcast"),
            ("http://192.0.2.1/", "reserved"),
            ("http://240.0.0.1/", "reserved"),
            ("http://[fc00::1]/", "private"),
            ("http://[fd12:3456::1]/", "private"),
            ("http://[fe80::1]/", "link-local"),
            ("http://[ff02::1]/", "multicast"),
            ("http://[::]/", "unspecified"),
            ("http://[2001:db8::1]/", "reserved"),
            ("http://[2001:0:4136:e378::1]/", "reserved"),
            ("file:///etc/passwd", "scheme"),
            ("gopher://example.com/", "scheme"),
            ("ftp://example.com/", "scheme"),
            ("http://example.com:22/", "port"),
        ] {
            assert_eq!(rule_of(url), Some(rule), "{url}");
        }
        for url in
            ["http://93.184.215.14/", "https://example.com/", "http://[2606:4700::1111]/", "https://172.32.0.1/", "http://100.128.0.1/"]
        {
            assert_eq!(rule_of(url), None, "{url}");
        }
    }

    #[test]
    fn the_refusal_names_the_rule_and_the_metadata_address() {
        let url = Url::parse("http://169.254.169.254/").unwrap_or_else(|e| panic!("{e}"));
        let refusal = Policy::default().check_url(&url).err().map(|r| r.to_string()).unwrap_or_default();
        assert_eq!(refusal, "169.254.169.254 is a link-local address (cloud metadata) (rule `link-local`)");
        let refusal = Policy::default().check_ip("evil.example", "::ffff:10.0.0.1".parse().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(
            refusal.err().map(|r| r.to_string()).unwrap_or_default(),
            "evil.example is ::ffff:10.0.0.1, which embeds 10.0.0.1, a private address (rule `private`)"
        );
    }

    #[test]
    fn allowlists_exempt_hosts_and_ranges_but_not_schemes_or_ports() {
        let policy =
            Policy::new(&[80], &["intranet.test".to_owned(), "*.corp.test".to_owned()], &["10.1.0.0/16".to_owned(), "::1".to_owned()]);
        let check = |url: &str| policy.check_url(&Url::parse(url).unwrap_or_else(|e| panic!("{e}"))).err().map(|r| r.rule.name());
        assert_eq!(check("http://10.1.200.3/"), None);
        assert_eq!(check("http://10.2.0.1/"), Some("private"));
        assert_eq!(check("http://[::1]/"), None);
        assert_eq!(check("http://[::ffff:10.1.0.9]/"), None, "a mapped address is judged as the IPv4 address it maps");
        assert_eq!(check("http://10.1.0.1:8080/"), Some("port"));
        assert_eq!(check("gopher://10.1.0.1/"), Some("scheme"));
        assert!(policy.host_allowed("intranet.test") && policy.host_allowed("INTRANET.TEST."));
        assert!(policy.host_allowed("a.corp.test") && !policy.host_allowed("corp.test") && !policy.host_allowed("evilcorp.test"));
        let any_port = Policy::new(&[], &[], &[]);
        assert!(any_port.check_url(&Url::parse("http://example.com:1/").unwrap_or_else(|e| panic!("{e}"))).is_ok());
    }

    #[test]
    fn cidrs_parse_and_match() {
        let net = Cidr::parse("172.16.0.0/12").unwrap_or_else(|e| panic!("{e}"));
        assert!(net.contains("172.31.1.1".parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))));
        assert!(!net.contains("172.32.0.0".parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))));
        assert!(Cidr::parse("0.0.0.0/0").is_ok_and(|c| c.contains(IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)))));
        assert!(Cidr::parse("::/129").is_err() && Cidr::parse("10.0.0.0/x").is_err() && Cidr::parse("host").is_err());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_after_resolution() {
        let policy = Policy::default();
        let refused = policy.resolve("localhost", 80).await;
        assert!(matches!(&refused, Err(ResolveError::Refused(r)) if r.rule == Rule::Loopback), "{refused:?}");
        let allowed = Policy::new(&[], &["localhost".to_owned()], &[]).resolve("localhost", 80).await;
        assert!(allowed.is_ok_and(|a| !a.is_empty()));
    }
}
