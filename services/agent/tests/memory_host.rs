//! The lead agent with no database: an in-memory host, and the real models (a replay model) and
//! sandbox services in this process. What a run writes, in what order, and the side-effect journal
//! are all observable on the host.

use std::sync::Arc;

use antler_agent::lead::LeadFactory;
use antler_agent::memory_host::MemoryHost;
use antler_agent::{AgentContext, AgentFactory, Effect, Host, Outcome, RunSpec};
use antler_kit::cli::ServiceContext;
use antler_kit::{Authenticator, Clients, Config, ServiceSet};
use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::CreateRunRequest;
use antler_proto::runs::run_event::Kind;
use tokio_util::sync::CancellationToken;

const REPORT: &str = "/mnt/user-data/outputs/report.md";

/// Models (one replay model following `turns`) and sandbox services on a free port; their clients.
async fn services(turns: &str, dir: &std::path::Path) -> anyhow::Result<(Clients, CancellationToken)> {
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  data_dir: {}\nsandbox:\n  provider: local\n  allow_host_bash: true\nmodels:\n  models:\n    - name: scripted\n      provider: replay\n      replay:\n        turns:\n{turns}",
        dir.display()
    );
    let config = Arc::new(Config::parse(&yaml, "test", &|_| None)?);
    let auth = Authenticator::new(&config.server.auth)?;
    let listener = antler_kit::server::bind(&config.server, &auth).await?;
    let addr = listener.local_addr()?;
    let clients = Clients::from_config(&config.clients, addr)?;
    let shutdown = CancellationToken::new();
    let (_tx, updates) = tokio::sync::watch::channel(config.clone());
    let ctx = ServiceContext {
        config: config.clone(),
        config_updates: updates,
        clients: clients.clone(),
        shutdown: shutdown.clone(),
        local_addr: addr,
        auth: auth.clone(),
    };
    let mut set = ServiceSet::new(&config.server);
    for service in [antler_models::SERVICE, antler_sandbox::SERVICE] {
        (service.register)(&mut set, &ctx).await.map_err(|e| anyhow::anyhow!("{}: {e}", service.name))?;
    }
    let server = config.server.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _keep = _tx;
        antler_kit::server::serve(listener, set, &server, auth, stop).await
    });
    Ok((clients, shutdown))
}

fn user(text: &str) -> Message {
    Message {
        role: Role::User as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_writes_its_steps_to_the_host_and_journals_its_side_effects() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let turns = format!(
        "          - text: Writing it.\n            tool_calls:\n              - {{id: c1, name: write_file, arguments: {{description: write, path: {REPORT}, content: done}}}}\n          - tool_calls:\n              - {{id: c2, name: present_files, arguments: {{filepaths: [{REPORT}]}}}}\n          - text: The report is ready.\n"
    );
    let (clients, shutdown) = services(&turns, dir.path()).await?;
    let request = CreateRunRequest {
        input: vec![user("write the report")],
        config: Some(antler_proto::runs::RunConfig { model_name: "scripted".into(), recursion_limit: 20, ..Default::default() }),
        ..Default::default()
    };
    let spec = RunSpec::new("r-1", "t-1", "local", request);
    let agent = LeadFactory::default().build(&spec).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let host = Arc::new(MemoryHost::default());
    let ctx = AgentContext::new(spec, host.clone(), CancellationToken::new(), clients);
    let outcome = agent.run(ctx).await;
    shutdown.cancel();

    let Outcome::Completed { stop_reason, outputs } = outcome else { anyhow::bail!("the run did not complete: {outcome:?}") };
    assert_eq!(stop_reason, "");
    assert_eq!(outputs.presented, vec![REPORT.to_owned()]);
    let written = host.written();
    let finished: Vec<&str> =
        written.events.iter().filter_map(|e| if let Kind::ToolFinished(f) = e { Some(f.name.as_str()) } else { None }).collect();
    assert_eq!(finished, ["write_file", "present_files"]);
    assert!(written.checkpoints.len() >= 3, "a checkpoint per step: {}", written.checkpoints.len());
    assert!(written.usage.iter().all(|(caller, model, _)| caller == "lead_agent" && model == "scripted"), "{:?}", written.usage);
    // write_file has a side effect: journalled before and after; present_files has none.
    let (effect_write, effect_present) = (host.effect("c1").await?, host.effect("c2").await?);
    assert!(matches!(effect_write, Effect::Done { is_error: false, .. }), "{effect_write:?}");
    assert_eq!(effect_present, Effect::None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_host_refuses_every_write_and_the_agent_stops() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (clients, shutdown) = services("          - text: Hello.\n", dir.path()).await?;
    let request = CreateRunRequest {
        input: vec![user("hi")],
        config: Some(antler_proto::runs::RunConfig { model_name: "scripted".into(), ..Default::default() }),
        ..Default::default()
    };
    let spec = RunSpec::new("r-2", "t-2", "local", request);
    let agent = LeadFactory::default().build(&spec).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let host = Arc::new(MemoryHost::default());
    host.fence();
    let outcome = agent.run(AgentContext::new(spec, host.clone(), CancellationToken::new(), clients)).await;
    shutdown.cancel();
    assert!(!matches!(outcome, Outcome::Completed { .. }), "a fenced run cannot complete: {outcome:?}");
    assert_eq!(host.written().writes, 0, "nothing was written");
    Ok(())
}
