//! Step 3, bound the body: every request's body goes on [`Bounded`] to `server.max_body_bytes`
//! and to `server.body_read_timeout` from the moment its head arrived, before any step reads
//! it. Whoever reads it then (the counting layer, `/tokenize`, the drain of a refused body)
//! meets the bound as the body's own end: past the size a 413, past the deadline a 408, and a
//! declared length over the size refused before a byte is read. The layers that read a body
//! take only a [`Bounded`] one, so none can be put where a body reaches it unbounded.

use crate::util::bounded::Bounded;
use http::Request;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

/// Step 3 as a layer: the request's body becomes a [`Bounded`] one.
#[derive(Clone, Copy, Debug)]
pub struct BoundBodyLayer {
    max_bytes: u64,
    timeout: Duration,
}

impl BoundBodyLayer {
    /// Bodies of at most `max_bytes`, whole within `timeout` of the request's head.
    pub fn new(max_bytes: u64, timeout: Duration) -> Self {
        Self { max_bytes, timeout }
    }
}

impl<S> Layer<S> for BoundBodyLayer {
    type Service = BoundBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundBody {
            inner,
            layer: *self,
        }
    }
}

/// The service of [`BoundBodyLayer`].
#[derive(Clone, Debug)]
pub struct BoundBody<S> {
    inner: S,
    layer: BoundBodyLayer,
}

impl<S, B> Service<Request<B>> for BoundBody<S>
where
    S: Service<Request<Bounded<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let BoundBodyLayer { max_bytes, timeout } = self.layer;
        self.inner
            .call(req.map(|body| Bounded::new(body, max_bytes, timeout)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::bounded::{read_paced, ReadError, Unpaced};
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{service_fn, ServiceExt};

    /// Reads the bounded body it is handed, after waiting `wait` (a step before the read).
    async fn read_after(
        wait: Duration,
        req: Request<Bounded<Full<Bytes>>>,
    ) -> Result<Result<Bytes, ReadError>, std::convert::Infallible> {
        tokio::time::sleep(wait).await;
        Ok(read_paced(req.into_body(), &mut Unpaced).await)
    }

    #[tokio::test(start_paused = true)]
    async fn the_bounds_hold_from_the_head_whoever_reads_the_body_later() {
        let layer = BoundBodyLayer::new(5, Duration::from_secs(2));
        let body = |s: &'static str| Request::new(Full::new(Bytes::from_static(s.as_bytes())));
        let read = |wait, req| {
            layer
                .layer(service_fn(move |req| read_after(wait, req)))
                .oneshot(req)
        };
        let second = Duration::from_secs(1);
        assert_eq!(
            read(second, body("abcde")).await,
            Ok(Ok(Bytes::from("abcde")))
        );
        // Declared over the size: refused before a byte is read.
        assert_eq!(
            read(second, body("abcdef")).await,
            Ok(Err(ReadError::TooLarge))
        );
        // The deadline runs from the head, not from the read: a body read 3 s after its head
        // is past its 2 s.
        assert_eq!(
            read(3 * second, body("abc")).await,
            Ok(Err(ReadError::TimedOut))
        );
    }
}
