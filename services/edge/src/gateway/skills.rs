//! `/api/skills`: the caller's skills through the SkillService the sandbox service serves. Public
//! skills are the server's; custom ones the caller's own (another user's custom skill is 404). The
//! enabled state is per user (SetSkillEnabled), so no admin rights are needed; installing a `.skill`
//! archive the agent produced in a thread streams it from the sandbox (DownloadFile) into InstallSkill,
//! which checks it (size, entries, paths, frontmatter) before anything is kept.

use std::sync::Arc;

use antler_proto::sandbox::download_file_response::Payload as DownloadPayload;
use antler_proto::sandbox::install_skill_request::Part;
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::skill_service_client::SkillServiceClient;
use antler_proto::sandbox::{
    DeleteSkillRequest, DownloadFileRequest, DownloadFileResponse, GetSkillRequest, InstallSkillHeader, InstallSkillRequest,
    ListSkillsRequest, SetSkillEnabledRequest, Skill, SkillCategory,
};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::Call;
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, read_body};

/// DeerFlow's `SkillResponse` (and Antler's own fields beside it: where the skill is mounted, the
/// tools it allows, why it is invalid).
fn skill_json(skill: &Skill) -> Map<String, Value> {
    let custom = skill.category == SkillCategory::Custom as i32;
    let mut out = Map::new();
    out.insert("name".to_owned(), json!(skill.name));
    out.insert("description".to_owned(), json!(skill.description));
    out.insert("license".to_owned(), if skill.license.is_empty() { Value::Null } else { json!(skill.license) });
    out.insert("category".to_owned(), json!(if custom { "custom" } else { "public" }));
    out.insert("enabled".to_owned(), json!(skill.enabled));
    out.insert("editable".to_owned(), json!(custom));
    out.insert("container_path".to_owned(), json!(skill.container_path));
    if let Some(tools) = &skill.allowed_tools {
        out.insert("allowed_tools".to_owned(), json!(tools.tools));
    }
    if !skill.error.is_empty() {
        out.insert("error".to_owned(), json!(skill.error));
    }
    out
}

fn client(call: &Call) -> SkillServiceClient<antler_kit::transport::Transport> {
    SkillServiceClient::new(call.channel())
}

async fn listed(edge: &Edge, caller: &Caller, custom_only: bool) -> Result<Response, ApiError> {
    let call = Call::new(edge, "sandbox", caller)?;
    let reply = client(&call).list_skills(call.unary(ListSkillsRequest { enabled_only: false })).await?.into_inner();
    let skills: Vec<Value> = reply
        .skills
        .iter()
        .filter(|s| !custom_only || s.category == SkillCategory::Custom as i32)
        .map(|s| Value::Object(skill_json(s)))
        .collect();
    Ok(json_response(&json!({ "skills": skills })))
}

/// `GET /api/skills`: public skills, then the caller's custom ones.
pub async fn list(State(edge): State<Arc<Edge>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    listed(&edge, &caller, false).await
}

/// `GET /api/skills/custom`: the caller's custom skills.
pub async fn list_custom(State(edge): State<Arc<Edge>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    listed(&edge, &caller, true).await
}

/// `GET /api/skills/{skill_name}`.
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(skill_name): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    let reply = client(&call).get_skill(call.unary(GetSkillRequest { name: skill_name })).await?.into_inner();
    let skill = reply.skill.ok_or_else(|| ApiError::internal("GetSkill answered without a skill"))?;
    Ok(json_response(&Value::Object(skill_json(&skill))))
}

/// `GET /api/skills/custom/{skill_name}`: a custom skill with its SKILL.md as `content`.
pub async fn get_custom(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(skill_name): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    let reply = client(&call).get_skill(call.unary(GetSkillRequest { name: skill_name.clone() })).await?.into_inner();
    let skill = reply.skill.ok_or_else(|| ApiError::internal("GetSkill answered without a skill"))?;
    if skill.category != SkillCategory::Custom as i32 {
        return Err(ApiError::not_found(format!("Custom skill '{skill_name}'")));
    }
    let mut out = skill_json(&skill);
    out.insert("content".to_owned(), json!(reply.skill_md));
    out.insert("content_truncated".to_owned(), json!(reply.skill_md_truncated));
    Ok(json_response(&Value::Object(out)))
}

/// `PUT /api/skills/custom/{skill_name}`: not served (SkillService replaces a skill only whole, from
/// an archive).
pub async fn edit_custom(edge: State<Arc<Edge>>, headers: HeaderMap, body: Body) -> ApiError {
    crate::edge::unsupported(
        edge,
        headers,
        body,
        "editing a custom skill's SKILL.md in place: install the changed skill as a .skill archive (POST /api/skills/install replaces it)",
    )
    .await
}

/// `DELETE /api/skills/custom/{skill_name}` (DeleteSkill).
pub async fn delete_custom(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(skill_name): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    client(&call).delete_skill(call.unary(DeleteSkillRequest { name: skill_name })).await?;
    Ok(json_response(&json!({ "success": true })))
}

/// `PUT /api/skills/{skill_name}` with `{enabled}` (SetSkillEnabled: for the caller only).
pub async fn set_enabled(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(skill_name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let enabled = fields.bool("enabled")?.ok_or_else(|| ApiError::invalid("enabled", "is required: true or false"))?;
    fields.finish("a skill update")?;
    let call = Call::new(&edge, "sandbox", &caller)?;
    let reply = client(&call).set_skill_enabled(call.unary(SetSkillEnabledRequest { name: skill_name, enabled })).await?.into_inner();
    let skill = reply.skill.ok_or_else(|| ApiError::internal("SetSkillEnabled answered without a skill"))?;
    Ok(json_response(&Value::Object(skill_json(&skill))))
}

/// `POST /api/skills/reload`: skills are read from disk by every listing, so nothing is cached.
pub async fn reload() -> Response {
    json_response(
        &json!({ "success": true, "scope": "process", "message": "Skills are read from disk on every listing; nothing to reload." }),
    )
}

/// `POST /api/skills/install` with `{thread_id, path}`: the `.skill` archive at `path` in the thread's
/// sandbox becomes a custom skill of the caller's (409 when one of that name exists).
pub async fn install(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let thread_id = fields.string("thread_id")?.filter(|t| !t.is_empty()).ok_or_else(|| ApiError::invalid("thread_id", "is required"))?;
    let path = fields.string("path")?.filter(|p| !p.is_empty()).ok_or_else(|| {
        ApiError::invalid("path", "is required: the virtual path of the .skill file, e.g. /mnt/user-data/outputs/my-skill.skill")
    })?;
    fields.finish("a skill installation")?;
    let path = format!("/{}", path.trim_start_matches('/'));
    if !path.ends_with(".skill") {
        return Err(ApiError::invalid("path", format!("`{path}` is not a .skill archive")));
    }
    let call = Call::new(&edge, "sandbox", &caller)?;
    let request = DownloadFileRequest { thread_id, path: path.clone(), chunk_size: 1024 * 1024 };
    let mut download = SandboxServiceClient::new(call.channel()).download_file(call.transfer(request)).await?.into_inner();
    // The header first: a missing file or another user's thread is answered before InstallSkill starts.
    match download.next().await {
        Some(Ok(DownloadFileResponse { payload: Some(DownloadPayload::Header(_)) })) => {}
        Some(Err(status)) => return Err(status.into()),
        _ => return Err(ApiError::internal("DownloadFile did not start with its header")),
    }
    let file_name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let header = InstallSkillRequest { part: Some(Part::Header(InstallSkillHeader { replace: false, file_name })) };
    // A download that breaks ends the archive early; InstallSkill then refuses it as not a zip.
    let chunks = download.take_while(|m| std::future::ready(m.is_ok())).filter_map(|message| async move {
        match message.ok()?.payload {
            Some(DownloadPayload::Chunk(bytes)) => Some(InstallSkillRequest { part: Some(Part::Chunk(bytes)) }),
            _ => None,
        }
    });
    let stream = futures::stream::once(async move { header }).chain(chunks);
    let reply = client(&call).install_skill(call.transfer(stream)).await?.into_inner();
    let skill = reply.skill.ok_or_else(|| ApiError::internal("InstallSkill answered without a skill"))?;
    Ok(json_response(&json!({
        "success": true,
        "skill_name": skill.name,
        "message": format!("Skill '{}' installed successfully", skill.name),
        "skill": Value::Object(skill_json(&skill)),
        // The skill scan's WARNING and INFO findings (an Antler addition; CRITICAL ones refuse the install).
        "findings": reply.findings.iter().map(|f| json!({
            "rule_id": f.rule_id,
            "severity": f.severity().as_str_name().trim_start_matches("SKILL_FINDING_SEVERITY_"),
            "file": f.file,
            "line": f.line,
            "evidence": f.evidence,
            "reason": f.reason,
        })).collect::<Vec<_>>(),
    })))
}
