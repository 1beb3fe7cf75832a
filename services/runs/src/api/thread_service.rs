//! `antler.runs.v1.ThreadService`.

use std::sync::Arc;

use antler_kit::Identity;
use antler_proto::runs::thread_service_server::ThreadService;
use antler_proto::runs::*;
use tonic::{Request, Response, Status};

use crate::engine::Engine;
use crate::paging;
use crate::threads as domain;

#[derive(Debug, Clone)]
pub struct ThreadApi {
    pub engine: Arc<Engine>,
}

fn user<T>(request: &Request<T>) -> Result<String, Status> {
    Ok(Identity::of(request)?.user_id.clone())
}

#[tonic::async_trait]
impl ThreadService for ThreadApi {
    async fn create_thread(&self, request: Request<CreateThreadRequest>) -> Result<Response<CreateThreadResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        let (thread, created) = domain::create(&self.engine, &user, &req.thread_id, &req.title, req.metadata).await?;
        Ok(Response::new(CreateThreadResponse { thread: Some(domain::to_proto(&self.engine, &thread, false).await?), created }))
    }

    async fn get_thread(&self, request: Request<GetThreadRequest>) -> Result<Response<GetThreadResponse>, Status> {
        let user = user(&request)?;
        antler_kit::status::required("thread_id", &request.get_ref().thread_id)?;
        let thread = domain::find(&self.engine, &user, &request.get_ref().thread_id).await?;
        Ok(Response::new(GetThreadResponse { thread: Some(domain::to_proto(&self.engine, &thread, true).await?) }))
    }

    async fn list_threads(&self, request: Request<ListThreadsRequest>) -> Result<Response<ListThreadsResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        let page = req.page.unwrap_or_default();
        let status = ThreadStatus::try_from(req.status)
            .map_err(|_| antler_kit::status::invalid_argument("status", format!("{} is not a ThreadStatus", req.status)))?;
        let sort_by = ThreadSort::try_from(req.sort_by)
            .map_err(|_| antler_kit::status::invalid_argument("sort_by", format!("{} is not a ThreadSort", req.sort_by)))?;
        let order = SortOrder::try_from(req.sort_order)
            .map_err(|_| antler_kit::status::invalid_argument("sort_order", format!("{} is not a SortOrder", req.sort_order)))?;
        let size = paging::size(page.page_size, paging::DEFAULT_PAGE, paging::MAX_PAGE);
        let query = domain::ListQuery { metadata: req.metadata, values: req.values, status, sort: domain::Sort::of(sort_by, order) };
        let (rows, next) = domain::list(&self.engine, &user, &query, size, &page.page_token).await?;
        let mut threads = Vec::with_capacity(rows.len());
        for row in rows {
            threads.push(domain::to_proto_with(&self.engine, &row.thread, row.status, row.active_run_id, req.include_values).await?);
        }
        Ok(Response::new(ListThreadsResponse { threads, page: Some(antler_proto::common::PageResponse { next_page_token: next }) }))
    }

    async fn update_thread(&self, request: Request<UpdateThreadRequest>) -> Result<Response<UpdateThreadResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let thread = domain::update(&self.engine, &user, &req.thread_id, req.title, req.metadata).await?;
        Ok(Response::new(UpdateThreadResponse { thread: Some(domain::to_proto(&self.engine, &thread, false).await?) }))
    }

    async fn delete_thread(&self, request: Request<DeleteThreadRequest>) -> Result<Response<DeleteThreadResponse>, Status> {
        let ctx = antler_kit::CallContext::from_request(&request)?;
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let deleted_runs = domain::delete_with_workspace(&self.engine, &ctx, &req.thread_id, req.cancel_active_run).await?;
        tracing::info!(thread_id = %req.thread_id, deleted_runs, "thread deleted");
        Ok(Response::new(DeleteThreadResponse { thread_id: req.thread_id, deleted_runs }))
    }

    async fn get_thread_state(&self, request: Request<GetThreadStateRequest>) -> Result<Response<GetThreadStateResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let thread = domain::find(&self.engine, &user, &req.thread_id).await?;
        let checkpoint = (!req.checkpoint_id.is_empty()).then_some(req.checkpoint_id.as_str());
        let page = domain::MessagePage { limit: req.messages_limit, page_token: &req.messages_page_token };
        Ok(Response::new(GetThreadStateResponse { state: Some(domain::state(&self.engine, &thread, checkpoint, page).await?) }))
    }

    async fn update_thread_state(&self, request: Request<UpdateThreadStateRequest>) -> Result<Response<UpdateThreadStateResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let (checkpoint, thread) = domain::update_state(&self.engine, &user, &req.thread_id, req.values, &req.checkpoint_id).await?;
        Ok(Response::new(UpdateThreadStateResponse {
            checkpoint: Some(checkpoint),
            thread: Some(domain::to_proto(&self.engine, &thread, false).await?),
        }))
    }

    async fn list_thread_history(&self, request: Request<ListThreadHistoryRequest>) -> Result<Response<ListThreadHistoryResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        antler_kit::status::required("thread_id", &req.thread_id)?;
        let thread = domain::find(&self.engine, &user, &req.thread_id).await?;
        let page = req.page.unwrap_or_default();
        let size = paging::size(page.page_size, 10, 100);
        let (checkpoints, next) = domain::history(&self.engine, &thread, &req.run_id, size, &page.page_token, req.include_messages).await?;
        Ok(Response::new(ListThreadHistoryResponse {
            checkpoints,
            page: Some(antler_proto::common::PageResponse { next_page_token: next }),
        }))
    }
}
