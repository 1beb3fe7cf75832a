//! A stand-in OTLP collector: the collector's `TraceService` over gRPC (tonic), or `POST /v1/traces`
//! with a protobuf body over HTTP, keeping every span it is sent. Not a double of anything Antler
//! ships: it is the far end of `server.tracing`, which a test needs to read what was exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One exported span, flattened.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent_span_id: String,
    pub name: String,
    /// String, bool and integer attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// The `service.name` of the resource that sent it.
    pub service: String,
}

impl ExportedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

type Store = Arc<Mutex<Vec<ExportedSpan>>>;

/// A running collector; stops when dropped.
#[derive(Debug)]
pub struct Collector {
    /// What `server.tracing.otlp_endpoint` should say.
    pub endpoint: String,
    spans: Store,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    /// OTLP over gRPC on a free loopback port.
    pub async fn grpc() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Store::default();
        let service = TraceServiceServer::new(Grpc(spans.clone()));
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        Ok(Self { endpoint, spans, task })
    }

    /// OTLP protobuf over HTTP on a free loopback port.
    pub async fn http() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}/v1/traces", listener.local_addr()?);
        let spans = Store::default();
        let store = spans.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_http(socket, store.clone()));
            }
        });
        Ok(Self { endpoint, spans, task })
    }

    /// OTLP over gRPC with TLS (the kit's server TLS: `leaf`, and client certificates checked against
    /// `client_ca` when given) on a free loopback port: the endpoint is `https://127.0.0.1:port`.
    pub async fn grpc_tls(leaf: &crate::tls::Leaf, client_ca: Option<&crate::tls::Ca>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("https://{}", listener.local_addr()?);
        let incoming = server_tls(leaf, client_ca)?.incoming(listener, tokio_util::sync::CancellationToken::new());
        let spans = Store::default();
        let service = TraceServiceServer::new(Grpc(spans.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        Ok(Self { endpoint, spans, task })
    }

    /// OTLP protobuf over HTTP/1.1 with TLS (`leaf`) on a free loopback port.
    pub async fn http_tls(leaf: &crate::tls::Leaf) -> Result<Self> {
        use tokio_stream::StreamExt;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("https://{}/v1/traces", listener.local_addr()?);
        let mut incoming = server_tls(leaf, None)?.incoming(listener, tokio_util::sync::CancellationToken::new());
        let spans = Store::default();
        let store = spans.clone();
        let task = tokio::spawn(async move {
            while let Some(connection) = incoming.next().await {
                if let Ok(connection) = connection {
                    tokio::spawn(serve_http(connection, store.clone()));
                }
            }
        });
        Ok(Self { endpoint, spans, task })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Grpc(Store);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The kit's server TLS for `leaf` (mTLS against `client_ca` when given), files read once.
fn server_tls(leaf: &crate::tls::Leaf, client_ca: Option<&crate::tls::Ca>) -> Result<antler_kit::tls::ServerTls> {
    let config = antler_kit::tls::ServerTlsConfig {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
        client_ca: client_ca.map(|ca| ca.cert.clone()).unwrap_or_default(),
        ..Default::default()
    };
    antler_kit::tls::ServerTls::load(&config, std::time::Duration::ZERO, None)?
        .ok_or_else(|| anyhow::anyhow!("the collector's TLS settings name no certificate"))
}

/// HTTP/1.1 requests with a Content-Length body, on one kept-alive connection.
async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut socket: S, store: Store) -> Result<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = socket.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        while buffer.len() < head_end + length {
            let n = socket.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        let (status, reply) = match (head.starts_with("post /v1/traces "), ExportTraceServiceRequest::decode(body.as_slice())) {
            (true, Ok(request)) => {
                keep(&store, request);
                ("200 OK", ExportTraceServiceResponse::default().encode_to_vec())
            }
            _ => ("400 Bad Request", Vec::new()),
        };
        let response = format!("HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n", reply.len());
        socket.write_all(response.as_bytes()).await?;
        socket.write_all(&reply).await?;
    }
}

fn keep(store: &Store, request: ExportTraceServiceRequest) {
    let mut spans = store.lock().unwrap_or_else(|p| p.into_inner());
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
            .unwrap_or_default();
        for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
            let attributes =
                span.attributes.iter().filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?)?))).collect();
            spans.push(ExportedSpan {
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                name: span.name,
                attributes,
                service: service.clone(),
            });
        }
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
