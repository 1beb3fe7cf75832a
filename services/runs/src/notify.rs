//! Wake-ups instead of polling (DESIGN §7): how stream subscribers and waiters (WaitRun,
//! CancelRun with `wait`, DeleteThread) learn that a run has new events or has ended, and how a cancel
//! requested on one replica reaches the worker that runs the run on another.
//!
//! - In process, the hub (`crate::hub::EventHub`) is a broadcast per watched run: an event committed
//!   here is delivered to this replica's subscribers with its payload, no store read.
//! - Across replicas (PostgreSQL), triggers call `pg_notify` in the transaction of every write that
//!   matters (`store::migration::Notify`): events appended (`e:<seq>:<end>:<run_id>`) and a run's
//!   first cancel request (`c:<run_id>`). Each replica holds ONE listener connection ([`listen`]), not
//!   one per subscriber, and turns notifications into wake-ups of the runs it watches: subscribers
//!   then read only what they miss from the store. Its own writes come back too; they carry a seq the
//!   hub has already delivered and are dropped without waking anyone.
//! - A notification can be missed: the listener's connection drops, or the database restarts. After
//!   every reconnect (LISTEN in place again) the hub wakes every watcher to catch up from the store,
//!   and this replica re-reads the cancel requests of the runs it executes: nothing is lost, and
//!   nothing committed after the LISTEN can be missed.
//! - A slow safety poll ([`safety_poll`], `runs.safety_poll_ms`) is the fallback for what no
//!   notification covers (a half-open listener connection, SQLite files written by another
//!   process): ONE query per replica per period for all watched runs together, never one per
//!   subscriber, so idle subscribers cost the database nothing between polls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use antler_kit::backoff::Backoff;
use sea_orm::{ColumnTrait, DbBackend, EntityTrait, QueryFilter, QuerySelect};

use crate::engine::{Engine, StopCause};
use crate::status::Status;
use crate::store::entity::runs;

/// A notification's payload, parsed (see the module documentation for the formats).
#[derive(Debug, PartialEq, Eq)]
pub enum Note<'a> {
    Events { run_id: &'a str, seq: u64, end: bool },
    Cancel { run_id: &'a str },
}

/// Parses a payload written by the triggers of `store::migration::Notify`; None for anything else.
pub fn parse(payload: &str) -> Option<Note<'_>> {
    if let Some(rest) = payload.strip_prefix("e:") {
        let mut parts = rest.splitn(3, ':');
        let seq = parts.next()?.parse().ok()?;
        let end = parts.next()? == "1";
        let run_id = parts.next().filter(|id| !id.is_empty())?;
        return Some(Note::Events { run_id, seq, end });
    }
    payload.strip_prefix("c:").filter(|id| !id.is_empty()).map(|run_id| Note::Cancel { run_id })
}

/// Starts this replica's listener (PostgreSQL) and safety poll; both stop at shutdown.
pub fn spawn(engine: Arc<Engine>) {
    use tracing::Instrument;
    if engine.store().backend() == DbBackend::Postgres {
        tokio::spawn(listen(engine.clone()).instrument(tracing::info_span!("notify_listener")));
    }
    tokio::spawn(safety_poll(engine).instrument(tracing::info_span!("safety_poll")));
}

/// Acts on one notification.
fn handle(engine: &Engine, payload: &str) {
    match parse(payload) {
        Some(Note::Events { run_id, seq, end }) => {
            metrics::counter!("antler_runs_notifications_total", "kind" => "events").increment(1);
            engine.hub().stored(run_id, seq, end, None);
        }
        Some(Note::Cancel { run_id }) => {
            metrics::counter!("antler_runs_notifications_total", "kind" => "cancel").increment(1);
            if let Some(local) = engine.local_run(run_id) {
                tracing::info!(run_id, "cancel requested (notified); stopping the run");
                local.stop(StopCause::Cancel);
            }
        }
        None => tracing::debug!(payload, "notification not understood; ignored"),
    }
}

/// After (re)connecting: wake every watcher to read the store, and act on cancel requests of the runs
/// executing here that a missed notification may have carried.
async fn resync(engine: &Engine) {
    metrics::counter!("antler_runs_notifications_total", "kind" => "resync").increment(1);
    engine.hub().resync_all();
    let local: Vec<String> = engine.local_runs().into_iter().map(|(run_id, _)| run_id).collect();
    for chunk in local.chunks(POLL_CHUNK) {
        let cancelled: Result<Vec<String>, _> = runs::Entity::find()
            .select_only()
            .column(runs::Column::RunId)
            .filter(runs::Column::RunId.is_in(chunk.iter().map(String::as_str)))
            .filter(runs::Column::CancelAction.is_not_null())
            .into_tuple()
            .all(engine.store().db())
            .await;
        match cancelled {
            Ok(ids) => ids.iter().filter_map(|id| engine.local_run(id)).for_each(|local| local.stop(StopCause::Cancel)),
            // The lease renewal reads cancel requests too; it is the fallback.
            Err(error) => tracing::warn!(%error, "cannot re-read cancel requests after reconnecting"),
        }
    }
}

/// The listener's reconnection backoff: 100 ms doubling to 5 s, no limit (the safety poll covers
/// meanwhile).
const LISTEN_BACKOFF: Backoff = Backoff::doubling(Duration::from_millis(100), Duration::from_secs(5));

/// The listener: one connection per replica, LISTENing on the channel of the triggers. Reconnects
/// with backoff (100 ms doubling to 5 s) and resynchronises after every (re)connection.
async fn listen(engine: Arc<Engine>) {
    use sea_orm::sqlx::postgres::PgListener;
    let channel = crate::store::migration::NOTIFY_CHANNEL;
    let url = engine.config().database.url.clone();
    let mut listener: Option<PgListener> = None;
    // Failed connection attempts in a row (the backoff grows with them; a connection resets it).
    let mut failures = 0u32;
    loop {
        let Some(connected) = listener.as_mut() else {
            let attempt = async {
                let mut l = PgListener::connect(&url).await?;
                l.listen(channel).await?;
                Ok::<_, sea_orm::sqlx::Error>(l)
            };
            match attempt.await {
                Ok(l) => {
                    tracing::info!(channel, "listening for wake-ups");
                    listener = Some(l);
                    failures = 0;
                    resync(&engine).await;
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let backoff = LISTEN_BACKOFF.delay(failures);
                    tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "cannot LISTEN for wake-ups; the safety poll covers meanwhile");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = engine.until_shutdown() => return,
                    }
                }
            }
            continue;
        };
        tokio::select! {
            received = connected.try_recv() => match received {
                Ok(Some(notification)) => handle(&engine, notification.payload()),
                // The connection was lost and re-established (LISTEN included): what was sent
                // meanwhile is gone, so everyone reads the store.
                Ok(None) => {
                    tracing::warn!("wake-up listener reconnected; resynchronising from the store");
                    resync(&engine).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "wake-up listener failed; reconnecting");
                    listener = None;
                }
            },
            () = engine.until_shutdown() => return,
        }
    }
}

/// Run ids per safety-poll query (bounded statement size).
const POLL_CHUNK: usize = 500;

/// Every `runs.safety_poll_ms`: one read of `(last_seq, status)` for all runs watched here, waking the
/// watchers of those that moved on without a wake-up (and refreshing the status heartbeats report).
async fn safety_poll(engine: Arc<Engine>) {
    let mut every = tokio::time::interval(Duration::from_millis(engine.config().safety_poll_ms));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = engine.until_shutdown() => return,
        }
        let watched = engine.hub().watched();
        if watched.is_empty() {
            continue;
        }
        match poll_once(&engine, &watched).await {
            Ok(found) => {
                let outcome = if found { "found" } else { "nothing" };
                metrics::counter!("antler_runs_safety_polls_total", "outcome" => outcome).increment(1);
                if found {
                    tracing::debug!("the safety poll found changes no wake-up announced");
                }
            }
            Err(error) => {
                metrics::counter!("antler_runs_safety_polls_total", "outcome" => "error").increment(1);
                tracing::warn!(%error, "safety poll failed");
            }
        }
    }
}

/// One safety poll over `watched`; whether it found events or ends that no wake-up had announced.
async fn poll_once(engine: &Engine, watched: &[String]) -> Result<bool, crate::error::RunsError> {
    let mut found = false;
    for chunk in watched.chunks(POLL_CHUNK) {
        let rows: Vec<(String, i64, Status)> = runs::Entity::find()
            .select_only()
            .column(runs::Column::RunId)
            .column(runs::Column::LastSeq)
            .column(runs::Column::Status)
            .filter(runs::Column::RunId.is_in(chunk.iter().map(String::as_str)))
            .into_tuple()
            .all(engine.store().db())
            .await?;
        let rows: HashMap<String, (i64, Status)> = rows.into_iter().map(|(id, seq, status)| (id, (seq, status))).collect();
        for run_id in chunk {
            let (seq, end, status) = match rows.get(run_id) {
                Some((seq, status)) => (u64::try_from(*seq).unwrap_or(0), status.is_terminal(), Some(status.to_proto())),
                // Deleted with its thread: nothing more will come.
                None => (0, true, None),
            };
            found |= engine.hub().polled(run_id, seq, end, status);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_of_the_triggers_parse_and_others_are_refused() {
        assert_eq!(parse("e:12:0:run-1"), Some(Note::Events { run_id: "run-1", seq: 12, end: false }));
        assert_eq!(parse("e:3:1:a:b"), Some(Note::Events { run_id: "a:b", seq: 3, end: true }));
        assert_eq!(parse("c:run-2"), Some(Note::Cancel { run_id: "run-2" }));
        for bad in ["", "e:", "e:x:0:r", "e:1:0:", "c:", "x:1", "e:1"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
