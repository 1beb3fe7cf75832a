//! The event log: durable append with a per-run strictly increasing `seq`, live fan-out in this
//! process, and subscriptions that replay from the store and then follow live with no gap and no
//! duplicate at the seam.
//!
//! Seam rule: a subscriber registers for live events *before* it replays, remembers the last `seq`
//! it delivered, drops live events at or below it, and re-reads the store whenever a live event skips
//! ahead (it lagged, or the event was appended by another replica: see `crate::hub` and
//! `crate::notify` for the wake-ups). The store is the truth; the live channel is only a wake-up. A
//! bounded channel per run means a slow subscriber never blocks the run: it lags and catches up from
//! the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{EventKind, Heartbeat, RunEvent, RunStatus};
use prost::Message;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait};
use tokio::sync::mpsc;

use crate::error::RunsError;
use crate::hub::{EventHub, Live, Wake, Watch};
use crate::status::Status;
use crate::store::entity::{run_events, runs};
use crate::store::{Store, now_ms};
use crate::time::to_timestamp;

/// Events read from the store per query while replaying.
const REPLAY_PAGE: u64 = 500;

/// The `EventKind` of an event payload.
pub fn kind_of(kind: &Kind) -> EventKind {
    match kind {
        Kind::Metadata(_) => EventKind::Metadata,
        Kind::Values(_) => EventKind::Values,
        Kind::Message(_) => EventKind::Message,
        Kind::MessageDelta(_) => EventKind::MessageDelta,
        Kind::Update(_) => EventKind::Update,
        Kind::ToolStarted(_) => EventKind::ToolStarted,
        Kind::ToolFinished(_) => EventKind::ToolFinished,
        Kind::Custom(_) => EventKind::Custom,
        Kind::Subagent(_) => EventKind::Subagent,
        Kind::Clarification(_) => EventKind::Clarification,
        Kind::Delivery(_) => EventKind::Delivery,
        Kind::Error(_) => EventKind::Error,
        Kind::Heartbeat(_) => EventKind::Heartbeat,
        Kind::End(_) => EventKind::End,
    }
}

/// `RunEvent.task_id` of an event: the task of a `subagent` event (so ListRunEvents can select one
/// task's events), empty for everything else.
fn task_id_of(kind: &Kind) -> String {
    match kind {
        Kind::Subagent(s) => s.task_id.clone(),
        _ => String::new(),
    }
}

/// Who may append: a worker only while it owns the run, or the service itself (admission, cancel,
/// takeover), which has already settled ownership in the same transaction.
#[derive(Debug, Clone, Copy)]
pub enum Writer<'a> {
    Owner(&'a str),
    Service,
}

/// Appends one event inside `db` (a transaction). Returns None when `writer` no longer owns the run
/// (fenced): nothing was written.
pub async fn append(
    db: &impl ConnectionTrait,
    run_id: &str,
    thread_id: &str,
    writer: Writer<'_>,
    kind: Kind,
) -> Result<Option<RunEvent>, RunsError> {
    Ok(append_many(db, run_id, thread_id, writer, vec![kind]).await?.and_then(|mut events| events.pop()))
}

/// Appends events in order inside `db` (a transaction) with two statements whatever their number:
/// one UPDATE … RETURNING allocates the seqs and checks ownership, one INSERT writes the rows. Returns
/// None when `writer` no longer owns the run (fenced): nothing was written.
pub async fn append_many(
    db: &impl ConnectionTrait,
    run_id: &str,
    thread_id: &str,
    writer: Writer<'_>,
    kinds: Vec<Kind>,
) -> Result<Option<Vec<RunEvent>>, RunsError> {
    append_setting(db, run_id, thread_id, writer, kinds, Vec::new()).await
}

/// [`append_many`], also setting `columns` of the run's row in the same UPDATE (one statement fewer
/// than a separate one). With no events the row is still checked (and its `updated_at` touched), so
/// an otherwise empty call is an ownership check.
pub async fn append_setting(
    db: &impl ConnectionTrait,
    run_id: &str,
    thread_id: &str,
    writer: Writer<'_>,
    kinds: Vec<Kind>,
    columns: Vec<(runs::Column, sea_orm::Value)>,
) -> Result<Option<Vec<RunEvent>>, RunsError> {
    let update = SeqUpdate { count: kinds.len(), columns, conditions: Vec::new(), returning: Vec::new() };
    append_returning(db, run_id, thread_id, writer, update, |_| Ok(kinds)).await
}

/// The seq-allocating UPDATE of [`append_returning`]: how many seqs, which columns of the run's row
/// it also sets, which conditions the row must also meet, and which columns it also returns.
pub struct SeqUpdate {
    pub count: usize,
    pub columns: Vec<(runs::Column, sea_orm::Value)>,
    pub conditions: Vec<sea_orm::sea_query::SimpleExpr>,
    pub returning: Vec<runs::Column>,
}

/// [`append_setting`] for events made from the run's row as the UPDATE left it: `kinds` gets the
/// returned row (`last_seq` and `update.returning`) and must give `update.count` events. Returns None,
/// with nothing written, when the row does not meet the writer's or `update.conditions`' terms.
pub async fn append_returning(
    db: &impl ConnectionTrait,
    run_id: &str,
    thread_id: &str,
    writer: Writer<'_>,
    update: SeqUpdate,
    kinds: impl FnOnce(&sea_orm::QueryResult) -> Result<Vec<Kind>, RunsError>,
) -> Result<Option<Vec<RunEvent>>, RunsError> {
    let now = now_ms();
    let count = update.count as i64;
    let mut statement = sea_orm::sea_query::Query::update();
    statement
        .table(runs::Entity)
        .value(runs::Column::LastSeq, Expr::col(runs::Column::LastSeq).add(count))
        .value(runs::Column::UpdatedAt, now)
        .and_where(runs::Column::RunId.eq(run_id))
        .returning(sea_orm::sea_query::Query::returning().columns(std::iter::once(runs::Column::LastSeq).chain(update.returning)));
    for (column, value) in update.columns {
        statement.value(column, value);
    }
    for condition in update.conditions {
        statement.and_where(condition);
    }
    if let Writer::Owner(worker) = writer {
        statement
            .and_where(runs::Column::OwnerWorkerId.eq(worker))
            .and_where(runs::Column::Status.is_in([Status::Running, Status::Finalizing]));
    }
    let Some(returned) = db.query_one(&statement).await? else { return Ok(None) };
    let last: i64 = returned.try_get("", "last_seq")?;
    let kinds = kinds(&returned)?;
    if kinds.len() != update.count {
        // A caller's bug, caught before anything is inserted: the transaction is rolled back.
        return Err(RunsError::from(sea_orm::DbErr::Custom(format!(
            "append: {} seqs were allocated for {} events\nhint: SeqUpdate.count must be the number of events the closure makes",
            update.count,
            kinds.len()
        ))));
    }
    if kinds.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let first = last - count + 1;
    let events: Vec<RunEvent> = kinds
        .into_iter()
        .zip(first..)
        .map(|(kind, seq)| {
            redacted(RunEvent {
                run_id: run_id.to_owned(),
                seq: seq as u64,
                time: Some(to_timestamp(now)),
                thread_id: thread_id.to_owned(),
                task_id: task_id_of(&kind),
                kind: Some(kind),
            })
        })
        .collect();
    // Bounded statements: SQLite caps the number of bound parameters (5 per row here).
    insert_rows(db, &events, now).await?;
    Ok(Some(events))
}

/// PostgreSQL only: appends one event owned by `worker` in a single statement outside any
/// transaction — the seq UPDATE (ownership check included) and the INSERT in one CTE, one round trip
/// and one commit instead of four round trips. The stored payload carries seq 0; readers take the seq
/// from its column (see [`read_after`]). Returns None when `worker` no longer owns the run.
pub async fn append_one_postgres(
    db: &impl ConnectionTrait,
    run_id: &str,
    thread_id: &str,
    worker: &str,
    kind: Kind,
) -> Result<Option<RunEvent>, RunsError> {
    let now = now_ms();
    let mut event = redacted(RunEvent {
        run_id: run_id.to_owned(),
        seq: 0,
        time: Some(to_timestamp(now)),
        thread_id: thread_id.to_owned(),
        task_id: task_id_of(&kind),
        kind: Some(kind),
    });
    let statement = sea_orm::Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        "WITH s AS (UPDATE runs SET last_seq = last_seq + 1, updated_at = $5 \
         WHERE run_id = $1 AND owner_worker_id = $2 AND status IN ('running', 'finalizing') RETURNING last_seq) \
         INSERT INTO run_events (run_id, seq, kind, payload, created_at, task_id) SELECT $1, s.last_seq, $3, $4, $5, $6 FROM s RETURNING seq",
        [
            run_id.into(),
            worker.into(),
            kind_number(&event).into(),
            event.encode_to_vec().into(),
            now.into(),
            task_of(&event).map(str::to_owned).into(),
        ],
    );
    let Some(returned) = db.query_one_raw(statement).await? else { return Ok(None) };
    let seq: i64 = returned.try_get("", "seq")?;
    event.seq = seq as u64;
    Ok(Some(event))
}

/// The first event (seq 1) of a run that is inserted with `last_seq = 1`; write it with
/// [`insert_rows`] in the same transaction.
pub fn first_event(run_id: &str, thread_id: &str, kind: Kind, now: i64) -> RunEvent {
    redacted(RunEvent {
        run_id: run_id.to_owned(),
        seq: 1,
        time: Some(to_timestamp(now)),
        thread_id: thread_id.to_owned(),
        task_id: String::new(),
        kind: Some(kind),
    })
}

/// Inserts events whose seqs are already allocated, in bounded multi-row statements.
pub async fn insert_rows(db: &impl ConnectionTrait, events: &[RunEvent], now: i64) -> Result<(), RunsError> {
    crate::store::insert_chunked(db, events.iter().map(|event| row(event, now)).collect()).await?;
    Ok(())
}

/// `event` with every registered secret (configured credentials, running runs' `secrets`) removed
/// from its text: every event is written and published through here, so none can carry one out.
fn redacted(mut event: RunEvent) -> RunEvent {
    antler_kit::redact::redact_message_in_place(&mut event);
    event
}

/// The stored row of `event`.
fn row(event: &RunEvent, now: i64) -> run_events::ActiveModel {
    run_events::ActiveModel {
        run_id: Set(event.run_id.clone()),
        seq: Set(event.seq as i64),
        kind: Set(kind_number(event)),
        payload: Set(event.encode_to_vec()),
        created_at: Set(now),
        task_id: Set(task_of(event).map(str::to_owned)),
    }
}

/// The subagent task an event belongs to, as stored in `run_events.task_id` for ListRunEvents'
/// `task_id` filter: its RunEvent.task_id, or for a SUBAGENT event (which the parent's log carries
/// for each of its tasks) that event's own task_id. None for the lead agent's own events.
pub fn task_of(event: &RunEvent) -> Option<&str> {
    if !event.task_id.is_empty() {
        return Some(&event.task_id);
    }
    match &event.kind {
        Some(Kind::Subagent(subagent)) if !subagent.task_id.is_empty() => Some(&subagent.task_id),
        _ => None,
    }
}

fn kind_number(event: &RunEvent) -> i32 {
    event.kind.as_ref().map(kind_of).unwrap_or(EventKind::Unspecified) as i32
}

/// Reads stored events after `after_seq`, oldest first.
pub async fn read_after(store: &Store, run_id: &str, after_seq: u64, kinds: &[i32], limit: u64) -> Result<Vec<RunEvent>, RunsError> {
    read_page(store, run_id, after_seq, kinds, None, limit).await
}

/// [`read_after`], only the events of subagent task `task_id` (see [`task_of`]) when given: the
/// filter is in the query, before its LIMIT, so a page holds `limit` matching events.
pub async fn read_page(
    store: &Store,
    run_id: &str,
    after_seq: u64,
    kinds: &[i32],
    task_id: Option<&str>,
    limit: u64,
) -> Result<Vec<RunEvent>, RunsError> {
    let mut query = run_events::Entity::find()
        .filter(run_events::Column::RunId.eq(run_id))
        .filter(run_events::Column::Seq.gt(after_seq as i64))
        .order_by_asc(run_events::Column::Seq)
        .limit(limit);
    if !kinds.is_empty() {
        query = query.filter(run_events::Column::Kind.is_in(kinds.iter().copied()));
    }
    if let Some(task_id) = task_id {
        query = query.filter(run_events::Column::TaskId.eq(task_id));
    }
    let rows = crate::store::rows(store.db(), query).await?;
    rows.into_iter()
        .map(|row| {
            let mut event = RunEvent::decode(row.payload.as_slice()).map_err(|e| RunsError::Store(e.into()))?;
            // The column is the truth: single-statement appends store seq 0 in the payload.
            event.seq = row.seq as u64;
            Ok(event)
        })
        .collect()
}

/// What a subscription delivers.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub run_id: String,
    pub thread_id: String,
    pub after_seq: u64,
    /// Kinds wanted (empty: all). METADATA, ERROR, HEARTBEAT and END are always delivered.
    pub kinds: Vec<i32>,
    pub heartbeat: Duration,
}

fn wanted(kinds: &[i32], event: &RunEvent) -> bool {
    let Some(kind) = event.kind.as_ref().map(kind_of) else { return false };
    kinds.is_empty()
        || matches!(kind, EventKind::Metadata | EventKind::Error | EventKind::Heartbeat | EventKind::End)
        || kinds.contains(&(kind as i32))
}

/// When a subscriber began to watch its run.
#[derive(Debug)]
pub enum Joined {
    /// After the run existed: what was stored before is read from the store first.
    Late,
    /// Before the run's admission committed (StreamRun, with the run id chosen before admitting):
    /// every event of the run is announced to this watch — published by this replica, or notified
    /// and polled from others' writes, which the stream then reads — so there is nothing to catch up
    /// on and the stream starts with no read. `status`: the run's status as admitted.
    AtAdmission { watch: Watch, status: RunStatus },
}

/// Streams a run's events into `out` until its END event, or until `out` is closed (client gone).
/// Returns whether END was delivered. Woken by the hub (events committed here, notifications of
/// other replicas' writes, the safety poll); it reads the store only when woken by something it has
/// not got, never on a timer.
pub async fn follow(store: Store, hub: Arc<EventHub>, sub: Subscription, out: mpsc::Sender<Result<RunEvent, tonic::Status>>) -> bool {
    follow_from(store, hub, Joined::Late, sub, out).await
}

/// [`follow`] for a subscriber that joined as `joined` says.
pub async fn follow_from(
    store: Store,
    hub: Arc<EventHub>,
    joined: Joined,
    sub: Subscription,
    out: mpsc::Sender<Result<RunEvent, tonic::Status>>,
) -> bool {
    let (mut live, known) = match joined {
        // Registered before the store is read, so nothing committed after the read goes unannounced.
        Joined::Late => (hub.watch(&sub.run_id), None),
        Joined::AtAdmission { watch, status } => (watch, Some(status)),
    };
    metrics::gauge!("antler_runs_stream_subscribers").increment(1.0);
    let mut cursor = Cursor { last: sub.after_seq, last_sent: Instant::now(), status: known.unwrap_or(RunStatus::Unspecified) };
    let outcome = async {
        if known.is_none() && (cursor.catch_up(&store, &sub, &out).await? || cursor.past_the_end(&store, &sub).await?.is_none()) {
            return Ok::<bool, Stop>(true);
        }
        loop {
            let heartbeat = tokio::time::Instant::from_std(cursor.last_sent + sub.heartbeat);
            tokio::select! {
                wake = live.next() => match wake {
                    Wake::Live(Live::Event(event)) if event.seq <= cursor.last => {}
                    Wake::Live(Live::Event(event)) if event.seq == cursor.last + 1 => {
                        if cursor.deliver(&sub, Arc::unwrap_or_clone(event), &out).await? {
                            return Ok(true);
                        }
                    }
                    Wake::Live(Live::Stored { seq, end, status }) => {
                        if let Some(status) = status {
                            cursor.status = status;
                        }
                        if seq > cursor.last && cursor.catch_up(&store, &sub, &out).await? {
                            return Ok(true);
                        }
                        // The END lay at or before after_seq, was filtered out, or the run is gone.
                        if end && cursor.past_the_end(&store, &sub).await?.is_none() {
                            return Ok(true);
                        }
                    }
                    // Skipped ahead or lagged: the store has everything in order.
                    Wake::Live(Live::Event(_)) | Wake::Lagged => {
                        if cursor.catch_up(&store, &sub, &out).await? {
                            return Ok(true);
                        }
                    }
                    // Missed notifications, or the run's channel closed with its END: if the END
                    // was filtered out of what this subscriber reads, or lay at or before its
                    // after_seq, the stream ends here too.
                    Wake::Live(Live::Resync) | Wake::Closed => {
                        if cursor.catch_up(&store, &sub, &out).await? || cursor.past_the_end(&store, &sub).await?.is_none() {
                            return Ok(true);
                        }
                    }
                },
                // Heartbeats report what this subscriber knows; they cost no query.
                () = tokio::time::sleep_until(heartbeat) => cursor.heartbeat(&sub, &out).await?,
                () = out.closed() => return Err(Stop::ClientGone),
            }
        }
    }
    .await;
    drop(live);
    metrics::gauge!("antler_runs_stream_subscribers").decrement(1.0);
    match outcome {
        Ok(ended) => ended,
        Err(Stop::Failed(status)) => {
            let _ = out.send(Err(status)).await;
            false
        }
        Err(Stop::ClientGone) => false,
    }
}

enum Stop {
    ClientGone,
    Failed(tonic::Status),
}

struct Cursor {
    last: u64,
    last_sent: Instant,
    /// The run's status as far as this subscriber knows (for heartbeats): read when it joins,
    /// followed through the events it sees and the safety poll.
    status: RunStatus,
}

impl Cursor {
    /// Delivers everything stored after `last`; true once END was delivered.
    async fn catch_up(
        &mut self,
        store: &Store,
        sub: &Subscription,
        out: &mpsc::Sender<Result<RunEvent, tonic::Status>>,
    ) -> Result<bool, Stop> {
        loop {
            let page = read_after(store, &sub.run_id, self.last, &[], REPLAY_PAGE).await.map_err(|e| Stop::Failed(e.into()))?;
            let full = page.len() as u64 == REPLAY_PAGE;
            for event in page {
                if self.deliver(sub, event, out).await? {
                    return Ok(true);
                }
            }
            if !full {
                return Ok(false);
            }
        }
    }

    async fn deliver(
        &mut self,
        sub: &Subscription,
        event: RunEvent,
        out: &mpsc::Sender<Result<RunEvent, tonic::Status>>,
    ) -> Result<bool, Stop> {
        self.last = event.seq;
        let end = matches!(event.kind, Some(Kind::End(_)));
        self.status = match &event.kind {
            Some(Kind::End(end)) => end.status(),
            Some(Kind::Delivery(_)) => RunStatus::Finalizing,
            // Admission writes the first METADATA of a PENDING run; a takeover writes one too.
            Some(Kind::Metadata(_) | Kind::Heartbeat(_)) | None => self.status,
            // Only the worker that owns the run writes the rest.
            Some(_) if self.status == RunStatus::Finalizing => self.status,
            Some(_) => RunStatus::Running,
        };
        if wanted(&sub.kinds, &event) {
            out.send(Ok(event)).await.map_err(|_| Stop::ClientGone)?;
            self.last_sent = Instant::now();
        }
        Ok(end)
    }

    /// The run's status, or None when there is nothing more for this subscriber: the run is terminal
    /// and its last event is at or before the cursor (a client that joined at or past the END, whose
    /// END was delivered already, or whose run is gone).
    async fn past_the_end(&mut self, store: &Store, sub: &Subscription) -> Result<Option<RunStatus>, Stop> {
        let select =
            runs::Entity::find_by_id(sub.run_id.clone()).select_only().column(runs::Column::Status).column(runs::Column::LastSeq).limit(1);
        let read = async {
            let row = store.db().query_one_raw(crate::store::inline_limits(select.build(store.backend()))).await?;
            row.map(|row| Ok::<_, sea_orm::DbErr>((row.try_get::<Status>("", "status")?, row.try_get::<i64>("", "last_seq")?))).transpose()
        };
        let row = read.await.map_err(|e| Stop::Failed(RunsError::from(e).into()))?;
        let Some((status, last_seq)) = row else { return Ok(None) };
        if status.is_terminal() && u64::try_from(last_seq).unwrap_or(0) <= self.last {
            return Ok(None);
        }
        self.status = status.to_proto();
        Ok(Some(self.status))
    }

    async fn heartbeat(&mut self, sub: &Subscription, out: &mpsc::Sender<Result<RunEvent, tonic::Status>>) -> Result<(), Stop> {
        let event = RunEvent {
            run_id: sub.run_id.clone(),
            seq: 0,
            time: Some(to_timestamp(now_ms())),
            thread_id: sub.thread_id.clone(),
            task_id: String::new(),
            kind: Some(Kind::Heartbeat(Heartbeat { last_seq: self.last, status: self.status as i32 })),
        };
        out.send(Ok(event)).await.map_err(|_| Stop::ClientGone)?;
        self.last_sent = Instant::now();
        Ok(())
    }
}
