//! A default deadline for calls that carry none (`server.default_deadline_secs`): a client that sets
//! no `grpc-timeout` still gets an answer — DEADLINE_EXCEEDED naming the setting — instead of holding
//! a request permit for as long as a stuck dependency takes. A call with its own `grpc-timeout` keeps
//! it (shorter or longer: the client chose); `server.request_timeout_secs`, when set, caps both.
//!
//! Only the time to the response head is bounded, so a server stream (StreamRun, ExecuteCommand)
//! runs as long as it lasts once it has started: in effect the deadline applies to unary calls.
//! Not bounded: calls between Antler services (see [`crate::limit::is_internal_call`]), which carry
//! their client's own timeout, and the methods a service declares as waits
//! ([`crate::ServiceSet::without_default_deadline`], e.g. WaitRun, bounded by the run's own limit).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};

/// Tower layer applying the default deadline. Must sit inside the auth layer (service principals).
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    deadline: Option<Duration>,
    exempt: Arc<HashSet<&'static str>>,
}

impl DeadlineLayer {
    /// `seconds` 0 turns the layer off; `exempt` are method paths (`/package.Service/Method`).
    pub fn new(seconds: u64, exempt: impl IntoIterator<Item = &'static str>) -> Self {
        Self { deadline: (seconds > 0).then(|| Duration::from_secs(seconds)), exempt: Arc::new(exempt.into_iter().collect()) }
    }
}

impl<S> tower_layer::Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner, deadline: self.deadline, exempt: self.exempt.clone() }
    }
}

/// See [`DeadlineLayer`].
#[derive(Clone, Debug)]
pub struct DeadlineService<S> {
    inner: S,
    deadline: Option<Duration>,
    exempt: Arc<HashSet<&'static str>>,
}

pin_project_lite::pin_project! {
    /// The handler's future, answered DEADLINE_EXCEEDED if `sleep` fires first.
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        seconds: u64,
    }
}

impl<F, B, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            return Poll::Ready(result);
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            metrics::counter!("antler_requests_default_deadline_total").increment(1);
            let status = tonic::Status::deadline_exceeded(format!(
                "no answer within the default deadline of {} s (server.default_deadline_secs)\nhint: give the call its own deadline (grpc-timeout) if it needs longer",
                this.seconds
            ));
            return Poll::Ready(Ok(status.into_http()));
        }
        Poll::Pending
    }
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for DeadlineService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let applies = self.deadline.filter(|_| {
            !request.headers().contains_key("grpc-timeout")
                && !self.exempt.contains(request.uri().path())
                && !crate::limit::is_internal_request(&request)
        });
        DeadlineFuture {
            sleep: applies.map(tokio::time::sleep),
            seconds: applies.map(|d| d.as_secs()).unwrap_or(0),
            inner: self.inner.call(request),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Service, ServiceExt};

    use super::*;

    fn slow() -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send> + Clone {
        tower::service_fn(|_req: Request<()>| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        })
    }

    fn request(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_call_without_a_deadline_gets_the_default_and_others_keep_theirs() -> Result<(), Infallible> {
        let mut svc = tower_layer::Layer::layer(&DeadlineLayer::new(1, ["/pkg.S/Wait"]), slow());
        let answer = svc.ready().await?.call(request("/pkg.S/Get")).await?;
        assert_eq!(answer.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"4"[..]), "DEADLINE_EXCEEDED is code 4");
        let message = answer.headers().get("grpc-message").map(|v| v.to_str().unwrap_or_default().to_owned()).unwrap_or_default();
        assert!(message.contains("server.default_deadline_secs"), "{message}");

        // The client's own deadline, an exempt method and an internal call are not cut at 1 s.
        let mut own = request("/pkg.S/Get");
        own.headers_mut().insert("grpc-timeout", http::HeaderValue::from_static("60S"));
        let mut internal = request("/pkg.S/Get");
        internal.headers_mut().insert(crate::internal::INTERNAL_HEADER, http::HeaderValue::from_static(crate::internal::internal_mark()));
        let mut calls = Vec::new();
        for call in [own, request("/pkg.S/Wait"), internal] {
            calls.push(tokio::time::timeout(Duration::from_millis(2500), svc.ready().await?.call(call)));
        }
        for outcome in futures::future::join_all(calls).await {
            assert!(outcome.is_err(), "still running after 2.5 s");
        }
        let mut off = tower_layer::Layer::layer(&DeadlineLayer::new(0, []), slow());
        let outcome = tokio::time::timeout(Duration::from_millis(1500), off.ready().await?.call(request("/pkg.S/Get"))).await;
        assert!(outcome.is_err(), "0 turns the default off");
        Ok(())
    }
}
