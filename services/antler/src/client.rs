//! `antler run`: start a run and print its events as they arrive (also used by `antler up --demo`).

use std::io::Write;
use std::time::Duration;

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunStatus, StreamRunRequest};
use anyhow::{Context, Result};
use tokio_stream::StreamExt;

/// A user message with `text`.
pub fn user_message(text: &str) -> Message {
    Message {
        role: Role::User as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

/// Connects to `endpoint`, retrying for up to `wait` (the server may still be starting).
pub async fn connect(endpoint: &str, wait: Duration) -> Result<tonic::transport::Channel> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect().await {
            Ok(channel) => return Ok(channel),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(error).with_context(|| format!("cannot connect to {endpoint}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Streams a run and prints it; returns the final status.
pub async fn stream_and_print(channel: tonic::transport::Channel, token: Option<&str>, create: CreateRunRequest) -> Result<RunStatus> {
    let mut request = tonic::Request::new(StreamRunRequest { create: Some(create) });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut stream = RunServiceClient::new(channel).stream_run(request).await?.into_inner();
    let mut out = std::io::stdout();
    let mut in_text = false;
    let mut status = RunStatus::Unspecified;
    while let Some(item) = stream.next().await {
        let Some(event) = item?.event else { continue };
        let Some(kind) = event.kind else { continue };
        if in_text && !matches!(kind, Kind::MessageDelta(_) | Kind::Heartbeat(_)) {
            writeln!(out)?;
            in_text = false;
        }
        match kind {
            Kind::Metadata(m) => writeln!(out, "[{:>3}] run {} on thread {} (attempt {})", event.seq, m.run_id, m.thread_id, m.attempt)?,
            Kind::MessageDelta(d) => {
                if !in_text {
                    write!(out, "[{:>3}] assistant: ", event.seq)?;
                    in_text = true;
                }
                write!(out, "{}", d.text)?;
            }
            Kind::Message(_) => {}
            Kind::Values(v) => writeln!(out, "[{:>3}] checkpoint {} (step {})", event.seq, v.checkpoint_id, v.step)?,
            Kind::ToolStarted(t) => writeln!(out, "[{:>3}] tool {} started", event.seq, t.name)?,
            Kind::ToolFinished(t) => {
                writeln!(out, "[{:>3}] tool {} finished{}", event.seq, t.name, if t.is_error { " with an error" } else { "" })?
            }
            Kind::Delivery(d) => writeln!(
                out,
                "[{:>3}] delivery: {} produced, {} presented, {} declared, {}",
                event.seq,
                d.produced.len(),
                d.presented.len(),
                d.declared.len(),
                if d.satisfied { "satisfied".to_owned() } else { format!("missing {}", d.missing.join(", ")) }
            )?,
            Kind::Error(e) => writeln!(out, "[{:>3}] error: {}", event.seq, e.error.map(|e| e.message).unwrap_or_default())?,
            Kind::End(end) => {
                status = end.status();
                let usage = end.usage.unwrap_or_default();
                writeln!(
                    out,
                    "[{:>3}] end: {} ({}), {} tokens",
                    event.seq,
                    status.as_str_name().trim_start_matches("RUN_STATUS_"),
                    end.stop_reason,
                    usage.total_tokens
                )?;
                if let Some(error) = end.error {
                    writeln!(out, "      {}: {}", error.code, error.message)?;
                }
            }
            Kind::Heartbeat(_) => {}
            other => writeln!(out, "[{:>3}] {:?}", event.seq, other)?,
        }
        out.flush()?;
    }
    Ok(status)
}

/// The run `antler up --demo` streams: what a work order with a declared output looks like.
pub fn demo_request() -> CreateRunRequest {
    let script = serde_json::json!({"script": [
        {"say": "Hello from Antler. This run is a work order: it was admitted once, started by one worker, and it declared an output it must deliver."},
        {"checkpoint": true},
        {"usage": {"model": "demo", "caller": "lead_agent", "input": 42, "output": 23}},
        {"produce": "/mnt/user-data/outputs/hello.md", "text": "# Hello from Antler\n"},
        {"present": "/mnt/user-data/outputs/hello.md"},
        {"say": "I wrote /mnt/user-data/outputs/hello.md in this thread's sandbox and presented it: the receipt checks the file itself, not my word for it."},
    ]});
    CreateRunRequest {
        input: vec![user_message(&script.to_string())],
        expected_outputs: vec!["/mnt/user-data/outputs/hello.md".to_owned()],
        ..CreateRunRequest::default()
    }
}
