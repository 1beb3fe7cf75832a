//! Thin tonic handlers for `antler.memory.v1`: read the caller, check the request's own fields against
//! the configured limits, call [`Core`], convert. Errors become statuses in one place
//! (`impl From<MemoryError> for Status`).

use std::sync::Arc;
use std::time::Duration;

use antler_kit::Identity;
use antler_proto::common::PageResponse;
use antler_proto::memory::*;
use sha2::Digest;
use tonic::{Request, Response, Status};

use crate::error::MemoryError;
use crate::facts::{self, NewFact, Scope};
use crate::filter;
use crate::import;
use crate::profile::{Profile, Section};
use crate::queue::{self, Enqueue, FlushFilter};
use crate::render::Budget;
use crate::service::{FactChange, Memory as Core};
use crate::store::entity::facts::Model as FactRow;

/// `antler.memory.v1.MemoryService`.
#[derive(Debug, Clone)]
pub struct MemoryApi {
    memory: Arc<Core>,
}

impl MemoryApi {
    pub fn new(memory: Arc<Core>) -> Self {
        Self { memory }
    }
}

pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 200;
pub const DEFAULT_SEARCH: u32 = 10;
pub const MAX_SEARCH: u32 = 100;
pub const MAX_LABEL_CHARS: usize = 64;
pub const MAX_SOURCE_ERROR_CHARS: usize = 1000;
pub const MAX_REASON_CHARS: usize = 500;
pub const MAX_ID_CHARS: usize = 256;

fn user<T>(request: &Request<T>) -> Result<String, Status> {
    Ok(Identity::of(request)?.user_id.clone())
}

fn check_agent(agent: &str) -> Result<(), MemoryError> {
    let ok = agent.is_empty() || (agent.len() <= 64 && agent.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    if ok { Ok(()) } else { Err(MemoryError::invalid("agent_name", "must match ^[a-z0-9-]{1,64}$ (or be empty for the default agent)")) }
}

fn scope<T>(request: &Request<T>, agent: &str, memory: &Core) -> Result<Scope, Status> {
    memory.check_enabled()?;
    let user = user(request)?;
    check_agent(agent)?;
    Ok(Scope::new(user, agent))
}

fn check_thread(field: &str, thread_id: &str) -> Result<(), MemoryError> {
    let ok = (1..=64).contains(&thread_id.len()) && thread_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok { Ok(()) } else { Err(MemoryError::invalid(field, "must match ^[A-Za-z0-9_-]{1,64}$")) }
}

fn check_len(field: &str, text: &str, max: usize, setting: Option<&str>) -> Result<(), MemoryError> {
    let n = text.chars().count();
    if n <= max {
        return Ok(());
    }
    let setting = setting.map(|s| format!(" ({s})")).unwrap_or_default();
    Err(MemoryError::invalid(field, format!("{n} characters is above the limit of {max} characters{setting}")))
}

fn check_content(field: &str, content: &str, memory: &Core) -> Result<(), MemoryError> {
    if content.trim().is_empty() {
        return Err(MemoryError::invalid(field, "is required and must not be blank"));
    }
    check_len(field, content, memory.config.max_fact_chars as usize, Some("memory.max_fact_chars"))
}

fn check_confidence(field: &str, confidence: f64) -> Result<(), MemoryError> {
    if confidence.is_finite() && (0.0..=1.0).contains(&confidence) {
        Ok(())
    } else {
        Err(MemoryError::invalid(field, format!("{confidence} is outside the range 0.0 to 1.0")))
    }
}

/// The category name of a proto value; None for UNSPECIFIED; an error for a number that is no category.
fn category_name(field: &str, value: i32) -> Result<Option<&'static str>, MemoryError> {
    let name = match FactCategory::try_from(value) {
        Ok(FactCategory::Unspecified) => return Ok(None),
        Ok(FactCategory::Preference) => "preference",
        Ok(FactCategory::Knowledge) => "knowledge",
        Ok(FactCategory::Context) => "context",
        Ok(FactCategory::Behavior) => "behavior",
        Ok(FactCategory::Goal) => "goal",
        Ok(FactCategory::Correction) => "correction",
        Ok(FactCategory::Identity) => "identity",
        Ok(FactCategory::Constraint) => "constraint",
        Ok(FactCategory::Decision) => "decision",
        Ok(FactCategory::Other) => "other",
        Err(_) => return Err(MemoryError::invalid(field, format!("{value} is not a FactCategory (1 to 10; see the proto)"))),
    };
    Ok(Some(name))
}

fn category_value(name: &str) -> FactCategory {
    match name {
        "preference" => FactCategory::Preference,
        "knowledge" => FactCategory::Knowledge,
        "context" => FactCategory::Context,
        "behavior" => FactCategory::Behavior,
        "goal" => FactCategory::Goal,
        "correction" => FactCategory::Correction,
        "identity" => FactCategory::Identity,
        "constraint" => FactCategory::Constraint,
        "decision" => FactCategory::Decision,
        _ => FactCategory::Other,
    }
}

fn categories(field: &str, values: &[i32]) -> Result<Vec<String>, MemoryError> {
    let mut out = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match category_name(&format!("{field}[{i}]"), *v)? {
            Some(name) => out.push(name.to_owned()),
            None => return Err(MemoryError::invalid(format!("{field}[{i}]"), "FACT_CATEGORY_UNSPECIFIED is not a filter")),
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn source_kind_name(value: i32) -> &'static str {
    match FactSourceKind::try_from(value) {
        Ok(FactSourceKind::Conversation) => facts::source::CONVERSATION,
        Ok(FactSourceKind::Consolidation) => facts::source::CONSOLIDATION,
        Ok(FactSourceKind::Import) => facts::source::IMPORT,
        _ => facts::source::MANUAL,
    }
}

fn source_kind_value(name: &str) -> FactSourceKind {
    match name {
        facts::source::CONVERSATION => FactSourceKind::Conversation,
        facts::source::CONSOLIDATION => FactSourceKind::Consolidation,
        facts::source::IMPORT => FactSourceKind::Import,
        _ => FactSourceKind::Manual,
    }
}

fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

fn timestamp_ms(field: &str, ts: &prost_types::Timestamp) -> Result<i64, MemoryError> {
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return Err(MemoryError::invalid(field, "nanos must be between 0 and 999999999"));
    }
    ts.seconds.checked_mul(1000).map(|s| s + i64::from(ts.nanos) / 1_000_000).ok_or_else(|| MemoryError::invalid(field, "is out of range"))
}

/// A stored version as the API shows it.
pub fn fact_message(f: FactRow) -> Fact {
    Fact {
        id: f.fact_id,
        agent_name: f.agent_name,
        content: f.content,
        category: category_value(&f.category) as i32,
        category_label: f.category_label,
        confidence: f.confidence,
        source: Some(FactSource {
            kind: source_kind_value(&f.source_kind) as i32,
            thread_id: f.source_thread_id,
            run_id: f.source_run_id,
            message_id: f.source_message_id,
        }),
        source_error: f.source_error,
        valid_from: Some(timestamp(f.valid_from)),
        invalidated_at: f.invalidated_at.map(timestamp),
        invalidation_reason: f.invalidation_reason,
        superseded_by: f.superseded_by,
        supersedes: f.supersedes,
        confirmation_count: f.confirmation_count.max(0) as u32,
        last_confirmed_at: f.last_confirmed_at.map(timestamp),
        created_at: Some(timestamp(f.created_at)),
    }
}

fn section(profile: &Profile, s: Section) -> SummarySection {
    let (summary, at) = profile.get(s);
    SummarySection { summary: summary.clone(), updated_at: at.map(timestamp) }
}

/// Page tokens name the last fact returned and the filters they belong to.
fn filter_hash(scope: &Scope, categories: &[String], include_invalidated: bool) -> String {
    let digest = sha2::Sha256::digest(format!("{}\0{}\0{include_invalidated}", scope.agent, categories.join(",")).as_bytes());
    hex::encode(&digest[..6])
}

fn encode_token(created_at: i64, fact_id: &str, filters: &str) -> String {
    hex::encode(format!("{created_at}:{fact_id}:{filters}"))
}

fn decode_token(token: &str, filters: &str) -> Result<Option<(i64, String)>, MemoryError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || MemoryError::invalid("page.page_token", "is not a token returned by ListFacts");
    let text = String::from_utf8(hex::decode(token).map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = text.splitn(3, ':');
    let (Some(at), Some(id), Some(hash)) = (parts.next(), parts.next(), parts.next()) else { return Err(bad()) };
    if hash != filters {
        return Err(MemoryError::invalid(
            "page.page_token",
            "was issued for different filters (agent_name, categories, include_invalidated)",
        ));
    }
    Ok(Some((at.parse().map_err(|_| bad())?, id.to_owned())))
}

#[tonic::async_trait]
impl memory_service_server::MemoryService for MemoryApi {
    async fn get_memory(&self, request: Request<GetMemoryRequest>) -> Result<Response<GetMemoryResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let o = self.memory.overview(&scope).await?;
        let memory = Memory {
            agent_name: scope.agent.clone(),
            profile: Some(UserProfile {
                work_context: Some(section(&o.profile, Section::WorkContext)),
                personal_context: Some(section(&o.profile, Section::PersonalContext)),
                top_of_mind: Some(section(&o.profile, Section::TopOfMind)),
            }),
            history: Some(UserHistory {
                recent_months: Some(section(&o.profile, Section::RecentMonths)),
                earlier_context: Some(section(&o.profile, Section::EarlierContext)),
                long_term_background: Some(section(&o.profile, Section::LongTermBackground)),
            }),
            revision: o.revision,
            updated_at: o.updated_at.map(timestamp),
            active_fact_count: u32::try_from(o.active).unwrap_or(u32::MAX),
            invalidated_fact_count: u32::try_from(o.invalidated).unwrap_or(u32::MAX),
        };
        Ok(Response::new(GetMemoryResponse { memory: Some(memory) }))
    }

    async fn list_facts(&self, request: Request<ListFactsRequest>) -> Result<Response<ListFactsResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        let cats = categories("categories", &r.categories)?;
        let page = r.page.unwrap_or_default();
        let size = u64::from(if page.page_size == 0 { DEFAULT_PAGE } else { page.page_size.min(MAX_PAGE) });
        let filters = filter_hash(&scope, &cats, r.include_invalidated);
        let after = decode_token(&page.page_token, &filters)?;
        let mut rows =
            facts::page(self.memory.store.db(), &scope, &cats, r.include_invalidated, after, size + 1).await.map_err(MemoryError::from)?;
        let more = rows.len() as u64 > size;
        rows.truncate(size as usize);
        let next_page_token = match (more, rows.last()) {
            (true, Some(last)) => encode_token(last.created_at, &last.fact_id, &filters),
            _ => String::new(),
        };
        Ok(Response::new(ListFactsResponse {
            facts: rows.into_iter().map(fact_message).collect(),
            page: Some(PageResponse { next_page_token }),
        }))
    }

    async fn search_facts(&self, request: Request<SearchFactsRequest>) -> Result<Response<SearchFactsResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        if r.query.trim().is_empty() {
            return Err(MemoryError::invalid("query", "is required").into());
        }
        check_len("query", &r.query, self.memory.config.max_query_chars as usize, Some("memory.max_query_chars"))?;
        if r.limit > MAX_SEARCH {
            return Err(MemoryError::invalid("limit", format!("{} is above the limit of {MAX_SEARCH}", r.limit)).into());
        }
        let limit = if r.limit == 0 { DEFAULT_SEARCH } else { r.limit };
        let cats = categories("categories", &r.categories)?;
        let found = facts::search(self.memory.store.db(), &scope, &r.query, &cats, u64::from(limit)).await.map_err(MemoryError::from)?;
        Ok(Response::new(SearchFactsResponse {
            results: found.into_iter().map(|(f, score)| ScoredFact { fact: Some(fact_message(f)), score }).collect(),
        }))
    }

    async fn add_fact(&self, request: Request<AddFactRequest>) -> Result<Response<AddFactResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        check_content("content", &r.content, &self.memory)?;
        let category = category_name("category", r.category)?.unwrap_or("context");
        if category == "other" {
            check_len("category_label", &r.category_label, MAX_LABEL_CHARS, None)?;
        } else if !r.category_label.is_empty() {
            return Err(MemoryError::invalid("category_label", "is only allowed with category FACT_CATEGORY_OTHER").into());
        }
        let confidence = r.confidence.unwrap_or(0.7);
        check_confidence("confidence", confidence)?;
        check_len("source_error", &r.source_error, MAX_SOURCE_ERROR_CHARS, None)?;
        let source = r.source.unwrap_or_default();
        if !source.thread_id.is_empty() {
            check_thread("source.thread_id", &source.thread_id)?;
        }
        check_len("source.run_id", &source.run_id, MAX_ID_CHARS, None)?;
        check_len("source.message_id", &source.message_id, MAX_ID_CHARS, None)?;
        let valid_from = r.valid_from.as_ref().map(|t| timestamp_ms("valid_from", t)).transpose()?;
        let new = NewFact {
            content: r.content.trim().to_owned(),
            category: category.to_owned(),
            category_label: r.category_label,
            confidence,
            source_kind: source_kind_name(source.kind).to_owned(),
            thread_id: source.thread_id,
            run_id: source.run_id,
            message_id: source.message_id,
            source_error: r.source_error,
            valid_from,
            ..NewFact::default()
        };
        let added = self.memory.add_fact(&scope, new).await?;
        Ok(Response::new(AddFactResponse {
            fact: Some(fact_message(added.fact)),
            deduplicated: added.deduplicated,
            evicted_fact_ids: added.evicted,
        }))
    }

    async fn update_fact(&self, request: Request<UpdateFactRequest>) -> Result<Response<UpdateFactResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        antler_kit::status::required("fact_id", &r.fact_id)?;
        if let Some(content) = &r.content {
            check_content("content", content, &self.memory)?;
        }
        let category = category_name("category", r.category)?.map(str::to_owned);
        if let Some(label) = &r.category_label {
            check_len("category_label", label, MAX_LABEL_CHARS, None)?;
        }
        if let Some(confidence) = r.confidence {
            check_confidence("confidence", confidence)?;
        }
        if let Some(source_error) = &r.source_error {
            check_len("source_error", source_error, MAX_SOURCE_ERROR_CHARS, None)?;
        }
        check_len("reason", &r.reason, MAX_REASON_CHARS, None)?;
        if r.content.is_none() && category.is_none() && r.category_label.is_none() && r.confidence.is_none() && r.source_error.is_none() {
            return Err(MemoryError::invalid(
                "content",
                "nothing to change: set content, category, category_label, confidence or source_error",
            )
            .into());
        }
        let change = FactChange {
            content: r.content.map(|c| c.trim().to_owned()),
            category,
            category_label: r.category_label,
            confidence: r.confidence,
            source_error: r.source_error,
            reason: r.reason,
        };
        let (fact, previous) = self.memory.update_fact(&scope, &r.fact_id, change).await?;
        Ok(Response::new(UpdateFactResponse { fact: Some(fact_message(fact)), previous: Some(fact_message(previous)) }))
    }

    async fn delete_fact(&self, request: Request<DeleteFactRequest>) -> Result<Response<DeleteFactResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        antler_kit::status::required("fact_id", &r.fact_id)?;
        check_len("reason", &r.reason, MAX_REASON_CHARS, None)?;
        let (fact, purged) = self.memory.delete_fact(&scope, &r.fact_id, &r.reason, r.purge).await?;
        Ok(Response::new(DeleteFactResponse { fact: fact.map(fact_message), purged_versions: purged }))
    }

    async fn queue_update(&self, request: Request<QueueUpdateRequest>) -> Result<Response<QueueUpdateResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        check_thread("thread_id", &r.thread_id)?;
        if r.messages.is_empty() {
            return Err(MemoryError::invalid("messages", "is required: at least one message").into());
        }
        let max = self.memory.config.max_update_messages as usize;
        if r.messages.len() > max {
            return Err(MemoryError::invalid(
                "messages",
                format!("{} messages is above the limit of {max} (memory.max_update_messages)", r.messages.len()),
            )
            .into());
        }
        check_len("run_id", &r.run_id, MAX_ID_CHARS, None)?;
        check_len("model_name", &r.model_name, MAX_ID_CHARS, None)?;
        let mut filtered = filter::filter(&r.messages);
        filter::bound(&mut filtered.turns, self.memory.config.max_conversation_chars as usize);
        let delay_ms = if r.immediate { 0 } else { (self.memory.config.debounce_seconds * 1000) as i64 };
        let queued = self
            .memory
            .queue_writer
            .enqueue(Enqueue { scope, thread_id: r.thread_id, run_id: r.run_id, model_name: r.model_name, filtered, delay_ms })
            .await?;
        // Idle workers look at the queue again within `poll_interval_ms` and then sleep until the
        // earliest due update, so only an update due sooner needs them now. Waking them for every update
        // made each idle worker run a claim transaction through the one SQLite writer per QueueUpdate
        // (four with `workers: 4`), which is what bounded QueueUpdate/s.
        if delay_ms < self.memory.config.poll_interval_ms as i64 {
            self.memory.wake.notify_waiters();
        }
        Ok(Response::new(QueueUpdateResponse {
            queue_position: u32::try_from(queued.position).unwrap_or(u32::MAX),
            queue_depth: u32::try_from(queued.depth).unwrap_or(u32::MAX),
            replaced_pending: queued.replaced,
            scheduled_at: Some(timestamp(queued.scheduled_at)),
        }))
    }

    async fn flush_updates(&self, request: Request<FlushUpdatesRequest>) -> Result<Response<FlushUpdatesResponse>, Status> {
        self.memory.check_enabled()?;
        let user = user(&request)?;
        let r = request.into_inner();
        if !r.thread_id.is_empty() {
            check_thread("thread_id", &r.thread_id)?;
        }
        check_agent(&r.agent_name)?;
        let timeout = match &r.timeout {
            None => Duration::from_secs(30),
            Some(d) => {
                let ms = d.seconds.saturating_mul(1000).saturating_add(i64::from(d.nanos) / 1_000_000);
                if !(1000..=300_000).contains(&ms) {
                    return Err(MemoryError::invalid("timeout", "must be between 1s and 300s").into());
                }
                Duration::from_millis(ms as u64)
            }
        };
        let agent = if r.thread_id.is_empty() && r.agent_name.is_empty() { None } else { Some(r.agent_name.as_str()) };
        let filter = FlushFilter { user: &user, thread_id: &r.thread_id, agent };
        let (flushed, ids) = queue::flush(&self.memory.store, &filter).await.map_err(MemoryError::from)?;
        self.memory.wake.notify_waiters();
        let mut response = FlushUpdatesResponse { flushed: u32::try_from(flushed).unwrap_or(u32::MAX), ..Default::default() };
        if r.wait {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut finished = self.memory.finished.subscribe();
            let poll = Duration::from_millis(self.memory.config.poll_interval_ms);
            loop {
                let (outcomes, open) = queue::progress(&self.memory.store, &ids).await.map_err(MemoryError::from)?;
                if open == 0 {
                    response.completed = true;
                    response.outcomes = outcomes;
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    response.outcomes = outcomes;
                    break;
                }
                // Woken by this replica's workers at once; another replica's finish is seen at the poll.
                tokio::select! {
                    _ = finished.changed() => {}
                    () = tokio::time::sleep(poll) => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
        response.pending =
            u32::try_from(queue::open_count(&self.memory.store, &filter).await.map_err(MemoryError::from)?).unwrap_or(u32::MAX);
        Ok(Response::new(response))
    }

    async fn render_injection(&self, request: Request<RenderInjectionRequest>) -> Result<Response<RenderInjectionResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        if r.max_tokens != 0 && !(100..=8000).contains(&r.max_tokens) {
            return Err(MemoryError::invalid(
                "max_tokens",
                format!("{} is outside the range 100 to 8000 (0 = memory.max_injection_tokens)", r.max_tokens),
            )
            .into());
        }
        check_len("query", &r.query, self.memory.config.max_query_chars as usize, Some("memory.max_query_chars"))?;
        let config = &self.memory.config;
        let counting = match config.token_counting {
            crate::config::TokenCounting::Tiktoken => TokenCounting::Tiktoken,
            crate::config::TokenCounting::Chars => TokenCounting::Chars,
        };
        if !config.injection_enabled {
            return Ok(Response::new(RenderInjectionResponse {
                injection_disabled: true,
                token_counting: counting as i32,
                ..Default::default()
            }));
        }
        let budget = Budget {
            tokens: if r.max_tokens == 0 { config.max_injection_tokens } else { r.max_tokens } as usize,
            corrections: config.correction_token_budget as usize,
            counting: config.token_counting,
            summaries_only: r.summaries_only,
        };
        let (rendered, revision) = self.memory.render(&scope, &r.query, &budget).await?;
        Ok(Response::new(RenderInjectionResponse {
            text: rendered.text,
            token_estimate: u32::try_from(rendered.tokens).unwrap_or(u32::MAX),
            token_counting: counting as i32,
            included_fact_ids: rendered.included,
            omitted_fact_count: u32::try_from(rendered.omitted).unwrap_or(u32::MAX),
            revision,
            injection_disabled: false,
        }))
    }

    async fn import_memory(&self, request: Request<ImportMemoryRequest>) -> Result<Response<ImportMemoryResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        let max = self.memory.config.max_import_bytes as usize;
        if r.document.len() > max {
            return Err(MemoryError::ResourceExhausted(format!(
                "document: {} bytes is above the limit of {max} bytes (memory.max_import_bytes)",
                r.document.len()
            ))
            .into());
        }
        if r.document.trim().is_empty() {
            return Err(MemoryError::invalid("document", "is required").into());
        }
        let parsed = import::parse(&r.document, self.memory.config.max_fact_chars as usize)?;
        let (imported, skipped, sections, evicted) = self.memory.import(&scope, parsed.sections, parsed.facts).await?;
        Ok(Response::new(ImportMemoryResponse {
            version: parsed.version,
            facts_imported: imported,
            facts_skipped: skipped + parsed.inactive,
            sections_imported: sections,
            evicted_fact_ids: evicted,
        }))
    }

    async fn clear_memory(&self, request: Request<ClearMemoryRequest>) -> Result<Response<ClearMemoryResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let (facts_invalidated, sections_cleared) = self.memory.clear(&scope, request.get_ref().keep_sections).await?;
        tracing::info!(agent = %scope.agent, facts_invalidated, sections_cleared, "memory cleared");
        Ok(Response::new(ClearMemoryResponse { facts_invalidated, sections_cleared }))
    }

    async fn export_memory(&self, request: Request<ExportMemoryRequest>) -> Result<Response<ExportMemoryResponse>, Status> {
        let scope = scope(&request, &request.get_ref().agent_name, &self.memory)?;
        let r = request.into_inner();
        let version = match r.version.as_str() {
            "" | "2.0" | "2" => "2.0",
            "1.0" | "1" => "1.0",
            other => {
                return Err(
                    MemoryError::invalid("version", format!("`{other}` is not a memory.json version; use \"1.0\" or \"2.0\"")).into()
                );
            }
        };
        let (profile, live, revision) = self.memory.export(&scope).await?;
        let count = live.len();
        Ok(Response::new(ExportMemoryResponse {
            document: import::export(version, &profile, &live, revision),
            fact_count: u32::try_from(count).unwrap_or(u32::MAX),
        }))
    }
}
