//! A run's status as a type, its stored form, and the one table of transitions the lifecycle makes.
//!
//! The store keeps the status as text (`runs.status`, `runs.final_status`) so SQL can filter on it
//! on both backends; the entity reads and writes it as [`Status`] (a sea-orm active enum over that
//! text). Every write goes through a compare-and-set on the expected current status, and
//! [`Status::can_become`] is the table those writes follow (tested below for every pair).

use antler_proto::runs::RunStatus;
use sea_orm::{DeriveActiveEnum, EnumIter};

/// See the module documentation. The `string_value`s are the stored form ([`Status::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum Status {
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "running")]
    Running,
    #[sea_orm(string_value = "finalizing")]
    Finalizing,
    #[sea_orm(string_value = "success")]
    Success,
    #[sea_orm(string_value = "error")]
    Error,
    #[sea_orm(string_value = "interrupted")]
    Interrupted,
    #[sea_orm(string_value = "timeout")]
    Timeout,
}

impl Status {
    pub const ALL: [Status; 7] =
        [Status::Pending, Status::Running, Status::Finalizing, Status::Success, Status::Error, Status::Interrupted, Status::Timeout];

    /// Statuses in which a run occupies its thread.
    pub const ACTIVE: [Status; 3] = [Status::Pending, Status::Running, Status::Finalizing];

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

    /// The status an API value names; None for UNSPECIFIED.
    pub fn from_proto(status: RunStatus) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.to_proto() == status)
    }
}

/// The stored form, as logs and SQL text show it.
impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn the_stored_form_round_trips() {
        use sea_orm::{ActiveEnum, Iterable};
        assert_eq!(Status::iter().collect::<Vec<_>>(), Status::ALL);
        for status in Status::ALL {
            assert_eq!(status.to_value(), status.as_str());
            assert_eq!(Status::try_from_value(&status.as_str().to_owned()).ok(), Some(status));
            assert_ne!(status.to_proto(), RunStatus::Unspecified);
            assert_eq!(Status::from_proto(status.to_proto()), Some(status));
        }
        assert_eq!(Status::from_proto(RunStatus::Unspecified), None);
        assert!(Status::try_from_value(&"queued".to_owned()).is_err());
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
