//! How long to wait before the next attempt.
//!
//! Exponential backoff `base * 2^(attempt-1)` capped at `cap` (DeerFlow's `LLMErrorHandlingMiddleware`
//! numbers: 1 s, 2 s, 4 s, 8 s), with "equal jitter" (half fixed, half random) so that many callers hit by
//! the same outage do not retry in lock-step, yet never retry at once. An upstream `Retry-After` is a
//! floor: we wait at least that long.

use std::time::{Duration, SystemTime};

use antler_kit::backoff::{Backoff, Jitter};
use reqwest::header::HeaderMap;

use crate::spec::RetryPolicy;

/// Delay before attempt `attempt + 1`, after `attempt` (1-based) failed. `retry_after` is the upstream's ask.
pub fn backoff(policy: &RetryPolicy, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let jittered = Backoff::doubling(policy.base_delay, policy.cap_delay).with_jitter(Jitter::Equal).delay(attempt);
    match retry_after {
        Some(asked) => jittered.max(asked),
        None => jittered,
    }
}

/// The wait an HTTP answer asks for: `retry-after-ms` (OpenAI), then `Retry-After` as seconds or an
/// HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers.get("retry-after-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base_delay: Duration::from_millis(1000),
            cap_delay: Duration::from_millis(8000),
            max_retry_after: Duration::from_secs(60),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        for (attempt, full) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 8000)] {
            for _ in 0..50 {
                let d = backoff(&policy(), attempt, None).as_millis();
                assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d} ms");
            }
        }
    }

    #[test]
    fn retry_after_is_a_floor() {
        let d = backoff(&policy(), 1, Some(Duration::from_secs(5)));
        assert!(d >= Duration::from_secs(5), "{d:?}");
    }

    #[test]
    fn retry_after_headers_are_read_in_every_form() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        let mut dated = HeaderMap::new();
        let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        dated.insert("retry-after", HeaderValue::from_str(&future).unwrap_or(HeaderValue::from_static("0")));
        let got = retry_after(&dated).unwrap_or_default();
        assert!(got > Duration::from_secs(25) && got <= Duration::from_secs(30), "{got:?}");
        let mut junk = HeaderMap::new();
        junk.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&junk), None);
    }
}
