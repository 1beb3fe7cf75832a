//! FINALIZING: the exclusive step between the agent's last word and the terminal status. It writes
//! the delivery receipt exactly once, then the terminal status, then END — always last.
//!
//! Both steps are one transaction and, since #32, one UPDATE of the run's row: RUNNING → FINALIZING
//! (receipt and `final_status`) → the terminal status, with the DELIVERY and END events. A worker that
//! dies before the commit leaves the run RUNNING (taken over like any other); after it, the run is
//! closed; nothing is in between. (They were two commits, then two UPDATEs in one commit, until #32:
//! the FINALIZING row was never visible to anyone, and each form cost the one SQLite writer
//! statements per run for a window in which nothing happens.) A FINALIZING row found by the sweeper
//! (written by an older replica) is still closed without anything being re-run (`lease::sweep`).

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{DeliveryReceipt, EndEvent, RunError, RunEvent, RunUsage};
use prost::Message;
use sea_orm::{ColumnTrait, EntityTrait};

use std::sync::Arc;

use sea_orm::DatabaseTransaction;

use super::{cancel, end_run, promote_next_queued, start};
use crate::engine::Engine;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::runs;
use crate::store::{Priority, now_ms};
use crate::stream::{SeqUpdate, Writer, append_returning};

pub use antler_agent::{Outcome, Outputs};

/// The receipt: every declared output must exist and every produced output must have been presented.
pub fn receipt(declared: &[String], outputs: &Outputs) -> DeliveryReceipt {
    let produced_paths: Vec<&str> = outputs.produced.iter().map(|f| f.path.as_str()).collect();
    let exists = |path: &str| produced_paths.contains(&path) || outputs.existing.iter().any(|e| e == path);
    let mut missing: Vec<String> = declared.iter().filter(|p| !exists(p)).cloned().collect();
    missing.extend(produced_paths.iter().filter(|p| !outputs.presents(p)).map(|p| p.to_string()));
    missing.sort();
    missing.dedup();
    DeliveryReceipt {
        produced: outputs.produced.clone(),
        presented: outputs.presented.clone(),
        declared: declared.to_vec(),
        satisfied: missing.is_empty(),
        missing,
    }
}

/// What [`finalize`] wrote.
#[derive(Debug, Default)]
pub struct Finalized {
    /// The run's closing events (none when it was fenced: nothing written).
    pub events: Vec<RunEvent>,
    /// The PENDING run started in the closing commit, when the caller asked to hand its slot over:
    /// the caller runs it under the slot it holds.
    pub next: Option<runs::Model>,
}

/// Finalizes a run this worker executed. Returns what it wrote, or None when the worker no longer
/// owns the run (fenced: nothing was written). With `hand_over`, the closing transaction also starts
/// the next startable PENDING run (`start::start_next_in`), unless the service is shutting down or
/// runs of dead replicas wait (the dispatcher takes those first). A failure there fails the closing
/// transaction like any of its statements: nothing is written, and the run stays RUNNING until it is
/// finalized again or its lease lapses.
pub async fn finalize(
    engine: &Engine,
    run: &runs::Model,
    declared: &[String],
    outcome: Outcome,
    hand_over: bool,
) -> Result<Option<Finalized>, RunsError> {
    let (mut status, mut stop_reason, mut error, outputs, cancelled) = match outcome {
        Outcome::Completed { stop_reason, outputs } => (Status::Success, stop_reason, None, outputs, false),
        // A failed run's stop_reason is its error code (documented with RunError.code).
        Outcome::Failed(error) => (Status::Error, error.code.clone(), Some(error), Outputs::default(), false),
        Outcome::Cancelled { outputs } => (Status::Interrupted, "cancelled".to_owned(), None, outputs, true),
        Outcome::TimedOut { limit, outputs } => {
            let error = RunError {
                code: "deadline_exceeded".to_owned(),
                message: format!(
                    "the run was still running after its max_duration of {:.0} s and was stopped\nhint: raise config.max_duration (up to runs.max_run_duration_secs) or split the task",
                    limit.as_secs_f64()
                ),
                retryable: false,
                details: None,
            };
            (Status::Timeout, "deadline_exceeded".to_owned(), Some(error), outputs, false)
        }
    };
    let receipt = receipt(declared, &outputs);
    if status == Status::Success && !receipt.satisfied {
        status = Status::Error;
        stop_reason = "delivery_incomplete".to_owned();
        error = Some(RunError {
            code: "delivery_incomplete".to_owned(),
            message: format!("the run reported success, but these outputs were not delivered: {}", receipt.missing.join(", ")),
            retryable: false,
            details: None,
        });
    }

    let hand_over = hand_over && !engine.shutting_down() && engine.dead_owners().is_empty() && !engine.takeovers_waiting();
    let closing = Arc::new(Closing {
        run: run.clone(),
        worker: engine.worker_id().to_owned(),
        status,
        stop_reason,
        error,
        receipt,
        cancelled,
        hand_over: hand_over.then(|| start::Claimant::of(engine)),
    });
    let closed = engine
        .store()
        .write(Priority::Lifecycle, move |tx| {
            let closing = closing.clone();
            Box::pin(async move { close(tx, &closing).await })
        })
        .await?;
    let finalized = match closed {
        Closed::Fenced => return Ok(None),
        Closed::Interrupted { end, promoted, stop_reason } => {
            tracing::info!(run_id = %run.run_id, %stop_reason, "run interrupted");
            if promoted {
                engine.wake_dispatcher();
            }
            Finalized { events: vec![end], next: None }
        }
        Closed::Finished { events, next, promoted, status, stop_reason } => {
            metrics::counter!("antler_run_transitions_total", "to" => Status::Finalizing.as_str()).increment(1);
            metrics::counter!("antler_run_transitions_total", "to" => status.as_str()).increment(1);
            if next.is_some() {
                start::count_started(1);
                metrics::counter!("antler_run_handovers_total").increment(1);
            }
            tracing::info!(run_id = %run.run_id, %status, %stop_reason, "run finished");
            if promoted {
                engine.wake_dispatcher();
            }
            Finalized { events, next }
        }
    };
    Ok(Some(finalized))
}

/// What the closing transaction needs, owned (it runs on the store's writer thread).
struct Closing {
    run: runs::Model,
    worker: String,
    status: Status,
    stop_reason: String,
    error: Option<RunError>,
    receipt: DeliveryReceipt,
    cancelled: bool,
    /// Start the next startable run in the same commit, as this claimant.
    hand_over: Option<start::Claimant>,
}

/// What the closing transaction did.
enum Closed {
    /// The worker no longer owns the run: nothing was written.
    Fenced,
    /// Cancelled (or a cancel request won the race with the completion): ended INTERRUPTED.
    Interrupted {
        end: RunEvent,
        promoted: bool,
        stop_reason: String,
    },
    Finished {
        events: Vec<RunEvent>,
        next: Option<runs::Model>,
        promoted: bool,
        status: Status,
        stop_reason: String,
    },
}

/// The closing transaction: RUNNING → FINALIZING → the terminal status, with the receipt, the
/// intended status (`final_status`), the DELIVERY and END events, the thread's next queued run, and
/// (with `hand_over`) the next startable run — one commit. RUNNING → FINALIZING → terminal is one
/// UPDATE: FINALIZING is never stored on this path (nothing could see it: it was only ever held
/// inside this transaction), so writing it and then overwriting it was a statement per run for nothing.
async fn close(tx: &DatabaseTransaction, c: &Closing) -> Result<Closed, RunsError> {
    let run = &c.run;
    let worker = c.worker.as_str();
    let now = now_ms();
    // A completion only wins while no cancel was requested: the first cancel request beats a
    // completion that races it.
    let closed = if c.cancelled {
        None
    } else {
        let update = SeqUpdate {
            count: 2,
            columns: vec![
                (runs::Column::Status, c.status.into()),
                (runs::Column::FinalStatus, Some(c.status).into()),
                (runs::Column::StopReason, c.stop_reason.clone().into()),
                (runs::Column::ErrorCode, c.error.as_ref().map(|e| e.code.clone()).into()),
                (runs::Column::ErrorMessage, c.error.as_ref().map(|e| antler_kit::redact::redact(&e.message).into_owned()).into()),
                (runs::Column::Delivery, c.receipt.encode_to_vec().into()),
                (runs::Column::FinishedAt, now.into()),
                (runs::Column::LeaseExpiresAt, Option::<i64>::None.into()),
            ],
            conditions: vec![runs::Column::Status.eq(Status::Running), runs::Column::CancelAction.is_null()],
            returning: vec![runs::Column::Usage],
        };
        // The receipt, then END (always last), in the statement that also makes the status terminal.
        append_returning(tx, &run.run_id, &run.thread_id, Writer::Owner(worker), update, |row| {
            let usage: Vec<u8> = row.try_get("", "usage")?;
            let end = Kind::End(EndEvent {
                status: c.status.to_proto() as i32,
                stop_reason: c.stop_reason.clone(),
                error: c.error.clone(),
                usage: Some(RunUsage::decode(usage.as_slice()).unwrap_or_default()),
            });
            Ok(vec![Kind::Delivery(c.receipt.clone()), end])
        })
        .await?
    };
    let Some(events) = closed else {
        // Cancelled, or a cancel request raced this completion and won: the run ends INTERRUPTED
        // here, in one step — nothing remains to deliver, so there is no FINALIZING and no receipt.
        let current = runs::Entity::find_by_id(run.run_id.clone()).one(tx).await?;
        let Some(current) = current.filter(|c| c.cancel_action.is_some()) else { return Ok(Closed::Fenced) };
        let ending = cancel::ending_of(&current);
        let Some(end) = end_run(tx, &current, &[Status::Running], Some(worker), &ending).await? else {
            return Ok(Closed::Fenced);
        };
        let promoted = promote_next_queued(tx, &run.user_id, &run.thread_id).await?;
        return Ok(Closed::Interrupted { end, promoted, stop_reason: ending.stop_reason });
    };
    let promoted = promote_next_queued(tx, &run.user_id, &run.thread_id).await?;
    let next = match &c.hand_over {
        Some(claimant) => start::start_next_in(tx, claimant).await?,
        None => None,
    };
    Ok(Closed::Finished { events, next, promoted, status: c.status, stop_reason: c.stop_reason.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::runs::OutputFile;

    fn file(path: &str) -> OutputFile {
        OutputFile { path: path.to_owned(), size: 1, sha256: String::new(), mime_type: String::new() }
    }

    #[test]
    fn success_needs_every_declared_output_and_every_produced_one_presented() {
        let declared = vec!["/mnt/user-data/outputs/report.md".to_owned()];
        let none = receipt(&declared, &Outputs::default());
        assert!(!none.satisfied);
        assert_eq!(none.missing, declared);

        let produced = vec![file("/mnt/user-data/outputs/report.md")];
        let unpresented = receipt(&declared, &Outputs { produced: produced.clone(), ..Outputs::default() });
        assert!(!unpresented.satisfied, "produced but never presented");

        let ok = receipt(&declared, &Outputs { produced: produced.clone(), presented: declared.clone(), ..Outputs::default() });
        assert!(ok.satisfied && ok.missing.is_empty());

        let by_directory =
            receipt(&declared, &Outputs { produced, presented: vec!["/mnt/user-data/outputs/".to_owned()], ..Outputs::default() });
        assert!(by_directory.satisfied, "a presented directory covers its files");
        let sibling = receipt(
            &[],
            &Outputs {
                produced: vec![file("/mnt/user-data/outputs-2/x")],
                presented: vec!["/mnt/user-data/outputs".to_owned()],
                ..Outputs::default()
            },
        );
        assert!(!sibling.satisfied, "a prefix that is not a directory covers nothing");
    }

    #[test]
    fn a_declared_output_left_unchanged_from_an_earlier_run_still_exists() {
        let declared = vec!["/mnt/user-data/outputs/report.md".to_owned()];
        let outputs = Outputs { existing: declared.clone(), ..Outputs::default() };
        let receipt = receipt(&declared, &outputs);
        assert!(receipt.satisfied, "{:?}", receipt.missing);
        assert!(receipt.produced.is_empty());
    }
}
