//! `/api/memory`: the caller's memory in DeerFlow's `memory.json` shape, read and changed through
//! MemoryService. Reads are ExportMemory (version "1.0" by default: `{version, lastUpdated, user,
//! history, facts}`, the shape the UI's memory page reads; `?version=2.0` for DeerMem's v2), fact
//! changes AddFact / UpdateFact / DeleteFact, and every change answers the memory as it is afterwards,
//! as DeerFlow does. Every route takes `?agent_name=` (Antler keeps facts per agent; empty: the
//! default agent, DeerFlow's user-global memory).

use std::sync::Arc;

use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::{
    AddFactRequest, ClearMemoryRequest, DeleteFactRequest, ExportMemoryRequest, FactCategory, ImportMemoryRequest, UpdateFactRequest,
};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::{Call, refused};
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, Query, read_body};

fn client(call: &Call) -> MemoryServiceClient<antler_kit::transport::Transport> {
    MemoryServiceClient::new(call.channel())
}

fn agent_name(raw: Option<&str>) -> String {
    Query::parse(raw).last("agent_name").unwrap_or_default().to_owned()
}

/// The memory document of `version` ("1.0" or "2.0"), parsed.
async fn document(call: &Call, agent_name: &str, version: &str) -> Result<Value, ApiError> {
    let request = ExportMemoryRequest { agent_name: agent_name.to_owned(), version: version.to_owned() };
    let reply = client(call).export_memory(call.unary(request)).await?.into_inner();
    serde_json::from_str(&reply.document).map_err(|e| ApiError::internal(format!("ExportMemory answered a document that is not JSON: {e}")))
}

/// `GET /api/memory` (and `POST /api/memory/reload`: there is no cache to reload).
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "memory", &caller)?;
    Ok(json_response(&document(&call, &agent_name(raw.as_deref()), "1.0").await?))
}

/// `GET /api/memory/export?version=1.0|2.0` (default 1.0): the document to save as memory.json.
pub async fn export(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let version = match query.last("version") {
        None | Some("1" | "1.0") => "1.0",
        Some("2" | "2.0") => "2.0",
        Some(other) => return Err(ApiError::invalid("version", format!("`{other}` is not a memory.json version: 1.0 or 2.0"))),
    };
    let call = Call::new(&edge, "memory", &caller)?;
    Ok(json_response(&document(&call, &agent_name(raw.as_deref()), version).await?))
}

/// `POST /api/memory/import` with a memory.json (v1 or v2) as the body (ImportMemory). Antler merges:
/// facts already active are skipped and every imported fact is a new version with source IMPORT;
/// summary sections present in the document replace the stored ones. Answers the memory afterwards,
/// with what the import did under `import`.
pub async fn import(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, edge.config.max_body_bytes).await?;
    let document = std::str::from_utf8(&bytes).map_err(|_| ApiError::invalid("body", "must be a memory.json document (UTF-8 JSON)"))?;
    match serde_json::from_str::<Value>(document) {
        Ok(Value::Object(_)) => {}
        Ok(_) => return Err(ApiError::invalid("body", "must be a memory.json object {version, user, history, facts}")),
        Err(e) => return Err(ApiError::bad_request(format!("the body is not valid JSON: {e}"))),
    }
    let agent = agent_name(raw.as_deref());
    let call = Call::new(&edge, "memory", &caller)?;
    let request = ImportMemoryRequest { agent_name: agent.clone(), document: document.to_owned() };
    let reply = client(&call).import_memory(call.unary(request)).await?.into_inner();
    let mut memory = document_of(&call, &agent).await?;
    memory["import"] = json!({
        "version": reply.version,
        "facts_imported": reply.facts_imported,
        "facts_skipped": reply.facts_skipped,
        "sections_imported": reply.sections_imported,
        "evicted_fact_ids": reply.evicted_fact_ids,
    });
    Ok(json_response(&memory))
}

async fn document_of(call: &Call, agent: &str) -> Result<Value, ApiError> {
    document(call, agent, "1.0").await
}

/// A DeerFlow category word as Antler's category (and the label of an unknown one, kept under OTHER).
fn category(field: &str, word: &str) -> Result<(FactCategory, String), ApiError> {
    let word = word.trim().to_lowercase();
    let category = match word.as_str() {
        "preference" => FactCategory::Preference,
        "knowledge" => FactCategory::Knowledge,
        "context" => FactCategory::Context,
        "behavior" => FactCategory::Behavior,
        "goal" => FactCategory::Goal,
        "correction" => FactCategory::Correction,
        "identity" => FactCategory::Identity,
        "constraint" => FactCategory::Constraint,
        "decision" => FactCategory::Decision,
        "other" => FactCategory::Other,
        "" => return Err(ApiError::invalid(field, "must not be empty")),
        _ if word.chars().count() > 64 => return Err(ApiError::invalid(field, "is longer than 64 characters")),
        _ => return Ok((FactCategory::Other, word)),
    };
    Ok((category, String::new()))
}

fn confidence(fields: &mut Fields) -> Result<Option<f64>, ApiError> {
    match fields.take("confidence") {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(c) if (0.0..=1.0).contains(&c) => Ok(Some(c)),
            _ => Err(ApiError::invalid("confidence", format!("{n} is out of range: must be a number from 0 to 1"))),
        },
        Some(_) => Err(ApiError::invalid("confidence", "must be a number from 0 to 1")),
    }
}

/// `POST /api/memory/facts` with `{content, category = "context", confidence = 0.5}` (AddFact). 409
/// when the same content is already an active fact, or when the fact was evicted at once (the scope is
/// full of facts that rank higher), as DeerFlow answers both.
pub async fn create_fact(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let content = fields
        .string("content")?
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| ApiError::invalid("content", "is required and must not be empty"))?;
    let (category, label) = category("category", &fields.string("category")?.unwrap_or_else(|| "context".to_owned()))?;
    let confidence = confidence(&mut fields)?.unwrap_or(0.5);
    fields.finish("a memory fact")?;
    let agent = agent_name(raw.as_deref());
    let call = Call::new(&edge, "memory", &caller)?;
    let request = AddFactRequest {
        agent_name: agent.clone(),
        content,
        category: category as i32,
        category_label: label,
        confidence: Some(confidence),
        ..Default::default()
    };
    let reply = client(&call).add_fact(call.unary(request)).await?.into_inner();
    if reply.deduplicated {
        return Err(refused(StatusCode::CONFLICT, "content", "A fact with the same content already exists."));
    }
    if reply.fact.as_ref().is_some_and(|f| reply.evicted_fact_ids.contains(&f.id)) {
        return Err(refused(
            StatusCode::CONFLICT,
            "content",
            "Fact was not stored because the memory's fact cap (memory.max_facts) evicted it",
        ));
    }
    Ok(json_response(&document_of(&call, &agent).await?))
}

/// `PATCH /api/memory/facts/{fact_id}` with any of `{content, category, confidence}` (UpdateFact: a
/// new version replaces the fact, so its id changes).
pub async fn update_fact(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(fact_id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let content = fields.string("content")?;
    if content.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(ApiError::invalid("content", "must not be empty"));
    }
    let category = fields.string("category")?.map(|c| category("category", &c)).transpose()?;
    let confidence = confidence(&mut fields)?;
    fields.finish("a memory fact patch")?;
    let agent = agent_name(raw.as_deref());
    let call = Call::new(&edge, "memory", &caller)?;
    let (category, label) = match category {
        Some((category, label)) => (category as i32, (category == FactCategory::Other).then_some(label)),
        None => (FactCategory::Unspecified as i32, None),
    };
    let request = UpdateFactRequest {
        agent_name: agent.clone(),
        fact_id,
        content,
        category,
        category_label: label,
        confidence,
        source_error: None,
        reason: "edited in the web UI".to_owned(),
    };
    client(&call).update_fact(call.unary(request)).await?;
    Ok(json_response(&document_of(&call, &agent).await?))
}

/// `DELETE /api/memory/facts/{fact_id}` (DeleteFact: the fact is invalidated, kept for history).
pub async fn delete_fact(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(fact_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let agent = agent_name(raw.as_deref());
    let call = Call::new(&edge, "memory", &caller)?;
    let request = DeleteFactRequest { agent_name: agent.clone(), fact_id, reason: "deleted in the web UI".to_owned(), purge: false };
    client(&call).delete_fact(call.unary(request)).await?;
    Ok(json_response(&document_of(&call, &agent).await?))
}

/// `DELETE /api/memory` (ClearMemory): every active fact of the scope is invalidated and the summary
/// sections emptied; answers the (empty) memory, with `cleared: {facts_invalidated, sections_cleared}`.
pub async fn clear(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let agent = agent_name(raw.as_deref());
    let call = Call::new(&edge, "memory", &caller)?;
    let reply =
        client(&call).clear_memory(call.unary(ClearMemoryRequest { agent_name: agent.clone(), keep_sections: false })).await?.into_inner();
    let mut memory = document_of(&call, &agent).await?;
    memory["cleared"] = json!({ "facts_invalidated": reply.facts_invalidated, "sections_cleared": reply.sections_cleared });
    Ok(json_response(&memory))
}
