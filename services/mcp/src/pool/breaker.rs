//! A per-server circuit breaker on session creation: after `threshold` consecutive failures it opens and
//! refuses new sessions for `reset`; then one trial is let through (half-open), whose outcome closes or
//! re-opens it. Only creation trips it: a tool that fails is the tool's business, not the connection's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The breaker's state as GetPoolStats reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

/// Whether a session may be created now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead; `trial` when this is the half-open probe.
    Go { trial: bool },
    /// Refused; try again after this long.
    Refused { retry_after: Duration },
}

#[derive(Debug, Default)]
struct State {
    failures: u32,
    opened_at: Option<Instant>,
    trial_in_flight: bool,
}

#[derive(Debug)]
pub struct Breaker {
    state: Mutex<State>,
    threshold: u32,
    reset: Duration,
}

impl Breaker {
    pub fn new(threshold: u32, reset: Duration) -> Self {
        Self { state: Mutex::new(State::default()), threshold: threshold.max(1), reset }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn admit(&self) -> Admit {
        let mut state = self.lock();
        let Some(opened_at) = state.opened_at else { return Admit::Go { trial: false } };
        let elapsed = opened_at.elapsed();
        if elapsed < self.reset {
            return Admit::Refused { retry_after: self.reset - elapsed };
        }
        if state.trial_in_flight {
            // One probe at a time; the others wait for its verdict.
            return Admit::Refused { retry_after: Duration::from_secs(1) };
        }
        state.trial_in_flight = true;
        Admit::Go { trial: true }
    }

    pub fn success(&self) {
        *self.lock() = State::default();
    }

    /// Records a failure; true when this one opened (or re-opened) the breaker.
    pub fn failure(&self) -> bool {
        let mut state = self.lock();
        state.failures = state.failures.saturating_add(1);
        let reopen = state.trial_in_flight || (state.opened_at.is_none() && state.failures >= self.threshold);
        state.trial_in_flight = false;
        if reopen {
            state.opened_at = Some(Instant::now());
        }
        reopen
    }

    /// Hands back a half-open trial that was admitted but never started.
    pub fn success_if_trial_unused(&self) {
        self.lock().trial_in_flight = false;
    }

    pub fn state(&self) -> CircuitState {
        let state = self.lock();
        match state.opened_at {
            None => CircuitState::Closed,
            Some(at) if at.elapsed() < self.reset => CircuitState::Open,
            Some(_) => CircuitState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_then_lets_one_trial_through() {
        let breaker = Breaker::new(3, Duration::from_millis(50));
        for _ in 0..2 {
            assert_eq!(breaker.admit(), Admit::Go { trial: false });
            assert!(!breaker.failure());
        }
        assert!(breaker.failure(), "the third failure opens it");
        assert_eq!(breaker.state(), CircuitState::Open);
        assert!(matches!(breaker.admit(), Admit::Refused { .. }));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        assert_eq!(breaker.admit(), Admit::Go { trial: true });
        assert!(matches!(breaker.admit(), Admit::Refused { .. }), "only one trial at a time");
        assert!(breaker.failure(), "a failed trial re-opens it");
        assert_eq!(breaker.state(), CircuitState::Open);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(breaker.admit(), Admit::Go { trial: true });
        breaker.success();
        assert_eq!(breaker.state(), CircuitState::Closed);
        assert_eq!(breaker.admit(), Admit::Go { trial: false });
    }
}
