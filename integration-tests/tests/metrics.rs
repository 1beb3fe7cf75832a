//! The Prometheus endpoint of `antler up` (`server.metrics`), scraped after known work: the counts the
//! READMEs promise are there, with their labels and exact values, and no label carries an id.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, COMPLETION_TOKENS, LlmDouble, PROMPT_TOKENS, Turn, call};
use antler_integration_tests::metrics::{Scrape, metrics_url, scrape, scrape_until, with_metrics};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::{CancelRunRequest, JoinRunRequest, RunStatus};
use serde_json::json;
use tokio_stream::StreamExt;

const T: Duration = Duration::from_secs(60);
const BUCKETS: &str = "[0.01, 0.1, 1, 10]";

/// No label value names a run, a thread or a user: those are unbounded sets.
fn assert_bounded_labels(scrape: &Scrape, ids: &[&str]) {
    for (name, key, value) in scrape.label_values() {
        for id in ids.iter().filter(|id| !id.is_empty()) {
            assert!(!value.contains(id), "{name}{{{key}=\"{value}\"}} carries the id {id}");
        }
        assert!(!value.contains("alice"), "{name}{{{key}=\"{value}\"}} carries a user");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_runs_admissions_transitions_cancel_and_streams_are_counted() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start("antler", Launch::new(["up"]).config(with_metrics(&config(&db, ""), BUCKETS)))?;
    let url = metrics_url(&server)?;
    let (mut runs, _) = clients(&server).await?;

    // One run to the end, one admitted twice with the same key (the second is reused).
    let plain = run_to_end(&mut runs, run_request("", json!([{"say": "hello"}])), T).await?;
    assert_eq!(plain.status(), RunStatus::Success, "{:?}\n{}", plain.error, server.stderr());
    let mut keyed = run_request("", json!([{"say": "once"}]));
    keyed.idempotency_key = "metrics-key".to_owned();
    let first = runs.create_run(authed(keyed.clone(), ALICE)).await?.into_inner().run.unwrap_or_default();
    let again = runs.create_run(authed(keyed, ALICE)).await?.into_inner().run.unwrap_or_default();
    assert!(again.reused && again.run_id == first.run_id);
    wait_run(&mut runs, ALICE, &first.run_id, T, is_terminal).await?;

    // A run that waits to be cancelled, with a live subscriber, and a refused second run on its thread.
    let held = hold_the_only_slot(&mut runs).await?;
    let mut stream = runs
        .join_run(authed(
            JoinRunRequest { run_id: held.run_id.clone(), thread_id: held.thread_id.clone(), after_seq: 0, ..Default::default() },
            ALICE,
        ))
        .await?
        .into_inner();
    let during = scrape_until(&url, T, |s| {
        s.value("antler_runs_stream_subscribers", &[]) == 1.0 && s.value("antler_lease_renewals_total", &[]) >= 1.0
    })
    .await?;
    assert_eq!(during.get("antler_runs_active", &[]), Some(1.0), "{}", during.text);
    assert_eq!(during.kind("antler_runs_active"), Some("gauge"));
    let refused = runs.create_run(authed(run_request(&held.thread_id, json!([{"say": "too soon"}])), ALICE)).await;
    assert_eq!(refused.err().map(|s| s.code()), Some(tonic::Code::Aborted), "REJECT: the thread is busy");
    runs.cancel_run(authed(CancelRunRequest { run_id: held.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
    while stream.next().await.transpose()?.is_some() {}
    let cancelled = wait_run(&mut runs, ALICE, &held.run_id, T, is_terminal).await?;
    assert_eq!(cancelled.status(), RunStatus::Interrupted);

    // The subscriber's task ends just after the stream does.
    let after = scrape_until(&url, T, |s| s.get("antler_runs_stream_subscribers", &[]) == Some(0.0)).await?;
    let text = &after.text;
    assert_eq!(after.kind("antler_run_admissions_total"), Some("counter"));
    assert_eq!(after.value("antler_run_admissions_total", &[("outcome", "admitted")]), 3.0, "{text}");
    assert_eq!(after.value("antler_run_admissions_total", &[("outcome", "reused")]), 1.0, "{text}");
    assert_eq!(after.value("antler_run_admissions_total", &[("outcome", "rejected")]), 1.0, "{text}");
    assert_eq!(after.value("antler_run_transitions_total", &[("to", "running")]), 3.0, "{text}");
    assert_eq!(after.value("antler_run_transitions_total", &[("to", "finalizing")]), 2.0, "{text}");
    assert_eq!(after.value("antler_run_transitions_total", &[("to", "success")]), 2.0, "{text}");
    assert_eq!(after.value("antler_run_transitions_total", &[("to", "interrupted")]), 1.0, "{text}");
    assert_eq!(after.get("antler_runs_active", &[]), Some(0.0), "{text}");
    // Registered at zero at start-up, so present although nothing happened.
    assert_eq!(after.get("antler_run_takeovers_total", &[]), Some(0.0), "no lease expired: {text}");
    assert_eq!(after.get("antler_runs_fenced_total", &[]), Some(0.0), "no worker lost its run: {text}");

    // Event appends: a histogram with the configured buckets; every say step wrote events.
    assert_eq!(after.kind("antler_runs_event_append_seconds"), Some("histogram"));
    let appends = after.value("antler_runs_event_append_seconds_count", &[("path", "transaction")]);
    assert!(appends >= 3.0, "{text}");
    let le = |bound: &str| after.value("antler_runs_event_append_seconds_bucket", &[("path", "transaction"), ("le", bound)]);
    assert_eq!(le("+Inf"), appends, "{text}");
    assert!(le("0.01") <= le("0.1") && le("0.1") <= le("10"), "{text}");
    assert!(after.get("antler_runs_event_append_seconds_bucket", &[("le", "0.25")]).is_none(), "default buckets replaced: {text}");

    assert_bounded_labels(&after, &[&plain.run_id, &plain.thread_id, &first.run_id, &held.run_id, &held.thread_id]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_counts_model_calls_tokens_retries_and_sandbox_exec() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            // Refused once (HTTP 503, retryable): the gateway retries it.
            Turn::refuse_echoing_key(503),
            Turn::tools("", vec![call("c1", "bash", json!({"description": "greet", "command": "echo hello from bash"}))]),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let models = double.models_yaml().replace("max_retries: 0", "max_retries: 1");
    let server = start("antler", Launch::new(["up"]).config(with_metrics(&agent_config(&db, &models, ""), BUCKETS)))?;
    let url = metrics_url(&server)?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Say hello"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    assert_eq!(double.requests().len(), 3, "one refused attempt, two answered calls");

    let s = scrape(&url).await?;
    let text = &s.text;
    let lead = [("model", "double"), ("caller", "lead_agent")];
    assert_eq!(s.value("antler_model_requests_total", &[lead[0], lead[1], ("outcome", "ok")]), 2.0, "{text}");
    assert_eq!(s.value("antler_model_request_duration_seconds_count", &lead), 2.0, "{text}");
    assert_eq!(s.kind("antler_model_request_duration_seconds"), Some("histogram"));
    let ttft = s.value("antler_model_time_to_first_token_seconds_count", &lead);
    assert!((1.0..=2.0).contains(&ttft), "the text turn streams content; the tool turn may not: {text}");
    assert_eq!(s.value("antler_model_tokens_total", &[lead[0], lead[1], ("kind", "input")]), (2 * PROMPT_TOKENS) as f64, "{text}");
    assert_eq!(s.value("antler_model_tokens_total", &[lead[0], lead[1], ("kind", "output")]), (2 * COMPLETION_TOKENS) as f64, "{text}");
    assert_eq!(s.value("antler_model_retries_total", &[("model", "double"), ("reason", "unavailable")]), 1.0, "{text}");
    assert_eq!(s.get("antler_model_fallbacks_total", &[]), None, "no fallback is configured: {text}");
    // The runs side attributes the same tokens to the lead agent's bucket.
    assert_eq!(s.value("antler_tokens_total", &[("caller", "lead_agent")]), (2 * (PROMPT_TOKENS + COMPLETION_TOKENS)) as f64, "{text}");

    assert_eq!(s.value("antler_sandbox_exec_seconds_count", &[("provider", "local"), ("outcome", "ok")]), 1.0, "{text}");
    assert_eq!(s.get("antler_sandbox_exec_kills_total", &[]), Some(0.0), "nothing was killed: {text}");
    assert_eq!(s.value("antler_run_admissions_total", &[("outcome", "admitted")]), 1.0, "{text}");
    assert_eq!(s.value("antler_run_transitions_total", &[("to", "success")]), 1.0, "{text}");
    assert_bounded_labels(&s, &[&run.run_id, &run.thread_id]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_metrics_listen_address_stops_start_up_naming_the_key() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let yaml = config(&db, "").replacen("server:\n", "server:\n  metrics:\n    listen: nowhere\n", 1);
    let failure = antler_integration_tests::try_start("antler", Launch::new(["up"]).config(yaml))?;
    let Err(failure) = failure else { anyhow::bail!("started with server.metrics.listen: nowhere") };
    assert!(failure.stderr.contains("server.metrics.listen"), "{}", failure.stderr);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_service_binary_describes_its_own_and_the_shared_families_at_zero() -> anyhow::Result<()> {
    let server = start("antler", Launch::new(["serve", "sandbox"]).config(with_metrics("server:\n", BUCKETS)))?;
    let s = scrape(&metrics_url(&server)?).await?;
    let text = &s.text;
    for (name, labels) in [
        ("antler_sandbox_live", &[][..]),
        ("antler_sandbox_exec_kills_total", &[("provider", "bwrap"), ("reason", "timeout")][..]),
        ("antler_requests_shed_total", &[("kind", "client")][..]),
        ("antler_config_reloads_total", &[("outcome", "rejected")][..]),
        ("antler_tls_handshakes_total", &[("outcome", "failed")][..]),
    ] {
        assert_eq!(s.get(name, labels), Some(0.0), "{name}{labels:?}: {text}");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP line: {text}");
    }
    assert_eq!(s.get("antler_sandbox_exec_seconds_count", &[("provider", "local"), ("outcome", "ok")]), Some(0.0), "{text}");
    // Only the families of the services this binary serves.
    assert!(!text.contains("antler_runs_active") && !text.contains("antler_memory_"), "{text}");
    Ok(())
}
