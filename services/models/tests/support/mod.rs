//! Shared test harness: the models service served in-process by the kit's real server stack (auth, limits,
//! tracing) on 127.0.0.1:0, a gRPC client to it, and request/stream helpers.

#![allow(dead_code)]

pub mod upstream;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use antler_kit::{Authenticator, Config, ServiceSet};
use antler_models::gateway::Gateway;
use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::model_service_server::ModelServiceServer;
use antler_proto::models::{ChatRequest, ChatStreamFinish, ChatStreamRequest, ChatStreamResponse};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Every test step is bounded by this.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Fails the test instead of hanging it.
pub async fn bounded<T>(what: &str, work: impl Future<Output = T>) -> T {
    match tokio::time::timeout(LIMIT, work).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {LIMIT:?}"),
    }
}

/// A fixture file's text.
pub fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A running models service.
pub struct Service {
    pub client: ModelServiceClient<Channel>,
    pub gateway: Arc<Gateway>,
    pub config_path: PathBuf,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves the models service with `config` (a whole antler.yaml; `server.listen` is forced to port 0).
pub async fn serve(config: &str) -> anyhow::Result<Service> {
    let dir = tempfile::tempdir()?;
    let config_path = dir.path().join("antler.yaml");
    std::fs::write(&config_path, config)?;
    let mut config = Config::load(Some(&config_path))?;
    config.server.listen = "127.0.0.1:0".parse()?;
    config.server.shutdown_grace_secs = 1;
    let auth = Authenticator::new(&config.server.auth)?;
    let listener = antler_kit::server::bind(&config.server, &auth).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    // Outbound clients point at this very server, like `antler up`; it mounts no sandbox service.
    let clients = antler_kit::Clients::from_config(&config.clients, addr)?;
    let gateway = antler_models::gateway(&config, shutdown.clone(), Some(&clients)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut set = ServiceSet::new(&config.server);
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    antler_kit::add_service!(set, ModelServiceServer::new(antler_models::api::ModelApi::new(gateway.clone())));
    let server_config = config.server.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move { antler_kit::server::serve(listener, set, &server_config, auth, stop).await });
    let channel = Channel::from_shared(format!("http://{addr}"))?.connect().await?;
    Ok(Service { client: ModelServiceClient::new(channel), gateway, config_path, shutdown, _dir: dir })
}

/// A user message.
pub fn user(text: &str) -> Message {
    Message {
        role: Role::User as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

/// A one-message request to `model`.
pub fn request(model: &str, text: &str) -> ChatRequest {
    ChatRequest { model_name: model.to_owned(), messages: vec![user(text)], ..ChatRequest::default() }
}

/// Runs a ChatStream to its end: the deltas before the finish, and the finish.
pub async fn stream(
    client: &ModelServiceClient<Channel>,
    request: ChatRequest,
) -> Result<(Vec<ChatStreamResponse>, ChatStreamFinish), tonic::Status> {
    let mut client = client.clone();
    bounded("ChatStream", async move {
        let mut stream = client.chat_stream(ChatStreamRequest { request: Some(request) }).await?.into_inner();
        let mut deltas = Vec::new();
        while let Some(item) = stream.message().await? {
            if let Some(Delta::Finish(finish)) = item.delta {
                assert!(stream.message().await?.is_none(), "nothing may follow the finish");
                return Ok((deltas, finish));
            }
            deltas.push(item);
        }
        Err(tonic::Status::internal("the stream ended without a finish"))
    })
    .await
}

/// The concatenated text deltas.
pub fn text_of(deltas: &[ChatStreamResponse]) -> String {
    deltas
        .iter()
        .filter_map(|d| match &d.delta {
            Some(Delta::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// The text of a message's text parts.
pub fn message_text(message: &Message) -> String {
    message
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// `models:` YAML for one OpenAI-compatible model named `name` at `url`, plus extra indented keys.
pub fn openai_model(name: &str, url: &str, extra: &str) -> String {
    format!(
        "    - name: {name}\n      provider: openai\n      model: {name}-upstream\n      base_url: {url}/v1\n      api_key: sk-test-{name}\n{extra}"
    )
}

/// A whole config with fast retries and the given model entries.
pub fn config(models: &str) -> String {
    format!("models:\n  retry: {{base_delay_ms: 10, cap_delay_ms: 40, max_retry_after_ms: 5000}}\n  models:\n{models}")
}
