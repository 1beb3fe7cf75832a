//! The gateway: one chat call from a validated request to a finished answer, whatever the provider.
//!
//! Order of business for a call: resolve the model (NOT_FOUND lists the names), check the request against
//! it and build its parameters and body (caller errors surface here, before any upstream call), take a
//! concurrency permit, then attempt — retrying transient failures with backoff while nothing has reached the
//! caller, and moving on to the model's fallbacks once retries are exhausted. Once a delta has been
//! streamed to the caller there is no retry: a later failure ends the stream with a FINISH_REASON_ERROR
//! finish that keeps the partial answer and its usage.
//!
//! Cancellation: a ChatStream whose client went away is noticed at once (every wait races the channel's
//! closing), and dropping the attempt's event stream drops the upstream connection. A unary Chat is
//! cancelled by tonic dropping the whole future, with the same effect.

use bytes::Bytes;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use antler_proto::common::Message;
use antler_proto::models::{ChatError, ChatStreamResponse, CompletionInfo, FinishReason};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use antler_kit::CallContext;

use crate::assemble::{Assembled, Assembler};
use crate::error::{ModelError, UpstreamError, UpstreamKind, code_name};
use crate::events::Stop;
use crate::images::SandboxImages;
use crate::registry::{Model, Registry};
use crate::request::ChatCall;
use crate::{retry, telemetry, thinking, usage};

/// Deltas buffered between the gateway and a slow ChatStream client. When full, the gateway stops reading
/// the upstream until the client catches up (backpressure reaches the provider through TCP).
/// Deltas buffered per stream between the upstream reader and the gRPC response (each slot costs
/// memory for as long as the stream is open, whether used or not).
const STREAM_BUFFER: usize = 16;

/// A finished call.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub message: Message,
    pub info: CompletionInfo,
}

/// Where deltas go.
#[derive(Debug)]
enum Sink {
    /// Chat: deltas are dropped; nothing has reached the caller, so a broken stream may still be retried.
    Collect,
    /// ChatStream: deltas are forwarded at once.
    Stream(mpsc::Sender<StreamItem>),
}

/// One item of a ChatStream, boxed: the channel allocates its slots in blocks of 32 whatever its
/// capacity, so unboxed items (~600 bytes each) cost every open stream ~19 KiB.
pub type StreamItem = Box<Result<ChatStreamResponse, ModelError>>;

/// The client went away (or the call was otherwise abandoned).
#[derive(Debug)]
struct Interrupted;

impl Sink {
    /// Runs `work` unless the streaming client disconnects first.
    async fn guard<F: Future>(&self, work: F) -> Result<F::Output, Interrupted> {
        match self {
            Sink::Collect => Ok(work.await),
            Sink::Stream(tx) => tokio::select! {
                biased;
                () = tx.closed() => Err(Interrupted),
                out = work => Ok(out),
            },
        }
    }
}

/// Where the time of a call went, to tell the gateway's own overhead apart.
#[derive(Debug, Default)]
struct Clock {
    /// Waiting for the upstream (connect, headers, every event).
    upstream: Duration,
    /// Backoff sleeps between attempts.
    backoff: Duration,
    /// Blocked on a slow streaming client.
    client: Duration,
}

enum AttemptEnd {
    Finished(Box<Outcome>),
    /// Failed before delivering anything, so it may be retried: with the request body when it failed
    /// before the upstream answered (None: the body was dropped once the stream opened, see
    /// [`Gateway::attempt`], and a retry prepares it again).
    Failed(UpstreamError, Option<Bytes>),
    Interrupted,
}

/// A model's request body for `call`.
fn prepare(model: &Model, call: &ChatCall) -> Result<Bytes, ModelError> {
    let settings = thinking::settings(&model.spec, call)?;
    Ok(Bytes::from(model.provider.prepare(call, settings)?.to_string()))
}

/// The model gateway: a registry of models (replaced on configuration reload) and the call logic.
#[derive(Debug)]
pub struct Gateway {
    registry: RwLock<Arc<Registry>>,
    shutdown: CancellationToken,
    /// Reads images given as sandbox paths; None when no sandbox client is configured.
    images: Option<SandboxImages>,
}

impl Gateway {
    pub fn new(registry: Registry, shutdown: CancellationToken, images: Option<SandboxImages>) -> Self {
        Self { registry: RwLock::new(Arc::new(registry)), shutdown, images }
    }

    /// The registry in force; calls keep the one they started with.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Swaps in a new registry (configuration reload).
    pub fn replace(&self, registry: Registry) {
        *self.registry.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(registry);
    }

    /// Runs a call to the end and returns the assembled answer.
    pub async fn chat(&self, call: ChatCall, ctx: CallContext) -> Result<Outcome, ModelError> {
        self.run(call, &ctx, &Sink::Collect).await
    }

    /// Runs a call in a task, streaming deltas and then exactly one `finish` (or an error before any delta).
    /// Dropping the returned receiver cancels the call and the upstream request.
    pub fn chat_stream(self: &Arc<Self>, call: ChatCall, ctx: CallContext) -> mpsc::Receiver<StreamItem> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let gateway = self.clone();
        let span = tracing::info_span!("chat_stream", model = %call.model_name, caller = %call.caller, run_id = %call.run_id);
        // Owned by the channel: when the client's stream is dropped, every wait in `run` ends at once.
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let sink = Sink::Stream(tx.clone());
                let result = gateway.run(call, &ctx, &sink).await;
                let last = match result {
                    Ok(outcome) => Ok(ChatStreamResponse {
                        delta: Some(antler_proto::models::chat_stream_response::Delta::Finish(antler_proto::models::ChatStreamFinish {
                            message: Some(outcome.message),
                            info: Some(outcome.info),
                        })),
                    }),
                    Err(ModelError::Cancelled) => return,
                    Err(error) => Err(error),
                };
                let _ = tx.send(Box::new(last)).await;
            },
            span,
        ));
        rx
    }

    async fn run(&self, mut call: ChatCall, ctx: &CallContext, sink: &Sink) -> Result<Outcome, ModelError> {
        if self.shutdown.is_cancelled() {
            // Draining: calls already running finish, new ones go to another replica.
            return Err(ModelError::ShuttingDown);
        }
        let registry = self.registry();
        let requested = registry.resolve(&call.model_name)?.clone();
        let bucket = call.bucket.as_str();
        let result = match self.read_images(&mut call, &requested, ctx, sink).await {
            Ok(()) => self.run_candidates(&registry, &requested, &call, sink).await,
            Err(error) => Err(error),
        };
        if let Err(error) = &result {
            let outcome = if matches!(error, ModelError::Cancelled) { "cancelled" } else { "error" };
            telemetry::request(&requested.spec.name, bucket, outcome, call.received.elapsed());
            if outcome == "error" {
                tracing::warn!(model = %requested.spec.name, caller = %call.caller, run_id = %call.run_id, code = code_name(error.code()), %error, "model call failed");
            }
        }
        result
    }

    /// Inlines sandbox images, once the requested model is known to accept images at all.
    async fn read_images(&self, call: &mut ChatCall, requested: &Model, ctx: &CallContext, sink: &Sink) -> Result<(), ModelError> {
        if !call.has_sandbox_images() {
            return Ok(());
        }
        call.check_against(&requested.spec)?;
        let Some(images) = &self.images else {
            return Err(ModelError::Dependency {
                field: "messages".to_owned(),
                code: tonic::Code::FailedPrecondition,
                message: "images given as sandbox paths need the sandbox service, and no sandbox client is configured".to_owned(),
            });
        };
        sink.guard(images.resolve(call, ctx)).await.map_err(|Interrupted| ModelError::Cancelled)?
    }

    async fn run_candidates(
        &self,
        registry: &Registry,
        requested: &Arc<Model>,
        call: &ChatCall,
        sink: &Sink,
    ) -> Result<Outcome, ModelError> {
        // The requested model's refusals are the caller's to fix, so they are returned as they are.
        call.check_against(&requested.spec)?;
        let body = prepare(requested, call)?;

        let mut clock = Clock::default();
        let mut attempts = 0u32;
        let mut last_error: Option<ModelError> = None;
        let mut previous = requested.spec.name.clone();
        let fallbacks = requested.spec.fallbacks.iter().filter_map(|name| registry.resolve(name).ok());
        let candidates = std::iter::once((requested.clone(), Some(body))).chain(fallbacks.map(|m| (m.clone(), None)));

        for (model, body) in candidates {
            let body = match body {
                Some(body) => body,
                None => {
                    // A fallback that cannot serve this request (no vision, no thinking, …) is skipped.
                    match call.check_against(&model.spec).and_then(|()| prepare(&model, call)) {
                        Ok(body) => {
                            telemetry::fallback(&previous, &model.spec.name);
                            tracing::info!(from = %previous, to = %model.spec.name, run_id = %call.run_id, "falling back to the next model");
                            body
                        }
                        Err(error) => {
                            tracing::debug!(model = %model.spec.name, %error, "fallback skipped: it cannot serve this request");
                            continue;
                        }
                    }
                }
            };
            let _permit = match &model.limiter {
                None => None,
                Some(limiter) => match limiter.clone().try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(_) => {
                        last_error.get_or_insert(ModelError::Busy {
                            model: model.spec.name.clone(),
                            limit: model.spec.max_concurrency,
                            retry_after: Duration::from_secs(1),
                        });
                        continue;
                    }
                },
            };

            let max_attempts = model.spec.max_retries + 1;
            let mut body = Some(body);
            for attempt in 1..=max_attempts {
                attempts += 1;
                let body_now = match body.take() {
                    Some(body) => body,
                    None => prepare(&model, call)?,
                };
                let error = match self.attempt(call, requested, &model, body_now, sink, &mut clock, attempts).await {
                    AttemptEnd::Finished(outcome) => return Ok(*outcome),
                    AttemptEnd::Interrupted => return Err(ModelError::Cancelled),
                    AttemptEnd::Failed(error, returned) => {
                        body = returned;
                        error
                    }
                };
                if !error.is_retryable() {
                    return Err(error.into());
                }
                let too_long = error.retry_after.is_some_and(|asked| asked > registry.retry.max_retry_after);
                if attempt == max_attempts || too_long {
                    tracing::warn!(model = %model.spec.name, attempts = attempt, reason = error.reason(), %error, "model gave up after its retries");
                    last_error = Some(error.into());
                    break;
                }
                let delay = retry::backoff(&registry.retry, attempt, error.retry_after);
                telemetry::retry(&model.spec.name, error.reason());
                tracing::info!(model = %model.spec.name, attempt, delay_ms = delay.as_millis() as u64, reason = error.reason(), "retrying");
                let slept = Instant::now();
                let wait = async {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => true,
                        () = self.shutdown.cancelled() => false,
                    }
                };
                match sink.guard(wait).await {
                    Err(Interrupted) => return Err(ModelError::Cancelled),
                    Ok(false) => return Err(error.into()),
                    Ok(true) => clock.backoff += slept.elapsed(),
                }
            }
            previous = model.spec.name.clone();
        }
        Err(last_error.unwrap_or(ModelError::NoModels))
    }

    /// One upstream attempt, from sending the request to the end of its stream.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        call: &ChatCall,
        requested: &Model,
        model: &Arc<Model>,
        body: Bytes,
        sink: &Sink,
        clock: &mut Clock,
        attempts: u32,
    ) -> AttemptEnd {
        let name = model.spec.name.as_str();
        let named = |mut error: UpstreamError| {
            error.model = name.to_owned();
            error.key_source = model.spec.api_key.source.clone();
            error
        };

        let waited = Instant::now();
        let opened = sink.guard(model.provider.send(&body)).await;
        clock.upstream += waited.elapsed();
        let attempt = match opened {
            Err(Interrupted) => return AttemptEnd::Interrupted,
            Ok(Err(error)) => return AttemptEnd::Failed(named(error), Some(body)),
            Ok(Ok(attempt)) => attempt,
        };
        // The upstream has the request: keeping its body (system prompt, tool schemas, history; ~5 KiB
        // for the lead agent) for a retry cost every call waiting on a slow model that much for its
        // whole wait. A retry, rare, serialises it again from `call`.
        drop(body);
        let request_id = attempt.request_id;
        let mut events = attempt.events;

        let mut assembler = Assembler::new();
        let mut out = Vec::new();
        // Nothing can be retried once the stream delivered something.
        let mut delivered = false;
        let mut first_token: Option<Duration> = None;
        let mut last_event = Instant::now();
        let chunk_timeout = model.spec.timeouts.chunk;
        let chunk_gaps = telemetry::chunk_gaps(name);
        let failure = loop {
            let waited = Instant::now();
            let next = sink.guard(tokio::time::timeout(chunk_timeout, events.next())).await;
            clock.upstream += waited.elapsed();
            let event = match next {
                Err(Interrupted) => return AttemptEnd::Interrupted,
                Ok(Err(_elapsed)) => {
                    break Some(UpstreamError::new(
                        UpstreamKind::ChunkTimeout,
                        format!("no stream event for {} ms (chunk_timeout_ms)", chunk_timeout.as_millis()),
                    ));
                }
                Ok(Ok(None)) if assembler.is_done() => break None,
                Ok(Ok(None)) => break Some(UpstreamError::new(UpstreamKind::Broken, "the stream ended before the response was complete")),
                Ok(Ok(Some(Err(error)))) => break Some(error),
                Ok(Ok(Some(Ok(event)))) => event,
            };
            let now = Instant::now();
            chunk_gaps.record(now.duration_since(last_event).as_secs_f64());
            last_event = now;
            if let Err(error) = assembler.push(event, &mut out) {
                break Some(error);
            }
            if out.is_empty() {
                continue;
            }
            first_token.get_or_insert_with(|| call.received.elapsed());
            match sink {
                Sink::Collect => out.clear(),
                Sink::Stream(tx) => {
                    let blocked = Instant::now();
                    for delta in out.drain(..) {
                        if tx.send(Box::new(Ok(delta))).await.is_err() {
                            return AttemptEnd::Interrupted;
                        }
                    }
                    clock.client += blocked.elapsed();
                    delivered = true;
                }
            }
        };
        // Dropping the stream here closes the upstream connection if it is still open.
        drop(events);

        let error = match (failure, delivered) {
            (Some(error), false) => return AttemptEnd::Failed(named(error), None),
            (Some(error), true) => Some(ModelError::Upstream(named(error))),
            (None, _) => None,
        };
        let assembled = assembler.finish(&mut out);
        if let Sink::Stream(tx) = sink {
            for delta in out.drain(..) {
                if tx.send(Box::new(Ok(delta))).await.is_err() {
                    return AttemptEnd::Interrupted;
                }
            }
        }
        let outcome = self.outcome(call, requested, model, assembled, error, attempts, request_id, first_token, clock).await;
        AttemptEnd::Finished(Box::new(outcome))
    }

    #[allow(clippy::too_many_arguments)]
    async fn outcome(
        &self,
        call: &ChatCall,
        requested: &Model,
        model: &Model,
        assembled: Assembled,
        error: Option<ModelError>,
        attempts: u32,
        request_id: String,
        first_token: Option<Duration>,
        clock: &Clock,
    ) -> Outcome {
        let Assembled { mut message, stop, usage: report, upstream_model, .. } = assembled;
        let (usage, estimated) = if report.input.is_some() && report.output.is_some() {
            usage::finalize(report, || (0, 0))
        } else {
            // Tokenizing is CPU work (and the first use builds the tokenizer): keep it off the async threads.
            let (call_copy, message_copy) = (call.clone(), message.clone());
            let estimate = tokio::task::spawn_blocking(move || (usage::estimate_input(&call_copy), usage::estimate_output(&message_copy)))
                .await
                .unwrap_or((0, 0));
            usage::finalize(report, || estimate)
        };

        let (finish_reason, raw, stop_sequence) = match (&error, stop) {
            (Some(_), _) => (FinishReason::Error, String::new(), String::new()),
            (None, Some((stop, raw, sequence))) => (finish_of(stop, !message.tool_calls.is_empty()), raw, sequence),
            (None, None) => (finish_of(Stop::Stop, !message.tool_calls.is_empty()), String::new(), String::new()),
        };
        let chat_error = error.as_ref().map(|e| ChatError {
            code: code_name(e.code()).to_owned(),
            message: e.public_message(),
            upstream_status: u32::from(e.upstream_status()),
            retryable: e.is_retryable(),
        });

        let latency = call.received.elapsed();
        message.id = format!("msg_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..));
        message.usage = Some(usage);
        message.created_at = Some(prost_types::Timestamp::from(SystemTime::now()));
        let info = CompletionInfo {
            finish_reason: finish_reason as i32,
            raw_finish_reason: raw,
            stop_sequence,
            usage: Some(usage),
            usage_estimated: estimated,
            requested_model_name: requested.spec.name.clone(),
            model_name: model.spec.name.clone(),
            upstream_model: if upstream_model.is_empty() { model.spec.upstream_model.clone() } else { upstream_model },
            attempts,
            upstream_request_id: request_id,
            latency: prost_types::Duration::try_from(latency).ok(),
            time_to_first_token: first_token.and_then(|d| prost_types::Duration::try_from(d).ok()),
            error: chat_error,
            caller: call.caller.clone(),
            run_id: call.run_id.clone(),
        };

        let name = model.spec.name.as_str();
        let bucket = call.bucket.as_str();
        let outcome = if error.is_some() { "stream_error" } else { "ok" };
        telemetry::request(name, bucket, outcome, latency);
        telemetry::tokens(name, bucket, &usage, estimated);
        if let Some(ttft) = first_token {
            telemetry::first_token(name, bucket, ttft);
        }
        let overhead = latency.saturating_sub(clock.upstream + clock.backoff + clock.client);
        telemetry::overhead(name, overhead);
        tracing::debug!(
            model = name,
            caller = %call.caller,
            run_id = %call.run_id,
            attempts,
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            estimated,
            latency_ms = latency.as_millis() as u64,
            overhead_us = overhead.as_micros() as u64,
            "model call finished"
        );
        if let Some(error) = &error {
            tracing::warn!(model = name, run_id = %call.run_id, %error, "stream failed after output had started");
        }
        Outcome { message, info }
    }
}

fn finish_of(stop: Stop, has_tool_calls: bool) -> FinishReason {
    match stop {
        // Some servers say "stop" although the message is tool calls; the caller acts on the calls.
        Stop::Stop if has_tool_calls => FinishReason::ToolCalls,
        Stop::Stop => FinishReason::Stop,
        Stop::ToolCalls => FinishReason::ToolCalls,
        Stop::Length => FinishReason::Length,
        Stop::ContentFilter => FinishReason::ContentFilter,
        Stop::Paused => FinishReason::Paused,
    }
}
