//! Bounds on failed browser sign-ins (`POST /api/v1/auth/login/local`), per username and per client
//! address, over a sliding window (`edge.gateway.auth`). A sign-in is checked against both before its
//! credential is looked at; one whose credential is refused (401) is then counted against both. Past
//! either bound the route answers 429 with `Retry-After` (the seconds until the oldest counted failure
//! leaves the window) and a message naming the setting, whatever the credential, so guessing costs a
//! window per `max_failed_logins_*` tries.
//!
//! The counts live in this process (each edge replica counts its own). Both maps are bounded by
//! `max_tracked`: a full map first drops the names whose failures have all left the window, then the
//! one idle the longest.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::GatewayAuthConfig;

/// Why a sign-in is refused before its credential is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// Whole seconds until a sign-in may be tried again (at least 1).
    pub retry_after_secs: u64,
    /// What was throttled, e.g. `username `alice``, `address 203.0.113.7`.
    pub what: String,
    /// The failures counted, and the bound.
    pub limit: u32,
    /// The setting that sets the bound.
    pub setting: &'static str,
    pub window_secs: u64,
}

impl Throttled {
    pub fn message(&self) -> String {
        format!(
            "too many failed sign-ins for {}: {} within {} s (edge.gateway.auth.{}; window edge.gateway.auth.failed_login_window_secs)\nhint: retry after {} s",
            self.what, self.limit, self.window_secs, self.setting, self.retry_after_secs
        )
    }
}

/// Failure times per key, oldest first, each list at most the bound long.
#[derive(Debug)]
struct Failures<K> {
    by_key: HashMap<K, VecDeque<Instant>>,
}

impl<K: Hash + Eq + Clone> Failures<K> {
    fn new() -> Self {
        Self { by_key: HashMap::new() }
    }

    /// The failures of `key` still inside the window (older ones are dropped first).
    fn recent(&mut self, key: &K, now: Instant, window: Duration) -> Option<&VecDeque<Instant>> {
        let times = self.by_key.get_mut(key)?;
        while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= window) {
            times.pop_front();
        }
        if times.is_empty() {
            self.by_key.remove(key);
            return None;
        }
        self.by_key.get(key)
    }

    /// Refused when `key` already has `limit` failures in the window; the wait is until the oldest leaves.
    fn check(&mut self, key: &K, limit: u32, now: Instant, window: Duration) -> Option<u64> {
        if limit == 0 {
            return None;
        }
        let times = self.recent(key, now, window)?;
        if times.len() < limit as usize {
            return None;
        }
        let oldest = *times.front()?;
        let left = window.saturating_sub(now.saturating_duration_since(oldest));
        Some(left.as_secs() + u64::from(left.subsec_nanos() > 0)).map(|s| s.max(1))
    }

    fn record(&mut self, key: K, limit: u32, now: Instant, window: Duration, max_tracked: usize) {
        if limit == 0 {
            return;
        }
        if !self.by_key.contains_key(&key) && self.by_key.len() >= max_tracked {
            self.by_key.retain(|_, times| times.back().is_some_and(|t| now.saturating_duration_since(*t) < window));
            if self.by_key.len() >= max_tracked {
                let idle = self.by_key.iter().min_by_key(|(_, times)| times.back().copied()).map(|(k, _)| k.clone());
                if let Some(idle) = idle {
                    self.by_key.remove(&idle);
                }
            }
        }
        let times = self.by_key.entry(key).or_default();
        times.push_back(now);
        // Only `limit` failures matter: the bound is reached, and the wait runs from the oldest kept.
        while times.len() > limit as usize {
            times.pop_front();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// The failed sign-ins of this edge process.
#[derive(Debug)]
pub struct LoginLimiter {
    config: GatewayAuthConfig,
    state: Mutex<(Failures<String>, Failures<IpAddr>)>,
}

/// The username as it is counted: trimmed, lower case (the UI sends e-mail addresses).
fn normalise(username: &str) -> String {
    username.trim().to_lowercase()
}

impl LoginLimiter {
    pub fn new(config: GatewayAuthConfig) -> Self {
        Self { config, state: Mutex::new((Failures::new(), Failures::new())) }
    }

    fn window(&self) -> Duration {
        Duration::from_secs(self.config.failed_login_window_secs)
    }

    /// Whether a sign-in for `username` from `address` may be checked now.
    pub fn check(&self, username: &str, address: Option<IpAddr>, now: Instant) -> Result<(), Throttled> {
        let window = self.window();
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (users, addresses) = &mut *state;
        let username = normalise(username);
        let throttled = |retry_after_secs, what, limit, setting| Throttled {
            retry_after_secs,
            what,
            limit,
            setting,
            window_secs: self.config.failed_login_window_secs,
        };
        let per_user = self.config.max_failed_logins_per_username;
        if let Some(wait) = users.check(&username, per_user, now, window) {
            return Err(throttled(wait, format!("username `{username}`"), per_user, "max_failed_logins_per_username"));
        }
        let per_address = self.config.max_failed_logins_per_address;
        if let Some(address) = address
            && let Some(wait) = addresses.check(&address, per_address, now, window)
        {
            return Err(throttled(wait, format!("address {address}"), per_address, "max_failed_logins_per_address"));
        }
        Ok(())
    }

    /// Counts a refused credential against `username` and `address`.
    pub fn failed(&self, username: &str, address: Option<IpAddr>, now: Instant) {
        let window = self.window();
        let max_tracked = self.config.max_tracked as usize;
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (users, addresses) = &mut *state;
        users.record(normalise(username), self.config.max_failed_logins_per_username, now, window, max_tracked);
        if let Some(address) = address {
            addresses.record(address, self.config.max_failed_logins_per_address, now, window, max_tracked);
        }
    }

    /// The client's address: from `client_address_header` when set and present (for
    /// `X-Forwarded-For`, its last entry: the one the proxy in front appended), else the TCP peer's.
    pub fn client_address(&self, headers: &axum::http::HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        let header = self.config.client_address_header.trim();
        if header.is_empty() {
            return peer;
        }
        let forwarded = headers
            .get_all(header)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .rfind(|v| !v.trim().is_empty())
            .and_then(|v| parse_address(v.trim()));
        forwarded.or(peer)
    }
}

/// An address as proxies write it: `203.0.113.7`, `203.0.113.7:5123`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_address(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    text.parse::<std::net::SocketAddr>().ok().map(|s| s.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_user: u32, per_address: u32, window_secs: u64, max_tracked: u32) -> LoginLimiter {
        LoginLimiter::new(GatewayAuthConfig {
            max_failed_logins_per_username: per_user,
            max_failed_logins_per_address: per_address,
            failed_login_window_secs: window_secs,
            client_address_header: "x-forwarded-for".to_owned(),
            max_tracked,
        })
    }

    #[test]
    fn a_username_is_refused_after_its_failures_until_the_oldest_leaves_the_window() {
        let limits = limiter(3, 100, 60, 100);
        let t0 = Instant::now();
        let from: Option<IpAddr> = "203.0.113.7".parse().ok();
        for i in 0..3 {
            assert_eq!(limits.check("Alice", from, t0 + Duration::from_secs(i)), Ok(()));
            limits.failed("Alice", from, t0 + Duration::from_secs(i));
        }
        let refused = limits.check(" alice ", from, t0 + Duration::from_secs(10)).expect_err("the fourth try is refused");
        assert_eq!(refused.setting, "max_failed_logins_per_username");
        assert_eq!(refused.retry_after_secs, 50, "the first failure leaves the window at t0 + 60 s");
        assert!(refused.message().contains("edge.gateway.auth.max_failed_logins_per_username"), "{}", refused.message());
        assert!(refused.message().contains("username `alice`"), "{}", refused.message());
        // Another username from another address is not affected.
        assert_eq!(limits.check("bob", "198.51.100.1".parse().ok(), t0 + Duration::from_secs(10)), Ok(()));
        // Sliding: at 60 s the first failure is gone, the other two still count.
        assert_eq!(limits.check("alice", from, t0 + Duration::from_secs(60)), Ok(()));
        limits.failed("alice", from, t0 + Duration::from_secs(60));
        assert_eq!(limits.check("alice", from, t0 + Duration::from_millis(60_500)).map_err(|t| t.retry_after_secs), Err(1));
        assert_eq!(limits.check("alice", from, t0 + Duration::from_secs(61)), Ok(()), "the failure at 1 s has left the window");
    }

    #[test]
    fn an_address_is_refused_after_its_failures_whatever_the_username() {
        let limits = limiter(100, 4, 30, 100);
        let t0 = Instant::now();
        let from: Option<IpAddr> = "2001:db8::1".parse().ok();
        for i in 0..4 {
            limits.failed(&format!("user-{i}"), from, t0);
        }
        let refused = limits.check("someone-new", from, t0 + Duration::from_millis(1500)).expect_err("the address is throttled");
        assert_eq!((refused.setting, refused.retry_after_secs), ("max_failed_logins_per_address", 29));
        assert_eq!(limits.check("someone-new", "2001:db8::2".parse().ok(), t0), Ok(()));
        // 0 turns a bound off.
        let unbounded = limiter(0, 0, 30, 100);
        for _ in 0..1000 {
            unbounded.failed("x", from, t0);
        }
        assert_eq!(unbounded.check("x", from, t0), Ok(()));
    }

    #[test]
    fn the_maps_stay_bounded_by_max_tracked() {
        let limits = limiter(5, 5, 60, 16);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            let address = IpAddr::from(i.to_be_bytes());
            limits.failed(&format!("name-{i}"), Some(address), t0 + Duration::from_millis(i.into()));
        }
        let state = limits.state.lock().expect("not poisoned");
        assert!(state.0.len() <= 16 && state.1.len() <= 16, "{} usernames, {} addresses", state.0.len(), state.1.len());
        // The newest are kept.
        assert!(state.0.by_key.contains_key("name-999"));
    }

    #[test]
    fn the_client_address_comes_from_the_configured_header_or_the_peer() {
        let limits = limiter(1, 1, 1, 16);
        let peer: Option<IpAddr> = "127.0.0.1".parse().ok();
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(limits.client_address(&headers, peer), peer);
        headers.insert("x-forwarded-for", axum::http::HeaderValue::from_static("10.0.0.9, 203.0.113.7:5123"));
        assert_eq!(limits.client_address(&headers, peer), "203.0.113.7".parse().ok());
        headers.insert("x-forwarded-for", axum::http::HeaderValue::from_static("[2001:db8::1]:443"));
        assert_eq!(limits.client_address(&headers, peer), "2001:db8::1".parse().ok());
        headers.insert("x-forwarded-for", axum::http::HeaderValue::from_static("not an address"));
        assert_eq!(limits.client_address(&headers, peer), peer);
        let direct = LoginLimiter::new(GatewayAuthConfig::default());
        headers.insert("x-forwarded-for", axum::http::HeaderValue::from_static("203.0.113.7"));
        assert_eq!(direct.client_address(&headers, peer), peer, "without the setting the header is not trusted");
    }
}
