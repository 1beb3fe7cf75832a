//! How a generated client reaches a service: over the network ([`Channel`]), or — when the service is
//! this very process (`antler up`: an empty `clients.<service>.endpoint`) — through the process's own
//! server stack in memory.
//!
//! The in-memory path is the same gRPC call: the client encodes the request with the same codec, the
//! request passes the same layers as one that arrived on the socket (redaction, trace context,
//! authentication, the concurrency limits, default deadlines, message size limits) and reaches the same
//! handler, and the reply is decoded as it would be. What it skips is what only the network needs:
//! the loopback socket, HTTP/2 framing and flow control, TLS. The profile of a one-step lead run
//! (issue #32) put the loopback hops — several per run: the model call, the sandbox's output
//! snapshots, the skill and MCP listings, the model lookup — at about a third of the server's CPU,
//! most of it in the kernel and in h2/hyper rather than in any handler.
//!
//! tonic enforces a client's `grpc-timeout` in its server, which the in-memory path does not pass
//! through, so [`Transport`] enforces it itself, with the same DEADLINE_EXCEEDED answer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::transport::Channel;
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

/// The server stack a [`LocalServer`] holds: every layer the listener applies, then the routes.
pub type LocalService = BoxCloneSyncService<http::Request<tonic::body::Body>, http::Response<tonic::body::Body>, Infallible>;

/// This process's server stack, once it serves (see [`crate::server::ServiceSet::serve_locally`]):
/// shared by the clients of one [`crate::Clients`] whose endpoint is this process. Empty before the
/// server serves and after it stopped; those clients then use their network channel.
#[derive(Clone, Default)]
pub struct LocalServer(Arc<RwLock<Option<LocalService>>>);

impl std::fmt::Debug for LocalServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalServer").field("serving", &self.get().is_some()).finish()
    }
}

impl LocalServer {
    pub(crate) fn install(&self, service: LocalService) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(service);
    }

    pub(crate) fn clear(&self) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub(crate) fn get(&self) -> Option<LocalService> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What generated clients are built on: `RunServiceClient::new(client.channel())`.
#[derive(Clone)]
pub enum Transport {
    /// A connection to another process (or to this one before it serves).
    Channel(Channel),
    /// This process's own server stack, called in memory.
    Local(LocalService),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Channel(channel) => f.debug_tuple("Channel").field(channel).finish(),
            Transport::Local(_) => f.write_str("Local"),
        }
    }
}

/// A transport error (only the network path has any).
pub type TransportError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Request<tonic::body::Body>> for Transport {
    type Response = http::Response<tonic::body::Body>;
    type Error = TransportError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self {
            Transport::Channel(channel) => tower_service::Service::poll_ready(channel, cx).map_err(Into::into),
            Transport::Local(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        match self {
            Transport::Channel(channel) => {
                let call = tower_service::Service::call(channel, request);
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            Transport::Local(service) => {
                let timeout = grpc_timeout(request.headers());
                let call = service.clone().oneshot(request);
                Box::pin(async move {
                    let answered = match timeout {
                        Some(limit) => match tokio::time::timeout(limit, call).await {
                            Ok(answered) => answered,
                            Err(_) => return Ok(tonic::Status::deadline_exceeded("Timeout expired").into_http()),
                        },
                        None => call.await,
                    };
                    // The stack's error type is Infallible: every refusal is already a gRPC answer.
                    Ok(answered.unwrap_or_else(|never| match never {}))
                })
            }
        }
    }
}

/// The `grpc-timeout` header (`<digits><unit>`, units H M S m u n), as tonic's server reads it.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.is_empty() || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

    /// A client of this process's own server uses the in-memory stack once it serves, which answers
    /// through the same layers and handlers, and the socket again after the server stopped.
    #[tokio::test]
    async fn own_services_are_called_in_memory_while_the_server_serves() -> Result<(), Box<dyn std::error::Error>> {
        let config = crate::config::Config::default();
        let auth = crate::Authenticator::new(&config.server.auth)?;
        let mut server = config.server.clone();
        server.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = crate::server::bind(&server, &auth).await?;
        let addr = listener.local_addr()?;
        let clients = crate::Clients::from_config(&config.clients, addr)?;
        let sandbox = clients.get("sandbox").ok_or("no sandbox client")?;
        assert!(matches!(sandbox.channel(), Transport::Channel(_)), "not serving yet: the socket");
        let mut set = crate::ServiceSet::new(&server);
        set.serve_locally(clients.local_server());
        let shutdown = tokio_util::sync::CancellationToken::new();
        let serving = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { crate::server::serve(listener, set, &server, auth, shutdown).await }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(sandbox.channel(), Transport::Channel(_)) {
            assert!(std::time::Instant::now() < deadline, "the server never installed its stack");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let check = |transport: Transport| async move {
            let request = tonic::Request::new(HealthCheckRequest { service: String::new() });
            HealthClient::new(transport).check(request).await.map(|r| r.into_inner().status())
        };
        assert_eq!(check(sandbox.channel()).await?, ServingStatus::Serving);
        shutdown.cancel();
        serving.await?.map_err(|e| e.to_string())?;
        assert!(matches!(sandbox.channel(), Transport::Channel(_)), "stopped: back to the socket, which refuses");
        assert!(check(sandbox.channel()).await.is_err());
        Ok(())
    }

    /// The in-memory path enforces the caller's `grpc-timeout` as tonic's server would.
    #[tokio::test]
    async fn a_local_call_past_its_grpc_timeout_is_deadline_exceeded() -> Result<(), Box<dyn std::error::Error>> {
        let never = tower::service_fn(|_: http::Request<tonic::body::Body>| {
            std::future::pending::<Result<http::Response<tonic::body::Body>, Infallible>>()
        });
        let mut transport = Transport::Local(LocalService::new(never));
        let mut request = http::Request::new(tonic::body::Body::empty());
        request.headers_mut().insert("grpc-timeout", http::HeaderValue::from_static("50m"));
        let started = std::time::Instant::now();
        let response = tower_service::Service::call(&mut transport, request).await.map_err(|e| e.to_string())?;
        assert!(started.elapsed() < Duration::from_secs(5));
        let status = tonic::Status::from_header_map(response.headers()).ok_or("no grpc-status")?;
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        Ok(())
    }

    #[test]
    fn grpc_timeouts_parse_as_tonic_writes_them() {
        let timeout = |v: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", http::HeaderValue::from_str(v).unwrap_or(http::HeaderValue::from_static("x")));
            grpc_timeout(&headers)
        };
        assert_eq!(timeout("30000m"), Some(Duration::from_secs(30)));
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(timeout("1234567890S"), None, "more than 8 digits");
        assert_eq!(timeout("12x"), None);
        assert_eq!(timeout("S"), None);
    }
}
