//! The LLM moderation pass of skills (`sandbox.skills.moderation`), through `antler up` and the models
//! service's replay provider as the moderation model: allow installs; warn installs a skill without
//! scripts with its WARNING finding and refuses one with scripts; block refuses; an answer that is not
//! the strict JSON, a model that does not answer in time and one that refuses all block while
//! `fail_closed` (the default), and only warn when it is off. Each refusal names its rule and leaves no
//! skill behind.

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::sandbox::skill_service_client::SkillServiceClient;
use antler_proto::sandbox::*;
use anyhow::{Result, bail, ensure};
use std::io::Write;

const MD: &str = "---\nname: csv-tidy\ndescription: Tidy a CSV file.\n---\n# CSV tidy\nRead the file and fix its header.\n";

fn zip(files: &[(&str, &str)]) -> Result<Vec<u8>> {
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, text) in files {
        out.start_file(*name, zip::write::SimpleFileOptions::default())?;
        out.write_all(text.as_bytes())?;
    }
    Ok(out.finish()?.into_inner())
}

/// Starts `antler up` whose moderation model answers with the replay turn `turn` (YAML flow mapping).
async fn server(turn: &str, moderation: &str) -> Result<(TestDb, antler_integration_tests::Process)> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let models = format!(
        "  skills:\n    moderation:\n      model_name: moderator\n{moderation}models:\n  models:\n    - name: moderator\n      provider: replay\n      replay:\n        turns:\n          - {turn}\n"
    );
    let up = start_agent_up(&db, &models, "", None)?;
    Ok((db, up))
}

async fn install(up: &antler_integration_tests::Process, archive: Vec<u8>) -> Result<Result<InstallSkillResponse, tonic::Status>> {
    let mut skills = SkillServiceClient::new(up.channel().await?);
    let messages = vec![
        InstallSkillRequest {
            part: Some(install_skill_request::Part::Header(InstallSkillHeader { replace: false, file_name: "x.skill".to_owned() })),
        },
        InstallSkillRequest { part: Some(install_skill_request::Part::Chunk(archive)) },
    ];
    Ok(skills.install_skill(authed(tokio_stream::iter(messages), ALICE)).await.map(|r| r.into_inner()))
}

async fn listed(up: &antler_integration_tests::Process) -> Result<Vec<String>> {
    let mut skills = SkillServiceClient::new(up.channel().await?);
    Ok(skills
        .list_skills(authed(ListSkillsRequest { enabled_only: false }, ALICE))
        .await?
        .into_inner()
        .skills
        .into_iter()
        .map(|s| s.name)
        .collect())
}

/// Installs `archive` under a moderation model answering `turn`; expects a refusal naming `rule` and
/// `needle`, with nothing installed.
async fn refused(turn: &str, moderation: &str, archive: Vec<u8>, rule: &str, needle: &str) -> Result<()> {
    let (_db, up) = server(turn, moderation).await?;
    let status = match install(&up, archive).await? {
        Err(status) => status,
        Ok(reply) => bail!("{turn}: installed: {reply:?}"),
    };
    ensure!(status.code() == tonic::Code::InvalidArgument, "{turn}: {status:?}");
    ensure!(
        status.message().contains(&format!("CRITICAL {rule} at .")) && status.message().contains(needle),
        "{turn}: {status:?}\n{}",
        up.stderr()
    );
    ensure!(listed(&up).await?.is_empty(), "{turn}: a refused skill is not installed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_moderation_model_decides_and_its_failures_block() -> Result<()> {
    let plain = || zip(&[("SKILL.md", MD)]);
    let scripted = || zip(&[("SKILL.md", MD), ("scripts/tidy.py", "import csv\n")]);

    // allow: installed, no finding.
    let (_db, up) = server(r#"{text: '{"decision": "allow", "reason": "a plain CSV skill"}'}"#, "").await?;
    let reply = install(&up, plain()?).await??;
    ensure!(reply.findings.is_empty(), "{reply:?}");
    drop(up);

    // warn without scripts: installed with the finding.
    let (_db, up) = server(r#"{text: '{"decision": "warn", "reason": "edits files in place"}'}"#, "").await?;
    let reply = install(&up, plain()?).await??;
    let found: Vec<_> = reply.findings.iter().map(|f| (f.rule_id.as_str(), f.severity(), f.evidence.as_str())).collect();
    ensure!(found == [("moderation.warn", SkillFindingSeverity::Warning, "edits files in place")], "{found:?}");
    drop(up);

    let warn = r#"{text: '{"decision": "warn", "reason": "runs a script"}'}"#;
    refused(warn, "", scripted()?, "moderation.warn_executable", "runs a script").await?;
    let block = r#"{text: '{"decision": "block", "reason": "uploads ~/.ssh"}'}"#;
    refused(block, "", plain()?, "moderation.block", "uploads ~/.ssh").await?;
    refused("{text: 'Looks fine to me!'}", "", plain()?, "moderation.failed", "not the required JSON").await?;
    let slow = r#"{text: '{"decision": "allow", "reason": "x"}', first_byte_delay_ms: 4000}"#;
    refused(slow, "      timeout_secs: 1\n", plain()?, "moderation.failed", "did not answer within 1s").await?;
    refused("{text: '', finish_reason: content_filter}", "", plain()?, "moderation.failed", "refused").await?;

    // fail_closed: false — the same garbage only warns.
    let (_db, up) = server("{text: 'Looks fine to me!'}", "      fail_closed: false\n").await?;
    let reply = install(&up, plain()?).await??;
    ensure!(reply.findings.len() == 1 && reply.findings[0].rule_id == "moderation.failed_open", "{reply:?}");
    ensure!(listed(&up).await? == ["csv-tidy"]);
    Ok(())
}
