//! Thin tonic handlers for `antler.memory.v1`. The capability behind them has not landed yet, so each RPC
//! answers UNIMPLEMENTED with a message naming what is missing, never a fake success.

use antler_kit::status::unimplemented;
use antler_proto::memory::*;
use tonic::{Request, Response, Status};

/// `antler.memory.v1.MemoryService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct MemoryApi;

const MEMORY_SERVICE_CAPABILITY: &str = "the memory store and extraction queue are not scheduled in an issue yet";

#[tonic::async_trait]
impl memory_service_server::MemoryService for MemoryApi {
    async fn get_memory(&self, _request: Request<GetMemoryRequest>) -> Result<Response<GetMemoryResponse>, Status> {
        Err(unimplemented("MemoryService.GetMemory", MEMORY_SERVICE_CAPABILITY))
    }

    async fn list_facts(&self, _request: Request<ListFactsRequest>) -> Result<Response<ListFactsResponse>, Status> {
        Err(unimplemented("MemoryService.ListFacts", MEMORY_SERVICE_CAPABILITY))
    }

    async fn search_facts(&self, _request: Request<SearchFactsRequest>) -> Result<Response<SearchFactsResponse>, Status> {
        Err(unimplemented("MemoryService.SearchFacts", MEMORY_SERVICE_CAPABILITY))
    }

    async fn add_fact(&self, _request: Request<AddFactRequest>) -> Result<Response<AddFactResponse>, Status> {
        Err(unimplemented("MemoryService.AddFact", MEMORY_SERVICE_CAPABILITY))
    }

    async fn update_fact(&self, _request: Request<UpdateFactRequest>) -> Result<Response<UpdateFactResponse>, Status> {
        Err(unimplemented("MemoryService.UpdateFact", MEMORY_SERVICE_CAPABILITY))
    }

    async fn delete_fact(&self, _request: Request<DeleteFactRequest>) -> Result<Response<DeleteFactResponse>, Status> {
        Err(unimplemented("MemoryService.DeleteFact", MEMORY_SERVICE_CAPABILITY))
    }

    async fn queue_update(&self, _request: Request<QueueUpdateRequest>) -> Result<Response<QueueUpdateResponse>, Status> {
        Err(unimplemented("MemoryService.QueueUpdate", MEMORY_SERVICE_CAPABILITY))
    }

    async fn flush_updates(&self, _request: Request<FlushUpdatesRequest>) -> Result<Response<FlushUpdatesResponse>, Status> {
        Err(unimplemented("MemoryService.FlushUpdates", MEMORY_SERVICE_CAPABILITY))
    }

    async fn render_injection(&self, _request: Request<RenderInjectionRequest>) -> Result<Response<RenderInjectionResponse>, Status> {
        Err(unimplemented("MemoryService.RenderInjection", MEMORY_SERVICE_CAPABILITY))
    }
}
