//! The extraction workers of one replica: claim a due update, ask the extraction model, validate its
//! answer, apply it through the junk guards, and finish — all writes in one transaction fenced by the
//! lease (see [`crate::queue`]).
//!
//! Workers wake when this replica flushes or queues an update due before their next look, when the
//! next debounce ends, and every `poll_interval_ms` for what other replicas queued (and this one's
//! later updates, which they then sleep until).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use antler_kit::client::CallContext;
use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::memory::UpdateOutcome;
use antler_proto::models::ChatRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use tracing::Instrument;

use crate::extract::{self, Answer, Candidate, Operation};
use crate::facts::{self, NewFact, Scope};
use crate::filter::Turn;
use crate::guards::Guard;
use crate::profile;
use crate::queue::{self, DONE, FAILED};
use crate::service::Memory;
use crate::store::entity::facts::Model as Fact;
use crate::store::entity::updates;
use crate::store::now_ms;

/// The caller tag of extraction calls (usage goes to the middleware bucket).
pub const CALLER: &str = "middleware:memory";

/// Starts `memory.workers` workers owned by `memory.shutdown`.
pub fn spawn(memory: &Arc<Memory>) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    for n in 0..memory.config.workers {
        let memory = memory.clone();
        set.spawn(run(memory).instrument(tracing::info_span!("memory_worker", n)));
    }
    set
}

async fn run(memory: Arc<Memory>) {
    let lease_ms = (memory.config.lease_secs * 1000) as i64;
    let poll = Duration::from_millis(memory.config.poll_interval_ms);
    let mut last_prune = std::time::Instant::now();
    loop {
        if memory.shutdown.is_cancelled() {
            return;
        }
        match queue::claim(&memory.store, &memory.worker_id, lease_ms).await {
            Ok(Some(update)) => {
                process(&memory, update).await;
                continue;
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "claiming a memory update failed"),
        }
        if last_prune.elapsed() > Duration::from_secs(60) {
            last_prune = std::time::Instant::now();
            if let Err(error) = queue::prune(&memory.store, (memory.config.retain_finished_secs * 1000) as i64).await {
                tracing::debug!(%error, "pruning finished updates failed");
            }
        }
        let sleep = match queue::next_due(&memory.store).await {
            Ok(Some(at)) => Duration::from_millis((at - now_ms()).clamp(0, poll.as_millis() as i64) as u64),
            _ => poll,
        };
        // Register interest before sleeping so a wake between the claim and here is not lost.
        let woken = memory.wake.notified();
        tokio::select! {
            () = memory.shutdown.cancelled() => return,
            () = woken => {}
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// A failure of one processing attempt.
enum Failure {
    /// Worth another attempt later (the models service is unavailable, the call timed out).
    Transient(String),
    /// The model answered something unusable: dropped and counted, not retried.
    Malformed(String),
    /// The lease was lost: another worker owns the update now.
    Lost,
}

async fn process(memory: &Arc<Memory>, update: updates::Model) {
    let started = std::time::Instant::now();
    let span = tracing::info_span!("memory_update", update_id = %update.update_id, attempt = update.attempts);
    async {
        let outcome_base =
            UpdateOutcome { thread_id: update.thread_id.clone(), agent_name: update.agent_name.clone(), ..UpdateOutcome::default() };
        if update.attempts > memory.config.max_attempts as i32 {
            let outcome = UpdateOutcome {
                error: format!("given up after {} attempts (memory.max_attempts)", memory.config.max_attempts),
                ..outcome_base
            };
            finish_alone(memory, &update, FAILED, &outcome).await;
            return;
        }
        // Renew the lease while the model thinks; stop when processing ends.
        let lease_ms = (memory.config.lease_secs * 1000) as i64;
        let renewal = {
            let (memory, update) = (memory.clone(), update.clone());
            let stop = tokio_util::sync::CancellationToken::new();
            let guard = stop.clone().drop_guard();
            tokio::spawn(async move {
                let every = Duration::from_millis((lease_ms / 3).max(500) as u64);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(every) => {}
                    }
                    match queue::renew(&memory.store, &update, lease_ms).await {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(error) => tracing::warn!(%error, "renewing a memory update lease failed"),
                    }
                }
            });
            guard
        };
        let result = extract_and_apply(memory, &update, outcome_base.clone()).await;
        drop(renewal);
        match result {
            Ok(outcome) => {
                metrics::counter!("antler_memory_updates_processed_total", "result" => "ok").increment(1);
                metrics::histogram!("antler_memory_update_seconds").record(started.elapsed().as_secs_f64());
                tracing::info!(
                    added = outcome.facts_added,
                    invalidated = outcome.facts_invalidated,
                    rejected = outcome.facts_rejected,
                    "memory update applied"
                );
            }
            Err(Failure::Malformed(error)) => {
                metrics::counter!("antler_memory_extraction_malformed_total").increment(1);
                metrics::counter!("antler_memory_updates_processed_total", "result" => "malformed").increment(1);
                tracing::warn!(%error, "extraction answer malformed; dropped, nothing saved");
                let outcome =
                    UpdateOutcome { error: format!("the model's answer was malformed, nothing was saved: {error}"), ..outcome_base };
                finish_alone(memory, &update, DONE, &outcome).await;
            }
            Err(Failure::Transient(error)) => {
                metrics::counter!("antler_memory_updates_processed_total", "result" => "retry").increment(1);
                if update.attempts >= memory.config.max_attempts as i32 {
                    let outcome =
                        UpdateOutcome { error: format!("extraction failed after {} attempts: {error}", update.attempts), ..outcome_base };
                    finish_alone(memory, &update, FAILED, &outcome).await;
                } else {
                    let delay = 1000i64 << update.attempts.clamp(0, 6);
                    tracing::warn!(%error, delay_ms = delay, "extraction failed; retrying later");
                    if let Err(error) = queue::retry_later(&memory.store, &update, delay).await {
                        tracing::warn!(%error, "re-queueing a memory update failed; its lease will expire");
                    }
                }
            }
            Err(Failure::Lost) => {
                metrics::counter!("antler_memory_updates_processed_total", "result" => "lease_lost").increment(1);
                tracing::warn!("lease lost while processing; another worker owns the update, nothing was saved");
            }
        }
        memory.finished.send_modify(|n| *n += 1);
    }
    .instrument(span)
    .await;
}

async fn finish_alone(memory: &Memory, update: &updates::Model, status: &str, outcome: &UpdateOutcome) {
    let result = async {
        let tx = memory.store.tx().await?;
        if queue::finish(&*tx, update, status, outcome).await? {
            tx.commit().await?;
        }
        Ok::<_, crate::store::StoreError>(())
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, "finishing a memory update failed; its lease will expire and it is retried");
    }
}

fn text_message(role: Role, text: String) -> Message {
    Message {
        role: role as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text })) }],
        ..Message::default()
    }
}

/// The facts shown to the model: the most relevant to the conversation, then the most confident.
async fn context_facts(memory: &Memory, scope: &Scope, turns: &[Turn]) -> Result<Vec<Fact>, crate::store::StoreError> {
    let limit = memory.config.extraction_context_facts as usize;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let query: String = turns.iter().filter(|t| t.role == "user").map(|t| t.text.as_str()).collect::<Vec<_>>().join(" ");
    let mut chosen: Vec<Fact> =
        facts::search(memory.store.db(), scope, &query, &[], limit as u64).await?.into_iter().map(|(f, _)| f).collect();
    if chosen.len() < limit {
        let ids: HashSet<String> = chosen.iter().map(|f| f.fact_id.clone()).collect();
        let mut rest: Vec<Fact> = facts::live(memory.store.db(), scope).await?.into_iter().filter(|f| !ids.contains(&f.fact_id)).collect();
        rest.sort_by(|a, b| b.confidence.total_cmp(&a.confidence).then(b.created_at.cmp(&a.created_at)).then(a.fact_id.cmp(&b.fact_id)));
        chosen.extend(rest.into_iter().take(limit - chosen.len()));
    }
    Ok(chosen)
}

async fn extract_and_apply(memory: &Memory, update: &updates::Model, mut outcome: UpdateOutcome) -> Result<UpdateOutcome, Failure> {
    let scope = Scope::new(update.user_id.clone(), update.agent_name.clone());
    let corrupt = |e: serde_json::Error| Failure::Malformed(format!("stored update is unreadable: {e}"));
    let turns: Vec<Turn> = serde_json::from_str(&update.conversation).map_err(corrupt)?;
    let refusals: Vec<String> = serde_json::from_str(&update.refusals).map_err(corrupt)?;
    let db_error = |e: crate::store::StoreError| Failure::Transient(e.to_string());
    let current = profile::load(memory.store.db(), &scope.user).await.map_err(db_error)?;
    let context = context_facts(memory, &scope, &turns).await.map_err(db_error)?;
    let (prompt, refs) = extract::prompt(&current, &context, &turns);
    let text = call_model(memory, update, prompt).await?;
    let answer = extract::parse(&text, &refs, memory.config.max_fact_chars as usize).map_err(Failure::Malformed)?;
    let mut guard_texts = refusals;
    guard_texts.push(extract::SYSTEM_PROMPT.to_owned());
    let guard = Guard::new(&guard_texts, &memory.patterns);
    apply(memory, update, &scope, answer, &guard, &mut outcome).await?;
    Ok(outcome)
}

async fn call_model(memory: &Memory, update: &updates::Model, prompt: String) -> Result<String, Failure> {
    let client = memory.clients.get("models").ok_or_else(|| Failure::Transient("no `models` client is configured".to_owned()))?;
    let model_name = if memory.config.model_name.is_empty() { update.model_name.clone() } else { memory.config.model_name.clone() };
    let request = ChatRequest {
        model_name,
        messages: vec![text_message(Role::System, extract::SYSTEM_PROMPT.to_owned()), text_message(Role::User, prompt)],
        temperature: Some(0.0),
        caller: CALLER.to_owned(),
        run_id: update.run_id.clone(),
        thread_id: update.thread_id.clone(),
        ..ChatRequest::default()
    };
    let ctx = CallContext::background(update.user_id.clone());
    let grpc = ModelServiceClient::new(client.channel());
    let timeout = Duration::from_secs(memory.config.extraction_timeout_secs);
    let call = client.with_retry(|| {
        let mut request = client.request(&ctx, request.clone());
        request.set_timeout(timeout);
        let mut grpc = grpc.clone();
        async move { grpc.chat(request).await }
    });
    let response = tokio::select! {
        response = tokio::time::timeout(timeout, call) => response,
        () = memory.shutdown.cancelled() => return Err(Failure::Transient("shutting down".to_owned())),
    };
    let response = match response {
        Err(_) => return Err(Failure::Transient(format!("the extraction model did not answer within {}s", timeout.as_secs()))),
        Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument || status.code() == tonic::Code::NotFound => {
            // A request the models service refuses will be refused again: not worth retrying.
            return Err(Failure::Malformed(format!("the models service refused the extraction call: {}", status.message())));
        }
        Ok(Err(status)) => return Err(Failure::Transient(format!("the models service failed: {:?}: {}", status.code(), status.message()))),
        Ok(Ok(response)) => response.into_inner(),
    };
    let text = response
        .message
        .map(|m| {
            m.content
                .into_iter()
                .filter_map(|p| match p.part {
                    Some(content_part::Part::Text(t)) => Some(t.text),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default();
    Ok(text)
}

/// Why a candidate was not written.
fn reject(outcome: &mut UpdateOutcome, why: &'static str) {
    outcome.facts_rejected += 1;
    metrics::counter!("antler_memory_facts_rejected_total", "reason" => why).increment(1);
}

/// The live fact a candidate duplicates: same normalised text, or word sets at least `threshold` alike.
fn duplicate_of<'a>(live: &'a [Fact], content: &str, threshold: f64) -> Option<&'a Fact> {
    let norm = facts::normalise(content);
    live.iter().find(|f| f.norm == norm).or_else(|| live.iter().find(|f| facts::similarity(&f.content, content) >= threshold))
}

fn new_fact(update: &updates::Model, c: &Candidate, supersedes: &str) -> NewFact {
    NewFact {
        content: c.content.clone(),
        category: c.category.clone(),
        category_label: c.category_label.clone(),
        confidence: c.confidence,
        source_kind: facts::source::CONVERSATION.to_owned(),
        thread_id: update.thread_id.clone(),
        run_id: update.run_id.clone(),
        message_id: update.message_id.clone(),
        source_error: c.source_error.clone(),
        supersedes: supersedes.to_owned(),
        ..NewFact::default()
    }
}

/// Applies a validated answer and finishes the update, in one transaction.
async fn apply(
    memory: &Memory,
    update: &updates::Model,
    scope: &Scope,
    answer: Answer,
    guard: &Guard<'_>,
    outcome: &mut UpdateOutcome,
) -> Result<(), Failure> {
    let db_error = |e: crate::store::StoreError| Failure::Transient(e.to_string());
    let threshold = memory.config.fact_confidence_threshold;
    let similar = memory.config.duplicate_similarity;
    let tx = memory.store.tx().await.map_err(db_error)?;
    let mut live = facts::live(&*tx, scope).await.map_err(db_error)?;
    let mut confirmed: HashSet<i64> = HashSet::new();
    let mut changed = false;
    for operation in answer.operations {
        match operation {
            Operation::Noop => {}
            Operation::Add(candidate) => {
                if candidate.confidence < threshold {
                    reject(outcome, "low_confidence");
                    continue;
                }
                if let Some(refusal) = guard.check(&candidate.content) {
                    reject(outcome, refusal.label());
                    continue;
                }
                if let Some(existing) = duplicate_of(&live, &candidate.content, similar) {
                    // Merged: the existing fact is confirmed once per update, not duplicated.
                    if confirmed.insert(existing.doc) {
                        facts::confirm(&*tx, existing.doc).await.map_err(db_error)?;
                        outcome.facts_reinforced += 1;
                    } else {
                        reject(outcome, "duplicate");
                    }
                    continue;
                }
                let fact = facts::insert(&*tx, scope, new_fact(update, &candidate, "")).await.map_err(db_error)?;
                confirmed.insert(fact.doc);
                live.push(fact);
                outcome.facts_added += 1;
                changed = true;
            }
            Operation::Update { fact_id, candidate } => {
                let Some(index) = live.iter().position(|f| f.fact_id == fact_id) else {
                    // Invalidated since the prompt was built (or earlier in this answer).
                    reject(outcome, "stale_target");
                    continue;
                };
                if candidate.confidence < threshold {
                    reject(outcome, "low_confidence");
                    continue;
                }
                if let Some(refusal) = guard.check(&candidate.content) {
                    reject(outcome, refusal.label());
                    continue;
                }
                let old = &live[index];
                if old.norm == facts::normalise(&candidate.content) && old.category == candidate.category {
                    if confirmed.insert(old.doc) {
                        facts::confirm(&*tx, old.doc).await.map_err(db_error)?;
                        outcome.facts_reinforced += 1;
                    }
                    continue;
                }
                let old = live.remove(index);
                let fact = facts::insert(&*tx, scope, new_fact(update, &candidate, &old.fact_id)).await.map_err(db_error)?;
                facts::invalidate(&*tx, old.doc, "superseded", &fact.fact_id).await.map_err(db_error)?;
                live.push(fact);
                outcome.facts_added += 1;
                outcome.facts_invalidated += 1;
                changed = true;
            }
            Operation::Invalidate { fact_id, reason } => {
                let Some(index) = live.iter().position(|f| f.fact_id == fact_id) else {
                    reject(outcome, "stale_target");
                    continue;
                };
                let old = live.remove(index);
                let reason = if reason.trim().is_empty() { "stale".to_owned() } else { format!("stale: {}", reason.trim()) };
                facts::invalidate(&*tx, old.doc, &reason, "").await.map_err(db_error)?;
                outcome.facts_invalidated += 1;
                changed = true;
            }
        }
    }
    let sections: Vec<_> = answer.summaries.into_iter().map(|(s, text)| (s, text, None)).collect();
    outcome.sections_updated = profile::write(&*tx, &scope.user, &sections).await.map_err(db_error)?;
    if changed {
        facts::enforce_cap(&*tx, scope, memory.config.max_facts as usize).await.map_err(db_error)?;
    }
    if changed || outcome.facts_reinforced > 0 {
        facts::bump_scope(&*tx, scope).await.map_err(db_error)?;
    }
    if !queue::finish(&*tx, update, DONE, outcome).await.map_err(db_error)? {
        // Dropping the transaction rolls every write above back.
        return Err(Failure::Lost);
    }
    tx.commit().await.map_err(db_error)?;
    metrics::counter!("antler_memory_facts_written_total", "source" => "conversation").increment(u64::from(outcome.facts_added));
    Ok(())
}
