//! What is known of a request on its way through the layers, kept for its record: when it
//! arrived, the model it named, whether it was forwarded.

use crate::api::GenerationRequest;
use crate::request_id::request_id;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::time::Instant;

/// When the request reached the first layer: its time to first token is measured from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrived(pub Instant);

/// What a request's record needs that its charge does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// `x-request-id`.
    pub request_id: Option<String>,
    /// The model the client named.
    pub model: Option<String>,
    /// When it reached the gateway.
    pub arrived: Option<Instant>,
}

impl RequestFacts {
    /// What `req` says of itself: its id header, and what the layers before left in its
    /// extensions ([`Arrived`], the parsed [`GenerationRequest`]).
    pub fn of<B>(req: &http::Request<B>) -> Self {
        Self {
            request_id: request_id(req.headers()),
            model: req
                .extensions()
                .get::<GenerationRequest>()
                .map(|g| g.model.clone()),
            arrived: req.extensions().get::<Arrived>().map(|a| a.0),
        }
    }
}

/// Where the counting layer leaves the model a request named, for the record of a refusal that
/// comes after it (by then the request is gone). The authentication layer puts one in the
/// request's extensions when it records outcomes.
#[derive(Clone, Debug, Default)]
pub struct NamedModel(Arc<OnceLock<String>>);

impl NamedModel {
    /// Notes the model (the first call wins).
    pub fn set(&self, model: &str) {
        let _ = self.0.set(model.to_owned());
    }

    /// The model noted, if the request was read that far.
    pub fn get(&self) -> Option<String> {
        self.0.get().cloned()
    }
}

/// Whether a request was forwarded: set by whatever hands its bytes to the backend (the
/// gateway's backend client marks it when the connection first asks for the body, so a connect
/// failure or a refused connection leaves it unset), read by its [`Ticket`] when it settles.
#[derive(Clone, Debug, Default)]
pub struct Forwarded(Arc<AtomicBool>);

impl Forwarded {
    /// The request's bytes are on their way to the backend: its prefill is spent.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Forwarded::mark`] was called.
    pub fn is_marked(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
