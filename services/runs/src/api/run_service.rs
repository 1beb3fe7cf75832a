//! `antler.runs.v1.RunService`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use antler_kit::{CallContext, Identity};
use antler_proto::runs::run_service_server::RunService;
use antler_proto::runs::*;
use futures::Stream;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::convert;
use crate::engine::Engine;
use crate::error::RunsError;
use crate::lifecycle::cancel::CancelCause;
use crate::lifecycle::{admission, cancel};
use crate::paging;
use crate::run_queries;
use crate::store::entity::runs;
use crate::stream::{Joined, Subscription, follow_from, read_page};
use crate::stream_limits::StreamPermit;
use crate::threads as thread_domain;

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[derive(Debug, Clone)]
pub struct RunApi {
    pub engine: Arc<Engine>,
    /// Group commit of admissions (see `lifecycle::admission::Batcher`).
    pub batcher: admission::Batcher,
}

impl RunApi {
    async fn admit(&self, ctx: &CallContext, req: CreateRunRequest) -> Result<(runs::Model, bool), Status> {
        let admitted = admission::admit(&self.engine, &self.batcher, ctx, req, admission::new_run_id()).await?;
        Ok((admitted.run, admitted.reused))
    }

    /// [`Self::admit`] for a stream of the new run's events: the run's id is watched before its
    /// admission commits, so the stream starts without reading the store (see [`Joined`]). A reused
    /// run (idempotency key) is joined late, like JoinRun.
    async fn admit_watched(&self, ctx: &CallContext, req: CreateRunRequest) -> Result<(runs::Model, Joined), Status> {
        let run_id = admission::new_run_id();
        let watch = self.engine.hub().watch(&run_id);
        let admitted = admission::admit(&self.engine, &self.batcher, ctx, req, run_id.clone()).await?;
        let joined = if admitted.reused || admitted.run.run_id != run_id {
            Joined::Late
        } else {
            Joined::AtAdmission { watch, status: admitted.run.status.to_proto() }
        };
        Ok((admitted.run, joined))
    }

    async fn find_run(&self, user: &str, thread_id: &str, run_id: &str) -> Result<runs::Model, RunsError> {
        run_queries::find(&self.engine, user, thread_id, run_id).await
    }

    /// Room for one more event stream of `user` (`runs.max_streams`, `runs.max_streams_per_user`);
    /// None for the services' own calls, which are not counted.
    fn stream_permit<T>(&self, request: &Request<T>, user: &str) -> Result<Option<StreamPermit>, Status> {
        if antler_kit::limit::is_internal_call(request) {
            return Ok(None);
        }
        Ok(Some(self.engine.streams().acquire(user)?))
    }

    /// Streams a run's events to the client; when the client goes away before the run ends and
    /// `cancel_on_disconnect` is set, the run is cancelled (INTERRUPT).
    #[allow(clippy::too_many_arguments)]
    fn stream_events(
        &self,
        user: String,
        run: &runs::Model,
        after_seq: u64,
        joined: Joined,
        kinds: Vec<i32>,
        cancel_on_disconnect: bool,
        permit: Option<StreamPermit>,
    ) -> ReceiverStream<Result<RunEvent, Status>> {
        // Bounded: a slow client makes this subscription lag (and re-read the store), never the run.
        let (tx, rx) = mpsc::channel(256);
        let sub = Subscription {
            run_id: run.run_id.clone(),
            thread_id: run.thread_id.clone(),
            after_seq,
            kinds,
            heartbeat: Duration::from_secs(self.engine.config().heartbeat_secs),
        };
        let engine = self.engine.clone();
        let (run_id, thread_id) = (run.run_id.clone(), run.thread_id.clone());
        tokio::spawn(async move {
            let ended = follow_from(engine.store().clone(), engine.hub().clone(), joined, sub, tx).await;
            // The stream is over: its room is free again.
            drop(permit);
            // A stream closed by this server's shutdown is not the client going away: the run is
            // handed on (drain) and the client reconnects, so it is not cancelled.
            if !ended && cancel_on_disconnect && !engine.shutting_down() {
                match cancel::cancel(&engine, &user, &thread_id, &run_id, CancelAction::Interrupt, CancelCause::ClientDisconnected).await {
                    Ok(_) => tracing::info!(run_id, "client disconnected; run cancelled (on_disconnect = CANCEL)"),
                    Err(error) => tracing::debug!(run_id, %error, "client disconnected; nothing to cancel"),
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

fn identity<T>(request: &Request<T>) -> Result<CallContext, Status> {
    CallContext::from_request(request)
}

fn page_response(next: String) -> Option<antler_proto::common::PageResponse> {
    Some(antler_proto::common::PageResponse { next_page_token: next })
}

/// Cancels a run when dropped unarmed: WaitRun's client went away before the run ended.
struct CancelOnDrop {
    engine: Arc<Engine>,
    user: String,
    thread_id: String,
    run_id: String,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (engine, user, thread_id, run_id) = (self.engine.clone(), self.user.clone(), self.thread_id.clone(), self.run_id.clone());
        tokio::spawn(async move {
            if cancel::cancel(&engine, &user, &thread_id, &run_id, CancelAction::Interrupt, CancelCause::ClientDisconnected).await.is_ok() {
                tracing::info!(run_id, "WaitRun client went away; run cancelled (on_disconnect = CANCEL)");
            }
        });
    }
}

#[tonic::async_trait]
impl RunService for RunApi {
    async fn create_run(&self, request: Request<CreateRunRequest>) -> Result<Response<CreateRunResponse>, Status> {
        let ctx = identity(&request)?;
        let (run, reused) = self.admit(&ctx, request.into_inner()).await?;
        Ok(Response::new(CreateRunResponse { run: Some(convert::run(&run, reused)) }))
    }

    type StreamRunStream = EventStream<StreamRunResponse>;

    async fn stream_run(&self, request: Request<StreamRunRequest>) -> Result<Response<Self::StreamRunStream>, Status> {
        let ctx = identity(&request)?;
        // Before admitting: a stream refused must not leave a run behind.
        let permit = self.stream_permit(&request, &ctx.identity.user_id)?;
        let create = request.into_inner().create.ok_or_else(|| antler_kit::status::invalid_argument("create", "is required"))?;
        let cancel_on_disconnect = create.on_disconnect != OnDisconnect::Continue as i32;
        let kinds = create.stream_kinds.clone();
        let (run, joined) = self.admit_watched(&ctx, create).await?;
        let events = self.stream_events(ctx.identity.user_id.clone(), &run, 0, joined, kinds, cancel_on_disconnect, permit);
        Ok(Response::new(Box::pin(events.map(|e| e.map(|event| StreamRunResponse { event: Some(event) })))))
    }

    async fn wait_run(&self, request: Request<WaitRunRequest>) -> Result<Response<WaitRunResponse>, Status> {
        let ctx = identity(&request)?;
        let create = request.into_inner().create.ok_or_else(|| antler_kit::status::invalid_argument("create", "is required"))?;
        let cancel_on_disconnect = create.on_disconnect != OnDisconnect::Continue as i32;
        let (run, _) = self.admit(&ctx, create).await?;
        let mut guard = CancelOnDrop {
            engine: self.engine.clone(),
            user: ctx.identity.user_id.clone(),
            thread_id: run.thread_id.clone(),
            run_id: run.run_id.clone(),
            armed: cancel_on_disconnect,
        };
        let finished = cancel::wait_terminal(&self.engine, &run.run_id).await?;
        guard.armed = false;
        let thread = thread_domain::find(&self.engine, &ctx.identity.user_id, &finished.thread_id).await?;
        let state = thread_domain::state(&self.engine, &thread, None, Default::default()).await?;
        Ok(Response::new(WaitRunResponse { run: Some(convert::run(&finished, false)), state: Some(state) }))
    }

    async fn get_run(&self, request: Request<GetRunRequest>) -> Result<Response<GetRunResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        let run = self.find_run(&user, &req.thread_id, &req.run_id).await?;
        Ok(Response::new(GetRunResponse { run: Some(convert::run(&run, false)) }))
    }

    async fn list_runs(&self, request: Request<ListRunsRequest>) -> Result<Response<ListRunsResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        let page = req.page.unwrap_or_default();
        let size = paging::size(page.page_size, paging::DEFAULT_PAGE, paging::MAX_PAGE);
        let mut statuses = Vec::new();
        for (i, status) in req.statuses.iter().enumerate() {
            let status = RunStatus::try_from(*status)
                .ok()
                .and_then(crate::status::Status::from_proto)
                .ok_or_else(|| antler_kit::status::invalid_argument(&format!("statuses[{i}]"), "is not a RunStatus"))?;
            statuses.push(status);
        }
        // An empty thread_id lists all of the caller's runs.
        let query = run_queries::ListQuery { parent_run_id: &req.parent_run_id, thread_id: &req.thread_id, statuses };
        let (rows, next) = run_queries::list(&self.engine, &user, &query, size, &page.page_token).await?;
        Ok(Response::new(ListRunsResponse { runs: rows.iter().map(|r| convert::run(r, false)).collect(), page: page_response(next) }))
    }

    async fn cancel_run(&self, request: Request<CancelRunRequest>) -> Result<Response<CancelRunResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        let action = CancelAction::try_from(req.action)
            .map_err(|_| antler_kit::status::invalid_argument("action", format!("{} is not a CancelAction", req.action)))?;
        let winner = cancel::cancel(&self.engine, &user, &req.thread_id, &req.run_id, action, CancelCause::Requested).await?;
        let run = if req.wait {
            cancel::wait_terminal(&self.engine, &req.run_id).await?
        } else {
            self.find_run(&user, &req.thread_id, &req.run_id).await?
        };
        Ok(Response::new(CancelRunResponse { run: Some(convert::run(&run, false)), action: winner as i32 }))
    }

    type JoinRunStream = EventStream<JoinRunResponse>;

    async fn join_run(&self, request: Request<JoinRunRequest>) -> Result<Response<Self::JoinRunStream>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let permit = self.stream_permit(&request, &user)?;
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        let run = self.find_run(&user, &req.thread_id, &req.run_id).await?;
        for (i, kind) in req.kinds.iter().enumerate() {
            if !matches!(EventKind::try_from(*kind), Ok(k) if k != EventKind::Unspecified) {
                return Err(antler_kit::status::invalid_argument(&format!("kinds[{i}]"), format!("{kind} is not an EventKind")));
            }
        }
        let kinds = if req.kinds.is_empty() {
            CreateRunRequest::decode(run.request.as_slice()).map(|r| r.stream_kinds).unwrap_or_default()
        } else {
            req.kinds
        };
        let cancel_on_disconnect = req.on_disconnect == OnDisconnect::Cancel as i32 && !run.status.is_terminal();
        let events = self.stream_events(user, &run, req.after_seq, Joined::Late, kinds, cancel_on_disconnect, permit);
        Ok(Response::new(Box::pin(events.map(|e| e.map(|event| JoinRunResponse { event: Some(event) })))))
    }

    async fn list_run_events(&self, request: Request<ListRunEventsRequest>) -> Result<Response<ListRunEventsResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        let run = self.find_run(&user, &req.thread_id, &req.run_id).await?;
        let page = req.page.unwrap_or_default();
        let size = paging::size(page.page_size, 500, 2000);
        let after = if page.page_token.is_empty() {
            req.after_seq
        } else {
            page.page_token
                .parse::<u64>()
                .map_err(|_| antler_kit::status::invalid_argument("page.page_token", "is not a token returned by this service"))?
        };
        for (i, kind) in req.kinds.iter().enumerate() {
            if EventKind::try_from(*kind).is_err() {
                return Err(antler_kit::status::invalid_argument(&format!("kinds[{i}]"), format!("{kind} is not an EventKind")));
            }
        }
        let task_id = (!req.task_id.is_empty()).then_some(req.task_id.as_str());
        let events = read_page(self.engine.store(), &run.run_id, after, &req.kinds, task_id, size).await?;
        let next = if events.len() as u64 == size { events.last().map(|e| e.seq.to_string()).unwrap_or_default() } else { String::new() };
        Ok(Response::new(ListRunEventsResponse { events, page: page_response(next), run_status: run.status.to_proto() as i32 }))
    }

    async fn submit_feedback(&self, request: Request<SubmitFeedbackRequest>) -> Result<Response<SubmitFeedbackResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        if req.rating != 1 && req.rating != -1 {
            return Err(antler_kit::status::invalid_argument("rating", format!("{} must be 1 (good) or -1 (bad)", req.rating)));
        }
        if req.comment.chars().count() > 4000 {
            return Err(antler_kit::status::invalid_argument("comment", "is longer than 4000 characters"));
        }
        let run = self.find_run(&user, &req.thread_id, &req.run_id).await?;
        let rating = crate::feedback::Rating { message_id: &req.message_id, rating: req.rating, comment: &req.comment };
        let (model, created) = crate::feedback::submit(&self.engine, &user, &run, &rating).await?;
        let feedback = Feedback {
            feedback_id: model.feedback_id,
            run_id: model.run_id,
            thread_id: model.thread_id,
            message_id: model.message_id,
            rating: model.rating,
            comment: model.comment,
            created_at: Some(crate::time::to_timestamp(model.created_at)),
            updated_at: Some(crate::time::to_timestamp(model.updated_at)),
        };
        Ok(Response::new(SubmitFeedbackResponse { feedback: Some(feedback), created }))
    }

    async fn delete_feedback(&self, request: Request<DeleteFeedbackRequest>) -> Result<Response<DeleteFeedbackResponse>, Status> {
        let user = Identity::of(&request)?.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("run_id", &req.run_id)?;
        let run = self.find_run(&user, &req.thread_id, &req.run_id).await?;
        let deleted = crate::feedback::delete(&self.engine, &user, &run.run_id).await?;
        Ok(Response::new(DeleteFeedbackResponse { deleted }))
    }

    async fn get_token_usage(&self, request: Request<GetTokenUsageRequest>) -> Result<Response<GetTokenUsageResponse>, Status> {
        let ctx = identity(&request)?;
        let user = ctx.identity.user_id.clone();
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let thread = thread_domain::find(&self.engine, &user, &req.thread_id).await?;
        let usage = crate::usage::thread_usage(&self.engine, &user, &req.thread_id, req.include_active).await?;
        let context_usage = crate::usage::thread_context(&self.engine, &ctx, &thread).await?;
        Ok(Response::new(GetTokenUsageResponse {
            thread_id: req.thread_id,
            total: Some(usage.total),
            runs: usage.runs,
            llm_calls: usage.llm_calls,
            by_model: usage.by_model,
            by_caller: Some(usage.by_caller),
            context_usage,
        }))
    }
}
