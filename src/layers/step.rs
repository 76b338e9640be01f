//! The skeleton every asynchronous step shares, written once: a [`StepLayer`] wraps the service
//! after it in a [`Stepped`] service, which is ready when that service is, and hands each
//! request, with the clone of that service that was made ready, to its [`Step`]. A step says
//! only what it does to a request; its refusal, or its inner service's error, is an
//! [`ApiError`].

use crate::admission::Sequences;
use crate::error::ApiError;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// What one step does with a request `R` in front of the service `S` after it.
pub trait Step<S, R>: Send + Sync + 'static {
    /// The request the step passes on to `S` (the same, or with its body spent).
    type Passes;
    /// `S`'s answer.
    type Response;

    /// `req` through this step and, unless the step refuses it, through `inner` (ready).
    fn run(
        self: Arc<Self>,
        req: R,
        inner: S,
    ) -> BoxFuture<'static, Result<Self::Response, ApiError>>;
}

/// A step as a tower layer.
#[derive(Debug)]
pub struct StepLayer<T> {
    step: Arc<T>,
}

impl<T> StepLayer<T> {
    /// The layer of `step`.
    pub(super) fn of(step: impl Into<Arc<T>>) -> Self {
        Self { step: step.into() }
    }

    /// The step, for a constructor that makes a changed copy of it.
    pub(super) fn step(&self) -> &T {
        &self.step
    }
}

impl<T> Clone for StepLayer<T> {
    fn clone(&self) -> Self {
        Self {
            step: self.step.clone(),
        }
    }
}

impl<S, T> Layer<S> for StepLayer<T> {
    type Service = Stepped<S, T>;

    fn layer(&self, inner: S) -> Self::Service {
        Stepped {
            inner,
            step: self.step.clone(),
        }
    }
}

/// The service of a [`StepLayer`]: its step in front of `inner`.
#[derive(Debug)]
pub struct Stepped<S, T> {
    inner: S,
    step: Arc<T>,
}

impl<S: Clone, T> Clone for Stepped<S, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            step: self.step.clone(),
        }
    }
}

impl<S, T, R> Service<R> for Stepped<S, T>
where
    T: Step<S, R>,
    S: Service<T::Passes> + Clone,
    S::Error: Into<ApiError>,
{
    type Response = T::Response;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<T::Response, ApiError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        // The clone that was made ready goes with this request; a fresh one stays.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        self.step.clone().run(req, inner)
    }
}

/// What the steps from the charge on read of the request they pass on: an http request (in
/// front of a service of the user's own), or one the counting layer counted
/// ([`Counted`](super::count::Counted)).
pub trait Carried: Send + 'static {
    /// Its extensions.
    fn extensions(&self) -> &http::Extensions;
    /// The model it names, under which quotas per model are kept ("" when not known).
    fn model(&self) -> &str;
    /// The sequences it runs (`None`: one).
    fn sequences(&self) -> Option<&Sequences>;
}

impl<B: Send + 'static> Carried for http::Request<B> {
    fn extensions(&self) -> &http::Extensions {
        self.extensions()
    }

    fn model(&self) -> &str {
        ""
    }

    /// The [`Sequences`] the user's own code put in its extensions, if any.
    fn sequences(&self) -> Option<&Sequences> {
        self.extensions().get::<Sequences>()
    }
}
