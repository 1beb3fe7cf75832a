//! Process-wide caps on requests in flight, answering UNAVAILABLE (with `retry-after`) beyond them.
//!
//! Two budgets: client calls (`server.concurrency_limit`) and calls between Antler services
//! (`server.internal_concurrency_limit`). A call is internal when it comes from this very process —
//! it carries the process's mark ([`crate::internal`]) — or is authenticated as a service principal.
//! Without the split, every lead run waiting on its model held one in-process
//! ChatStream against the client budget, and 1,000 such runs left no room for the CancelRun calls
//! that should stop them.
//!
//! Shedding (rather than queueing) keeps latency bounded under overload. UNAVAILABLE rather than
//! RESOURCE_EXHAUSTED because the request was not processed at all and is safe to retry: it is the
//! code gRPC retry policies and Antler's own clients retry on. The permit is held until the handler produces its response head; a server stream that
//! then runs for an hour does not hold it (long streams are bounded by their own services).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use http::{Request, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use crate::internal::{INTERNAL_HEADER, internal_mark};

/// Whether a request is a call between Antler services (see the module documentation).
pub fn is_internal_request<B>(request: &Request<B>) -> bool {
    internal(request.headers().get(INTERNAL_HEADER).map(|v| v.as_bytes()), request.extensions())
}

/// [`is_internal_request`] for a request inside a handler: limits a service applies itself (open streams, for
/// instance) must not count the services' own calls either.
pub fn is_internal_call<T>(request: &tonic::Request<T>) -> bool {
    internal(request.metadata().get(INTERNAL_HEADER).map(|v| v.as_bytes()), request.extensions())
}

fn internal(mark: Option<&[u8]>, extensions: &http::Extensions) -> bool {
    crate::internal::is_mark(mark)
        || extensions.get::<crate::auth::Identity>().is_some_and(|i| matches!(i.principal, crate::auth::Principal::Service { .. }))
}

/// One budget of requests in flight.
#[derive(Clone, Debug)]
struct Budget {
    permits: Arc<Semaphore>,
    limit: usize,
    setting: &'static str,
}

impl Budget {
    fn new(limit: usize, setting: &'static str) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), limit, setting }
    }
}

/// Tower layer enforcing `server.concurrency_limit` and `server.internal_concurrency_limit`. Must sit
/// inside the auth layer, which tells service principals apart.
#[derive(Clone, Debug)]
pub struct ConcurrencyLayer {
    clients: Budget,
    internal: Budget,
}

impl ConcurrencyLayer {
    pub fn new(limit: usize, internal_limit: usize) -> Self {
        Self {
            clients: Budget::new(limit, "server.concurrency_limit"),
            internal: Budget::new(internal_limit, "server.internal_concurrency_limit"),
        }
    }
}

impl<S> tower_layer::Layer<S> for ConcurrencyLayer {
    type Service = ConcurrencyService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyService { inner, clients: self.clients.clone(), internal: self.internal.clone() }
    }
}

/// See [`ConcurrencyLayer`].
#[derive(Clone, Debug)]
pub struct ConcurrencyService<S> {
    inner: S,
    clients: Budget,
    internal: Budget,
}

pin_project_lite::pin_project! {
    /// The handler's future, holding its permit until it completes.
    pub struct PermitFuture<F> {
        #[pin]
        inner: F,
        permit: OwnedSemaphorePermit,
    }
}

impl<F: Future> Future for PermitFuture<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for ConcurrencyService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<ResBody>, S::Error>>, PermitFuture<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (budget, kind) = if is_internal_request(&request) { (&self.internal, "internal") } else { (&self.clients, "client") };
        match budget.permits.clone().try_acquire_owned() {
            Ok(permit) => Either::Right(PermitFuture { inner: self.inner.call(request), permit }),
            Err(_) => {
                metrics::counter!("antler_requests_shed_total", "kind" => kind).increment(1);
                let status = crate::status::unavailable(
                    format!(
                        "server is at its concurrency limit ({} {kind} requests in flight); raise {} if this persists",
                        budget.limit, budget.setting
                    ),
                    1,
                );
                Either::Left(ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Service, ServiceExt};

    use super::*;

    #[tokio::test]
    async fn requests_beyond_the_limit_are_shed_with_unavailable_and_retry_after() -> Result<(), Infallible> {
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let inner = tower::service_fn(move |_req: Request<()>| {
            let mut rx = release_rx.clone();
            async move {
                let _ = rx.wait_for(|go| *go).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let mut svc = tower_layer::Layer::layer(&ConcurrencyLayer::new(1, 1), inner);
        let first = svc.ready().await?.call(Request::new(()));
        let second = svc.ready().await?.call(Request::new(())).await?;
        assert_eq!(second.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]), "UNAVAILABLE is code 14");
        assert_eq!(second.headers().get("retry-after").map(|v| v.as_bytes()), Some(&b"1"[..]));
        let _ = release_tx.send(true);
        let first = first.await?;
        assert!(first.headers().get("grpc-status").is_none());
        // The permit came back with the first response.
        let third = svc.ready().await?.call(Request::new(())).await?;
        assert!(third.headers().get("grpc-status").is_none());
        Ok(())
    }

    #[tokio::test]
    async fn internal_calls_have_their_own_budget_and_a_forged_mark_does_not_count() -> Result<(), Infallible> {
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let inner = tower::service_fn(move |_req: Request<()>| {
            let mut rx = release_rx.clone();
            async move {
                let _ = rx.wait_for(|go| *go).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let mut svc = tower_layer::Layer::layer(&ConcurrencyLayer::new(1, 2), inner);
        let marked = || {
            let mut request = Request::new(());
            request.headers_mut().insert(INTERNAL_HEADER, http::HeaderValue::from_static(internal_mark()));
            request
        };
        let service = || {
            let mut request = Request::new(());
            request.extensions_mut().insert(crate::auth::Identity {
                user_id: "alice".into(),
                principal: crate::auth::Principal::Service { service: "runs".into() },
                credential: None,
            });
            request
        };
        // The internal budget (2) full: one call of this process, one of a service principal.
        let held = [svc.ready().await?.call(marked()), svc.ready().await?.call(service())];
        let shed = svc.ready().await?.call(marked()).await?;
        assert_eq!(shed.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]), "internal budget full");
        // A client call still gets the client budget, and a forged mark is a client call.
        let client = svc.ready().await?.call(Request::new(()));
        let mut forged = Request::new(());
        forged.headers_mut().insert(INTERNAL_HEADER, http::HeaderValue::from_static("not-the-mark"));
        let forged = svc.ready().await?.call(forged).await?;
        assert_eq!(forged.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]), "the client budget (1) is taken");
        let _ = release_tx.send(true);
        assert!(client.await?.headers().get("grpc-status").is_none());
        for call in held {
            assert!(call.await?.headers().get("grpc-status").is_none());
        }
        Ok(())
    }
}
