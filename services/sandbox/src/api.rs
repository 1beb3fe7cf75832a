//! Thin tonic handlers for `antler.sandbox.v1`. The capability behind them has not landed yet, so each RPC
//! answers UNIMPLEMENTED with a message naming what is missing, never a fake success.

use antler_kit::status::unimplemented;
use antler_proto::sandbox::*;
use tonic::{Request, Response, Status};

/// `antler.sandbox.v1.SandboxService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct SandboxApi;

const SANDBOX_SERVICE_CAPABILITY: &str = "per-thread workspaces, file tools and isolated command execution land with issue #5";

#[tonic::async_trait]
impl sandbox_service_server::SandboxService for SandboxApi {
    async fn acquire_sandbox(&self, _request: Request<AcquireSandboxRequest>) -> Result<Response<AcquireSandboxResponse>, Status> {
        Err(unimplemented("SandboxService.AcquireSandbox", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn get_sandbox(&self, _request: Request<GetSandboxRequest>) -> Result<Response<GetSandboxResponse>, Status> {
        Err(unimplemented("SandboxService.GetSandbox", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn release_sandbox(&self, _request: Request<ReleaseSandboxRequest>) -> Result<Response<ReleaseSandboxResponse>, Status> {
        Err(unimplemented("SandboxService.ReleaseSandbox", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn reset_sandbox(&self, _request: Request<ResetSandboxRequest>) -> Result<Response<ResetSandboxResponse>, Status> {
        Err(unimplemented("SandboxService.ResetSandbox", SANDBOX_SERVICE_CAPABILITY))
    }

    type ExecuteCommandStream = tokio_stream::Empty<Result<ExecuteCommandResponse, Status>>;

    async fn execute_command(&self, _request: Request<ExecuteCommandRequest>) -> Result<Response<Self::ExecuteCommandStream>, Status> {
        Err(unimplemented("SandboxService.ExecuteCommand", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn read_file(&self, _request: Request<ReadFileRequest>) -> Result<Response<ReadFileResponse>, Status> {
        Err(unimplemented("SandboxService.ReadFile", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn write_file(&self, _request: Request<WriteFileRequest>) -> Result<Response<WriteFileResponse>, Status> {
        Err(unimplemented("SandboxService.WriteFile", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn edit_file(&self, _request: Request<EditFileRequest>) -> Result<Response<EditFileResponse>, Status> {
        Err(unimplemented("SandboxService.EditFile", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn list_dir(&self, _request: Request<ListDirRequest>) -> Result<Response<ListDirResponse>, Status> {
        Err(unimplemented("SandboxService.ListDir", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn glob(&self, _request: Request<GlobRequest>) -> Result<Response<GlobResponse>, Status> {
        Err(unimplemented("SandboxService.Glob", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn grep(&self, _request: Request<GrepRequest>) -> Result<Response<GrepResponse>, Status> {
        Err(unimplemented("SandboxService.Grep", SANDBOX_SERVICE_CAPABILITY))
    }

    type DownloadFileStream = tokio_stream::Empty<Result<DownloadFileResponse, Status>>;

    async fn download_file(&self, _request: Request<DownloadFileRequest>) -> Result<Response<Self::DownloadFileStream>, Status> {
        Err(unimplemented("SandboxService.DownloadFile", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn upload_files(&self, _request: Request<tonic::Streaming<UploadFilesRequest>>) -> Result<Response<UploadFilesResponse>, Status> {
        Err(unimplemented("SandboxService.UploadFiles", SANDBOX_SERVICE_CAPABILITY))
    }

    async fn snapshot_outputs(&self, _request: Request<SnapshotOutputsRequest>) -> Result<Response<SnapshotOutputsResponse>, Status> {
        Err(unimplemented("SandboxService.SnapshotOutputs", SANDBOX_SERVICE_CAPABILITY))
    }
}
