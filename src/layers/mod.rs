//! Steps 5-9 of DESIGN.md's request path, one tower layer each, in the order
//! `server::generation_service` composes them; step 10-11's service (`proxy::forward`) is the
//! leaf under them. Each layer reads what the ones before it put in the request's extensions
//! and adds what it produced:
//!
//! | step | layer | file | needs | adds |
//! |---|---|---|---|---|
//! | 5 authenticate | [`AuthenticateLayer`] | `layers/authenticate.rs` | the API key | `Arc<Tenant>`, [`Arrived`] |
//! | 6-7 parse + count | [`CountLayer`] | `layers/count.rs` | `Arc<Tenant>`, [`Route`](crate::api::Route), the body | [`GenerationRequest`](crate::api::openai::GenerationRequest), [`Cost`](crate::limiter::Cost) |
//! | 8 charge | [`ChargeLayer`] | `layers/charge.rs` | `Arc<Tenant>`, `Cost` | [`TicketSlot`] (the [`Ticket`]) |
//! | 9 admit | [`AdmitLayer`] | `layers/admit.rs` | `Arc<Tenant>`, `Cost`, `TicketSlot` | the KV lease, in the ticket |
//! | 10-11 forward + meter | [`Forward`](crate::proxy::forward::Forward) | `proxy/forward.rs`, `proxy/meter.rs` | all of the above | the metered answer, owning the ticket |
//!
//! Every layer's error is an [`ApiError`] (its inner service's error converts into one), and
//! none reads the body but the counting layer, so the charge and admission layers go in front
//! of any service with any body type: the [`Cost`](crate::limiter::Cost) and the tenant can come
//! from the user's own code (see `examples/limit_my_service.rs`).

pub mod admit;
pub mod authenticate;
pub mod charge;
pub mod count;

pub use admit::{AdmitLayer, KvGeometry};
pub use authenticate::AuthenticateLayer;
pub use charge::{AsAuthenticated, ChargeLayer, LimitsInForce, Ticket, TicketSlot};
pub use count::CountLayer;

use crate::error::ApiError;
use http::Extensions;
use tokio::time::Instant;

/// When the request reached the first layer: its time to first token is measured from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrived(pub Instant);

/// What a layer needs from the request's extensions; missing, it is a stack built in the wrong
/// order (a 500 naming the type).
pub(crate) fn needs<T: Send + Sync + 'static>(extensions: &Extensions) -> Result<&T, ApiError> {
    extensions
        .get::<T>()
        .ok_or_else(|| ApiError::missing_extension(std::any::type_name::<T>()))
}
