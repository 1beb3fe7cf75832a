//! Group commit of admissions: runs admitted on new threads (CreateRun with an empty `thread_id`, the
//! common shape of an admission flood) are written in batches, one transaction and a handful of
//! multi-row statements for every admission that arrived while the previous batch was committing.
//!
//! Each request keeps its own outcome: an idempotency key already used (or used twice in one batch)
//! answers with that run, `reused`, or FAILED_PRECONDITION for a different body, without touching its
//! neighbours; a request beyond `runs.max_pending_runs` is refused alone. Anything that makes the
//! batch's transaction fail (a concurrent replica won a unique index, SQLite busy in another process)
//! sends every request of the batch through the one-at-a-time path, which settles each on its own.
//! Admissions wait for the SQLite write slot with [`Priority::Admission`], behind the writes of runs
//! already admitted, so a flood cannot starve the workers.

use std::collections::HashMap;
use std::sync::Arc;

use antler_proto::runs::{CreateRunRequest, MultitaskStrategy};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, EntityTrait, Statement};
use tokio::sync::{mpsc, oneshot};

use super::one;
use super::rows::{NewRun, new_run, new_thread_row};
use super::{Admitted, Effects};
use crate::engine::Engine;
use crate::error::RunsError;
use crate::lifecycle::user_caps;
use crate::store::entity::{run_inputs, runs, threads};
use crate::store::{Priority, insert_chunked, now_ms};
use crate::stream::insert_rows;

/// Most admissions in one transaction (bounded by SQLite's bound-parameter limit: ~30 per run row).
pub const MAX_BATCH: usize = 128;

/// Admissions waiting for the batcher; a full queue makes CreateRun handlers wait (they are bounded
/// by the server's concurrency limit anyway).
pub const QUEUE: usize = 4096;

type Outcome = Result<(Admitted, Effects), RunsError>;

/// One admission handed to the batcher: a request that passed `sanitise` and whose thread is new.
pub struct Job {
    user_id: String,
    req: CreateRunRequest,
    fingerprint: String,
    run_id: String,
    reply: oneshot::Sender<Outcome>,
}

/// The handle admission hands batchable requests to; see the module documentation.
#[derive(Debug, Clone)]
pub struct Batcher {
    jobs: mpsc::Sender<Job>,
}

impl Batcher {
    /// The handle and the receiving end for [`run`].
    pub fn channel() -> (Self, mpsc::Receiver<Job>) {
        let (jobs, rx) = mpsc::channel(QUEUE);
        (Self { jobs }, rx)
    }

    /// Whether `req` can be admitted in a batch (a new thread, started from nothing).
    pub fn batchable(req: &CreateRunRequest) -> bool {
        req.thread_id.is_empty() && req.checkpoint_id.is_empty() && req.resume.is_none()
    }

    /// Admits `req` (sanitised, fingerprinted) with the next batch.
    pub(super) async fn admit(&self, user_id: &str, req: &CreateRunRequest, fingerprint: String, run_id: String) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let job = Job { user_id: user_id.to_owned(), req: req.clone(), fingerprint, run_id, reply };
        if self.jobs.send(job).await.is_err() {
            return Err(RunsError::Unavailable("the runs service is shutting down".to_owned()));
        }
        answer.await.unwrap_or_else(|_| Err(RunsError::Unavailable("the runs service is shutting down".to_owned())))
    }
}

/// The batcher: takes whatever admissions are waiting (at most [`MAX_BATCH`]), commits them together,
/// answers each. Runs until shutdown.
pub async fn run(engine: Arc<Engine>, mut jobs: mpsc::Receiver<Job>) {
    loop {
        let first = tokio::select! {
            job = jobs.recv() => match job { Some(job) => job, None => return },
            () = engine.until_shutdown() => return,
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        metrics::histogram!("antler_admission_batch_size").record(batch.len() as f64);
        // The requests move into the transaction (it runs on the store's writer thread); the replies stay.
        let (requests, replies): (Vec<Request>, Vec<oneshot::Sender<Outcome>>) = batch
            .into_iter()
            .map(|job| {
                let request = Request { user_id: job.user_id, req: job.req, fingerprint: job.fingerprint, run_id: job.run_id };
                (request, job.reply)
            })
            .unzip();
        let requests = Arc::new(requests);
        match admit_batch(&engine, &requests).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(outcome);
                }
            }
            Err(error) => {
                tracing::debug!(%error, size = requests.len(), "admission batch failed; admitting its requests one by one");
                for (request, reply) in requests.iter().zip(replies) {
                    let outcome =
                        one::create_or_reject_one(&engine, &request.user_id, &request.req, &request.fingerprint, &request.run_id).await;
                    let _ = reply.send(outcome);
                }
            }
        }
    }
}

/// What became of one request of the batch before the commit.
enum Plan {
    Done(Box<Outcome>),
    Create(Box<NewRun>),
    /// The same (user, key) as an earlier request of this batch: answered from that one's run.
    SameKeyAs(usize),
}

/// One request of a batch as the writing transaction needs it: owned, since it runs on the store's
/// writer thread (see `Store::write`). The run id is chosen before (by the caller of admission), so
/// that a transaction retried after a busy database writes the same runs, and a failed one can
/// forget their secrets.
struct Request {
    user_id: String,
    req: CreateRunRequest,
    fingerprint: String,
    run_id: String,
}

async fn admit_batch(engine: &Arc<Engine>, requests: &Arc<Vec<Request>>) -> Result<Vec<Outcome>, RunsError> {
    let written = {
        let (op_engine, op_requests) = (engine.clone(), requests.clone());
        engine
            .store()
            .write(Priority::Admission, move |tx| {
                let (engine, requests) = (op_engine.clone(), op_requests.clone());
                Box::pin(async move { plan_and_insert(&engine, tx, &requests).await })
            })
            .await
    };
    let plans = match written {
        Ok(plans) => plans,
        Err(error) => {
            for request in requests.iter() {
                engine.secrets().forget(&request.run_id);
            }
            return Err(error);
        }
    };
    let created = plans.iter().filter(|p| matches!(p, Plan::Create(_))).count();
    engine.backlog().admitted(created as u64);
    for (request, plan) in requests.iter().zip(&plans) {
        if matches!(plan, Plan::Create(_)) {
            engine.user_runs().admitted(&request.user_id, 1);
        }
    }

    // Answer in request order; a repeated key gets the run its first request created.
    let mut runs_by_index: HashMap<usize, runs::Model> = HashMap::new();
    let mut outcomes = Vec::with_capacity(requests.len());
    for (i, plan) in plans.into_iter().enumerate() {
        let outcome = match plan {
            Plan::Done(outcome) => *outcome,
            Plan::Create(planned) => {
                let NewRun { run, first, .. } = *planned;
                metrics::counter!("antler_runs_admitted_total", "strategy" => strategy_label(&run)).increment(1);
                runs_by_index.insert(i, run.clone());
                Ok((Admitted { run, reused: false }, Effects { events: vec![first], superseded: Vec::new() }))
            }
            Plan::SameKeyAs(first) => match runs_by_index.get(&first) {
                Some(run) => one::reuse(run.clone(), &requests[i].fingerprint).map(|a| (a, Effects::default())),
                None => Err(RunsError::Unavailable("the run of an earlier request with the same key was not admitted".to_owned())),
            },
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The batch's transaction: what each request becomes (reads: keys already used, the backlog, the
/// users' caps), then every new thread, run, input and first event in a handful of multi-row
/// statements, and the new runs' secrets kept before the commit (once committed, the dispatcher may
/// start them at any moment).
async fn plan_and_insert(engine: &Engine, tx: &DatabaseTransaction, batch: &[Request]) -> Result<Vec<Plan>, RunsError> {
    let now = now_ms();

    // Runs that already hold this batch's idempotency keys: one query.
    let keyed: Vec<(&str, &str)> =
        batch.iter().filter(|j| !j.req.idempotency_key.is_empty()).map(|j| (j.user_id.as_str(), j.req.idempotency_key.as_str())).collect();
    let mut existing: HashMap<(String, String), runs::Model> = HashMap::new();
    if !keyed.is_empty() {
        for run in runs::Entity::find().from_raw_sql(keys_query(tx.get_database_backend(), &keyed)).all(tx).await? {
            if let Some(key) = run.idempotency_key.clone() {
                existing.insert((run.user_id.clone(), key), run);
            }
        }
    }
    let limit = engine.config().max_pending_runs;
    let mut pending = if limit > 0 { engine.backlog().pending(tx).await? } else { 0 };
    // Per-user caps: each user's counts read once for the batch, then followed through it.
    let mut per_user: HashMap<&str, user_caps::Counts> = HashMap::new();
    for job in batch {
        if !per_user.contains_key(job.user_id.as_str()) {
            per_user.insert(&job.user_id, engine.user_runs().counts(engine.config(), tx, &job.user_id).await?);
        }
    }

    let mut plans = Vec::with_capacity(batch.len());
    let mut claimed: HashMap<(&str, &str), usize> = HashMap::new();
    let (mut thread_rows, mut run_rows, mut input_rows, mut events) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, job) in batch.iter().enumerate() {
        let key = (job.user_id.as_str(), job.req.idempotency_key.as_str());
        if !key.1.is_empty() {
            if let Some(run) = existing.get(&(key.0.to_owned(), key.1.to_owned())) {
                plans.push(Plan::Done(Box::new(one::reuse(run.clone(), &job.fingerprint).map(|a| (a, Effects::default())))));
                continue;
            }
            if let Some(&first) = claimed.get(&key) {
                plans.push(Plan::SameKeyAs(first));
                continue;
            }
        }
        if limit > 0 && pending >= limit {
            plans.push(Plan::Done(Box::new(Err(one::backlog_full(pending, limit)))));
            continue;
        }
        let counts = per_user.entry(&job.user_id).or_default();
        if let Err(refused) = user_caps::check(engine.config(), *counts) {
            plans.push(Plan::Done(Box::new(Err(refused))));
            continue;
        }
        counts.active += 1;
        counts.pending += 1;
        pending += 1;
        let thread = new_thread_row(&job.user_id, &job.run_id, now);
        let strategy = match MultitaskStrategy::try_from(job.req.multitask_strategy) {
            Ok(MultitaskStrategy::Unspecified) | Err(_) => MultitaskStrategy::Reject,
            Ok(s) => s,
        };
        let planned =
            new_run(engine, &job.user_id, &job.req, &job.fingerprint, job.run_id.clone(), &thread.thread_id, None, false, strategy, now);
        thread_rows.push(threads::ActiveModel::from(thread));
        run_rows.push(runs::ActiveModel::from(planned.run.clone()));
        if let Some(input) = &planned.input {
            input_rows.push(run_inputs::ActiveModel::from(input.clone()));
        }
        events.push(planned.first.clone());
        if !key.1.is_empty() {
            claimed.insert(key, i);
        }
        plans.push(Plan::Create(Box::new(planned)));
    }

    if !run_rows.is_empty() {
        insert_chunked(tx, thread_rows).await?;
        insert_chunked(tx, run_rows).await?;
        insert_chunked(tx, input_rows).await?;
        insert_rows(tx, &events, now).await?;
    }
    for (job, plan) in batch.iter().zip(&plans) {
        if let Plan::Create(planned) = plan {
            engine.secrets().keep(&planned.run.run_id, job.req.secrets.clone().into_iter().collect());
        }
    }
    Ok(plans)
}

/// The runs holding any of `keys` (user, idempotency key), as one statement whatever their number:
/// the pairs travel as arrays (PostgreSQL) or one JSON text (SQLite). One OR per pair would make a
/// new statement text for every batch size, each evicting a cached one, and a new plan each time.
fn keys_query(backend: DbBackend, keys: &[(&str, &str)]) -> Statement {
    let users: Vec<String> = keys.iter().map(|(u, _)| (*u).to_owned()).collect();
    let idempotency: Vec<String> = keys.iter().map(|(_, k)| (*k).to_owned()).collect();
    match backend {
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            "SELECT runs.* FROM runs JOIN UNNEST($1::text[], $2::text[]) AS k(user_id, idempotency_key) \
             ON runs.user_id = k.user_id AND runs.idempotency_key = k.idempotency_key WHERE runs.idempotency_key IS NOT NULL",
            [users.into(), idempotency.into()],
        ),
        _ => {
            let pairs = serde_json::Value::Array(keys.iter().map(|(u, k)| serde_json::json!([u, k])).collect());
            Statement::from_sql_and_values(
                backend,
                "SELECT * FROM runs WHERE idempotency_key IS NOT NULL AND (user_id, idempotency_key) IN \
                 (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))",
                [pairs.to_string().into()],
            )
        }
    }
}

/// The bounded label of a run's strategy, as the one-at-a-time path records it.
fn strategy_label(run: &runs::Model) -> &'static str {
    match run.multitask_strategy.as_str() {
        "interrupt" => MultitaskStrategy::Interrupt.as_str_name(),
        "rollback" => MultitaskStrategy::Rollback.as_str_name(),
        "enqueue" => MultitaskStrategy::Enqueue.as_str_name(),
        _ => MultitaskStrategy::Reject.as_str_name(),
    }
}
