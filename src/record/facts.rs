//! What the layers and the backend client tell each other of a request on its way: when it
//! arrived, whether it was forwarded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// When the request reached the first layer: its time to first token is measured from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrived(pub Instant);

/// Whether a request was forwarded: set by whatever hands its bytes to the backend (the
/// gateway's backend client marks it when the connection first asks for the body, so a connect
/// failure or a refused connection leaves it unset), read by its [`Ticket`](crate::settle::Ticket) when it settles.
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
