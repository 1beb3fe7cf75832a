//! Thin tonic handlers for `antler.runs.v1`. The capability behind them has not landed yet, so each RPC
//! answers UNIMPLEMENTED with a message naming what is missing, never a fake success.

use antler_kit::status::unimplemented;
use antler_proto::runs::*;
use tonic::{Request, Response, Status};

/// `antler.runs.v1.ThreadService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct ThreadApi;

const THREAD_SERVICE_CAPABILITY: &str = "the thread store (threads, state, checkpoints) lands with issue #3";

#[tonic::async_trait]
impl thread_service_server::ThreadService for ThreadApi {
    async fn create_thread(&self, _request: Request<CreateThreadRequest>) -> Result<Response<CreateThreadResponse>, Status> {
        Err(unimplemented("ThreadService.CreateThread", THREAD_SERVICE_CAPABILITY))
    }

    async fn get_thread(&self, _request: Request<GetThreadRequest>) -> Result<Response<GetThreadResponse>, Status> {
        Err(unimplemented("ThreadService.GetThread", THREAD_SERVICE_CAPABILITY))
    }

    async fn list_threads(&self, _request: Request<ListThreadsRequest>) -> Result<Response<ListThreadsResponse>, Status> {
        Err(unimplemented("ThreadService.ListThreads", THREAD_SERVICE_CAPABILITY))
    }

    async fn update_thread(&self, _request: Request<UpdateThreadRequest>) -> Result<Response<UpdateThreadResponse>, Status> {
        Err(unimplemented("ThreadService.UpdateThread", THREAD_SERVICE_CAPABILITY))
    }

    async fn delete_thread(&self, _request: Request<DeleteThreadRequest>) -> Result<Response<DeleteThreadResponse>, Status> {
        Err(unimplemented("ThreadService.DeleteThread", THREAD_SERVICE_CAPABILITY))
    }

    async fn get_thread_state(&self, _request: Request<GetThreadStateRequest>) -> Result<Response<GetThreadStateResponse>, Status> {
        Err(unimplemented("ThreadService.GetThreadState", THREAD_SERVICE_CAPABILITY))
    }

    async fn list_thread_history(
        &self,
        _request: Request<ListThreadHistoryRequest>,
    ) -> Result<Response<ListThreadHistoryResponse>, Status> {
        Err(unimplemented("ThreadService.ListThreadHistory", THREAD_SERVICE_CAPABILITY))
    }
}

/// `antler.runs.v1.RunService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct RunApi;

const RUN_SERVICE_CAPABILITY: &str =
    "the run lifecycle (admission, workers, leases, cancellation, durable event streams) lands with issue #3";

#[tonic::async_trait]
impl run_service_server::RunService for RunApi {
    async fn create_run(&self, _request: Request<CreateRunRequest>) -> Result<Response<CreateRunResponse>, Status> {
        Err(unimplemented("RunService.CreateRun", RUN_SERVICE_CAPABILITY))
    }

    type StreamRunStream = tokio_stream::Empty<Result<StreamRunResponse, Status>>;

    async fn stream_run(&self, _request: Request<StreamRunRequest>) -> Result<Response<Self::StreamRunStream>, Status> {
        Err(unimplemented("RunService.StreamRun", RUN_SERVICE_CAPABILITY))
    }

    async fn wait_run(&self, _request: Request<WaitRunRequest>) -> Result<Response<WaitRunResponse>, Status> {
        Err(unimplemented("RunService.WaitRun", RUN_SERVICE_CAPABILITY))
    }

    async fn get_run(&self, _request: Request<GetRunRequest>) -> Result<Response<GetRunResponse>, Status> {
        Err(unimplemented("RunService.GetRun", RUN_SERVICE_CAPABILITY))
    }

    async fn list_runs(&self, _request: Request<ListRunsRequest>) -> Result<Response<ListRunsResponse>, Status> {
        Err(unimplemented("RunService.ListRuns", RUN_SERVICE_CAPABILITY))
    }

    async fn cancel_run(&self, _request: Request<CancelRunRequest>) -> Result<Response<CancelRunResponse>, Status> {
        Err(unimplemented("RunService.CancelRun", RUN_SERVICE_CAPABILITY))
    }

    type JoinRunStream = tokio_stream::Empty<Result<JoinRunResponse, Status>>;

    async fn join_run(&self, _request: Request<JoinRunRequest>) -> Result<Response<Self::JoinRunStream>, Status> {
        Err(unimplemented("RunService.JoinRun", RUN_SERVICE_CAPABILITY))
    }

    async fn list_run_events(&self, _request: Request<ListRunEventsRequest>) -> Result<Response<ListRunEventsResponse>, Status> {
        Err(unimplemented("RunService.ListRunEvents", RUN_SERVICE_CAPABILITY))
    }

    async fn submit_feedback(&self, _request: Request<SubmitFeedbackRequest>) -> Result<Response<SubmitFeedbackResponse>, Status> {
        Err(unimplemented("RunService.SubmitFeedback", RUN_SERVICE_CAPABILITY))
    }

    async fn get_token_usage(&self, _request: Request<GetTokenUsageRequest>) -> Result<Response<GetTokenUsageResponse>, Status> {
        Err(unimplemented("RunService.GetTokenUsage", RUN_SERVICE_CAPABILITY))
    }
}
