//! A run's status as a type, its stored form, and the one table of transitions the lifecycle makes.
//!
//! The store keeps the status as text (`runs.status`) so SQL can filter on it on both backends; every
//! write goes through a compare-and-set on the expected current status, and [`Status::can_become`]
//! is the table those writes follow (tested below for every pair).

use antler_proto::runs::RunStatus;

/// See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    Running,
    Finalizing,
    Success,
    Error,
    Interrupted,
    Timeout,
}

pub const PENDING: &str = Status::Pending.as_str();
pub const RUNNING: &str = Status::Running.as_str();
pub const FINALIZING: &str = Status::Finalizing.as_str();
pub const SUCCESS: &str = Status::Success.as_str();
pub const ERROR: &str = Status::Error.as_str();
pub const INTERRUPTED: &str = Status::Interrupted.as_str();
pub const TIMEOUT: &str = Status::Timeout.as_str();

/// Statuses in which a run occupies its thread.
pub const ACTIVE: [&str; 3] = [PENDING, RUNNING, FINALIZING];

impl Status {
    pub const ALL: [Status; 7] =
        [Status::Pending, Status::Running, Status::Finalizing, Status::Success, Status::Error, Status::Interrupted, Status::Timeout];

    /// The stored form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Finalizing => "finalizing",
            Status::Success => "success",
            Status::Error => "error",
            Status::Interrupted => "interrupted",
            Status::Timeout => "timeout",
        }
    }

    /// The stored form back; None for text no version of Antler wrote.
    pub fn parse(stored: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == stored)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Success | Status::Error | Status::Interrupted | Status::Timeout)
    }

    /// Whether the lifecycle ever moves a run from `self` to `next`:
    /// PENDING → RUNNING (try_start), PENDING → INTERRUPTED (cancel or supersession before start),
    /// PENDING → ERROR (a start failure, too many attempts); RUNNING → FINALIZING (the agent
    /// completed), RUNNING → INTERRUPTED (a cancel that won), RUNNING → ERROR (takeovers exhausted, a
    /// failed agent), RUNNING → TIMEOUT (max_duration); FINALIZING → SUCCESS | ERROR | INTERRUPTED |
    /// TIMEOUT (the closing, by the finalizer or the sweeper). A terminal status never changes, and a
    /// cancelled run never enters FINALIZING.
    pub fn can_become(self, next: Status) -> bool {
        use Status::*;
        matches!(
            (self, next),
            (Pending, Running | Interrupted | Error)
                | (Running, Finalizing | Interrupted | Error | Timeout)
                | (Finalizing, Success | Error | Interrupted | Timeout)
        )
    }

    pub fn to_proto(self) -> RunStatus {
        match self {
            Status::Pending => RunStatus::Pending,
            Status::Running => RunStatus::Running,
            Status::Finalizing => RunStatus::Finalizing,
            Status::Success => RunStatus::Success,
            Status::Error => RunStatus::Error,
            Status::Interrupted => RunStatus::Interrupted,
            Status::Timeout => RunStatus::Timeout,
        }
    }
}

/// The API status of a stored status (UNSPECIFIED for unknown text).
pub fn status_from_str(status: &str) -> RunStatus {
    Status::parse(status).map(Status::to_proto).unwrap_or(RunStatus::Unspecified)
}

/// Whether a stored status is terminal.
pub fn is_terminal(status: &str) -> bool {
    Status::parse(status).is_some_and(Status::is_terminal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn the_stored_form_round_trips() {
        for status in Status::ALL {
            assert_eq!(Status::parse(status.as_str()), Some(status));
            assert_ne!(status.to_proto(), RunStatus::Unspecified);
        }
        assert_eq!(Status::parse("queued"), None);
    }

    #[test]
    fn every_allowed_and_refused_transition() {
        let allowed = [
            (Pending, Running),
            (Pending, Interrupted),
            (Pending, Error),
            (Running, Finalizing),
            (Running, Interrupted),
            (Running, Error),
            (Running, Timeout),
            (Finalizing, Success),
            (Finalizing, Error),
            (Finalizing, Interrupted),
            (Finalizing, Timeout),
        ];
        for from in Status::ALL {
            for to in Status::ALL {
                assert_eq!(from.can_become(to), allowed.contains(&(from, to)), "{from:?} → {to:?}");
            }
        }
        // A terminal status is never overwritten; a cancelled (INTERRUPTED) run never finalizes.
        assert!(Status::ALL.iter().filter(|s| s.is_terminal()).all(|t| Status::ALL.iter().all(|n| !t.can_become(*n))));
        assert!(!Interrupted.can_become(Finalizing) && !Pending.can_become(Finalizing));
    }
}
