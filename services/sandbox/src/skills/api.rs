//! Thin tonic handlers for `antler.sandbox.v1.SkillService`: the caller's identity, proto ⇄ domain, and
//! the [`Library`] doing the work on the blocking pool.

use std::io::Write;
use std::sync::Arc;

use antler_kit::Identity;
use antler_proto::sandbox::skill_service_server::SkillService;
use antler_proto::sandbox::*;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::Category;
use super::library::{self, Library};
use crate::error::SandboxError;

/// `antler.sandbox.v1.SkillService`.
#[derive(Debug, Clone)]
pub struct SkillApi {
    library: Arc<Library>,
    max_archive_bytes: u64,
    show_max_chars: usize,
}

impl SkillApi {
    pub fn new(library: Arc<Library>, config: &crate::config::SandboxConfig) -> Self {
        Self {
            library,
            max_archive_bytes: config.skills.max_archive_bytes,
            show_max_chars: usize::try_from(config.files.read_max_chars).unwrap_or(usize::MAX),
        }
    }
}

fn user<T>(request: &Request<T>) -> Result<String, Status> {
    Ok(Identity::of(request)?.user_id.clone())
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> crate::error::Result<T> + Send + 'static) -> Result<T, Status> {
    let result = tokio::task::spawn_blocking(work).await.map_err(|e| Status::internal(format!("a skills task failed: {e}")))?;
    Ok(result?)
}

/// The proto form of a skill.
pub fn to_proto(skill: &library::Skill) -> Skill {
    let category = match skill.category {
        Category::Public => SkillCategory::Public,
        Category::Custom => SkillCategory::Custom,
    };
    let (description, license, allowed_tools, error) = match &skill.meta {
        Ok(meta) => (
            meta.description.clone(),
            meta.license.clone().unwrap_or_default(),
            meta.allowed_tools.as_ref().map(|tools| SkillToolPolicy { tools: tools.clone() }),
            String::new(),
        ),
        Err(error) => (String::new(), String::new(), None, error.clone()),
    };
    Skill {
        name: skill.dir_name.clone(),
        description,
        category: category as i32,
        enabled: skill.enabled,
        container_path: skill.container_path(),
        license,
        allowed_tools,
        error,
    }
}

/// The proto form of a scan finding.
pub fn finding_to_proto(finding: &super::scan::Finding) -> SkillFinding {
    use super::scan::Severity;
    let severity = match finding.rule.severity {
        Severity::Info => SkillFindingSeverity::Info,
        Severity::Warning => SkillFindingSeverity::Warning,
        Severity::Critical => SkillFindingSeverity::Critical,
    };
    SkillFinding {
        rule_id: finding.rule.id.to_owned(),
        severity: severity as i32,
        file: finding.file.clone(),
        line: finding.line,
        evidence: finding.evidence.clone(),
        reason: finding.rule.reason.to_owned(),
    }
}

#[tonic::async_trait]
impl SkillService for SkillApi {
    async fn list_skills(&self, request: Request<ListSkillsRequest>) -> Result<Response<ListSkillsResponse>, Status> {
        let user = user(&request)?;
        let enabled_only = request.get_ref().enabled_only;
        let library = self.library.clone();
        let skills = blocking(move || library.list(&user)).await?;
        let skills = skills.iter().filter(|s| !enabled_only || s.enabled).map(to_proto).collect();
        Ok(Response::new(ListSkillsResponse { skills }))
    }

    async fn get_skill(&self, request: Request<GetSkillRequest>) -> Result<Response<GetSkillResponse>, Status> {
        let user = user(&request)?;
        let name = request.into_inner().name;
        let (library, max) = (self.library.clone(), self.show_max_chars);
        let (skill, skill_md, skill_md_truncated) = blocking(move || {
            let skill = library.get(&user, &name)?;
            let (text, truncated) = library::read_skill_md(&skill, max)?;
            Ok((skill, text, truncated))
        })
        .await?;
        Ok(Response::new(GetSkillResponse { skill: Some(to_proto(&skill)), skill_md, skill_md_truncated }))
    }

    async fn install_skill(&self, request: Request<Streaming<InstallSkillRequest>>) -> Result<Response<InstallSkillResponse>, Status> {
        let user = user(&request)?;
        let mut stream = request.into_inner();
        let header = match stream.next().await {
            Some(Ok(InstallSkillRequest { part: Some(install_skill_request::Part::Header(header)) })) => header,
            Some(Err(status)) => return Err(status),
            _ => return Err(SandboxError::invalid("header", "the first InstallSkill message must be the header").into()),
        };
        // Spooled to an unnamed temporary file next to the skills, so a large archive never sits in
        // memory and nothing is left behind if the client goes away.
        let dir = self.library.upload_dir(&user);
        let mut file = blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| SandboxError::Unavailable(format!("cannot stage the archive ({})", e.kind())))?;
            tempfile_in(&dir)
        })
        .await?;
        let mut received: u64 = 0;
        while let Some(message) = stream.next().await {
            let chunk = match message?.part {
                Some(install_skill_request::Part::Chunk(chunk)) => chunk,
                Some(install_skill_request::Part::Header(_)) => {
                    return Err(SandboxError::invalid("header", "sent twice; only the first message is a header").into());
                }
                None => continue,
            };
            received += chunk.len() as u64;
            if received > self.max_archive_bytes {
                return Err(SandboxError::ResourceExhausted(format!(
                    "the archive is larger than {} bytes (sandbox.skills.max_archive_bytes)",
                    self.max_archive_bytes
                ))
                .into());
            }
            // Chunks are at most one message (a few MiB): writing them inline costs less than a hop to
            // the blocking pool per chunk.
            file.write_all(&chunk).map_err(|e| SandboxError::Unavailable(format!("cannot stage the archive ({})", e.kind())))?;
        }
        if received == 0 {
            return Err(SandboxError::invalid("chunk", "the archive is empty").into());
        }
        let library = self.library.clone();
        let (skill, replaced, findings) = blocking(move || {
            use std::io::Seek;
            file.rewind().map_err(|e| SandboxError::Unavailable(format!("cannot read the staged archive ({})", e.kind())))?;
            library.install(&user, file, header.replace)
        })
        .await?;
        let findings = findings.iter().map(finding_to_proto).collect();
        Ok(Response::new(InstallSkillResponse { skill: Some(to_proto(&skill)), replaced, findings }))
    }

    async fn set_skill_enabled(&self, request: Request<SetSkillEnabledRequest>) -> Result<Response<SetSkillEnabledResponse>, Status> {
        let user = user(&request)?;
        let SetSkillEnabledRequest { name, enabled } = request.into_inner();
        let library = self.library.clone();
        let skill = blocking(move || library.set_enabled(&user, &name, enabled)).await?;
        Ok(Response::new(SetSkillEnabledResponse { skill: Some(to_proto(&skill)) }))
    }

    async fn delete_skill(&self, request: Request<DeleteSkillRequest>) -> Result<Response<DeleteSkillResponse>, Status> {
        let user = user(&request)?;
        let name = request.into_inner().name;
        let library = self.library.clone();
        blocking(move || library.delete(&user, &name)).await?;
        Ok(Response::new(DeleteSkillResponse {}))
    }
}

/// A file in `dir` that is unlinked at once: it disappears with its last descriptor, whatever happens.
fn tempfile_in(dir: &std::path::Path) -> crate::error::Result<std::fs::File> {
    let path = dir.join(format!(".upload-{:016x}", fastrand::u64(..)));
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| SandboxError::Unavailable(format!("cannot stage the archive ({})", e.kind())))?;
    let _ = std::fs::remove_file(&path);
    Ok(file)
}
