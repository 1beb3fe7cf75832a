//! Backoff: how long to wait before retry number `n`, and a retry loop built on it. One module for
//! every retry in the suite (gRPC clients, model calls, SQLite busy, migrations racing between
//! replicas, the PostgreSQL listener), so the growth, cap and jitter are written once and named where
//! they are used.
//!
//! Written here rather than taken from `backon` or `backoff`: the loops differ in what they need
//! beside the delay — a floor from the callee's `retry-after`, a wait that gives up at shutdown, a
//! count reset after a success — so each keeps its own loop around [`Backoff::delay`], and the two
//! plain ones use [`Backoff::retry`]. That is ~60 lines, against a dependency whose retry loop
//! four of the five callers could not use.

use std::future::Future;
use std::time::Duration;

/// How the delay grows with the retry number `n` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// `base * 2^(n-1)`.
    Doubling,
    /// `base * n`.
    Linear,
}

/// How much of the delay is random, so that callers hit by the same outage do not retry in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the computed delay.
    None,
    /// Half fixed, half random: in `[delay / 2, delay]`, never at once.
    Equal,
    /// Anywhere in `[0, delay]` (whole milliseconds; at least a 1 ms ceiling).
    Full,
}

/// A backoff policy: growth from `base`, capped at `cap`, with `jitter`, for at most `retries`
/// retries (None: no limit; the caller stops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub growth: Growth,
    pub jitter: Jitter,
    pub retries: Option<u32>,
}

impl Backoff {
    /// `base` doubling up to `cap`, no jitter, no retry limit.
    pub const fn doubling(base: Duration, cap: Duration) -> Self {
        Self { base, cap, growth: Growth::Doubling, jitter: Jitter::None, retries: None }
    }

    /// `step * n`, uncapped, no jitter, no retry limit.
    pub const fn linear(step: Duration) -> Self {
        Self { base: step, cap: Duration::MAX, growth: Growth::Linear, jitter: Jitter::None, retries: None }
    }

    pub const fn with_jitter(self, jitter: Jitter) -> Self {
        Self { jitter, ..self }
    }

    pub const fn with_retries(self, retries: u32) -> Self {
        Self { retries: Some(retries), ..self }
    }

    /// The wait before retry `n` (1-based: after the `n`th failed attempt).
    pub fn delay(&self, n: u32) -> Duration {
        let n = n.max(1);
        let grown = match self.growth {
            Growth::Doubling => self.base.saturating_mul(1u32 << (n - 1).min(30)),
            Growth::Linear => self.base.saturating_mul(n),
        };
        let delay = grown.min(self.cap);
        match self.jitter {
            Jitter::None => delay,
            Jitter::Equal => {
                let half = delay / 2;
                half + half.mul_f64(fastrand::f64())
            }
            Jitter::Full => {
                let ceiling = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX).max(1);
                Duration::from_millis(fastrand::u64(0..=ceiling))
            }
        }
    }

    /// Runs `op` until it succeeds, `retry` says no, or the retries are spent. After the `n`th failure
    /// `retry(&error, n, delay)` decides: None returns the error, `Some(wait)` sleeps `wait` (the
    /// policy's `delay`, or a longer one the error asks for) and tries again.
    pub async fn retry<T, E, F, Fut, R>(&self, mut op: F, mut retry: R) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnMut(&E, u32, Duration) -> Option<Duration>,
    {
        let mut failures = 0u32;
        loop {
            let error = match op().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            failures += 1;
            if self.retries.is_some_and(|limit| failures > limit) {
                return Err(error);
            }
            match retry(&error, failures, self.delay(failures)) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubling_is_capped_and_linear_grows_by_its_step() {
        let doubling = Backoff::doubling(50 * MS, 1000 * MS);
        let delays: Vec<u128> = (1..=7).map(|n| doubling.delay(n).as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(doubling.delay(u32::MAX), 1000 * MS, "a huge retry number stays at the cap");
        let linear = Backoff::linear(200 * MS);
        assert_eq!((1..=5).map(|n| linear.delay(n).as_millis()).collect::<Vec<_>>(), [200, 400, 600, 800, 1000]);
    }

    #[test]
    fn jitter_stays_in_its_band() {
        let equal = Backoff::doubling(1000 * MS, 8000 * MS).with_jitter(Jitter::Equal);
        let full = Backoff::doubling(100 * MS, 400 * MS).with_jitter(Jitter::Full);
        for (n, ceiling) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 8000)] {
            for _ in 0..50 {
                let d = equal.delay(n).as_millis();
                assert!(d >= ceiling / 2 && d <= ceiling, "equal, retry {n}: {d} ms");
                assert!(full.delay(n).as_millis() <= (100 << (n - 1)).min(400), "full, retry {n}");
            }
        }
        let tiny = Backoff::doubling(Duration::ZERO, Duration::ZERO).with_jitter(Jitter::Full);
        assert!(tiny.delay(1) <= MS, "a zero ceiling still has 1 ms of room");
    }

    #[tokio::test]
    async fn retry_stops_at_the_limit_or_when_told() {
        let policy = Backoff::doubling(MS, 10 * MS).with_retries(3);
        let mut calls = 0;
        let mut seen = Vec::new();
        let result: Result<(), &str> = policy
            .retry(
                || {
                    calls += 1;
                    async { Err("busy") }
                },
                |_, n, delay| {
                    seen.push((n, delay.as_millis()));
                    Some(delay)
                },
            )
            .await;
        assert_eq!((result, calls), (Err("busy"), 4), "one attempt and three retries");
        assert_eq!(seen, [(1, 1), (2, 2), (3, 4)]);

        let mut calls = 0;
        let refused: Result<(), &str> = policy
            .retry(
                || {
                    calls += 1;
                    async { Err("fatal") }
                },
                |_, _, _| None,
            )
            .await;
        assert_eq!((refused, calls), (Err("fatal"), 1));

        let mut calls = 0;
        let recovered = policy
            .retry(
                || {
                    calls += 1;
                    let ok = calls == 2;
                    async move { if ok { Ok(calls) } else { Err("once") } }
                },
                |_, _, delay| Some(delay),
            )
            .await;
        assert_eq!(recovered, Ok(2));
    }
}
