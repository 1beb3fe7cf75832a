//! A process-wide cap on requests in flight, answering UNAVAILABLE (with `retry-after`) beyond it.
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

/// Tower layer enforcing the `server.concurrency_limit`.
#[derive(Clone, Debug)]
pub struct ConcurrencyLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl ConcurrencyLayer {
    pub fn new(limit: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), limit }
    }
}

impl<S> tower_layer::Layer<S> for ConcurrencyLayer {
    type Service = ConcurrencyService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyService { inner, permits: self.permits.clone(), limit: self.limit }
    }
}

/// See [`ConcurrencyLayer`].
#[derive(Clone, Debug)]
pub struct ConcurrencyService<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
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
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Either::Right(PermitFuture { inner: self.inner.call(request), permit }),
            Err(_) => {
                metrics::counter!("antler_requests_shed_total").increment(1);
                let status = crate::status::unavailable(
                    format!(
                        "server is at its concurrency limit ({} requests in flight); raise server.concurrency_limit if this persists",
                        self.limit
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
        let mut svc = tower_layer::Layer::layer(&ConcurrencyLayer::new(1), inner);
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
}
