//! The settlement room: what a charged request holds, and the one place it is given back.
//!
//! The charge layer makes a request's [`Ticket`] (its bucket charge, quota reservation, record
//! hold and place in flight) and passes the request on [`Ticketed`], the ticket beside it; the
//! admission layer adds its KV lease; the service at the end
//! (the gateway's meter, or the user's own) owns it until the request ends, and ends it with
//! how it ended ([`Ticket::end`], an [`Ending`]), or drops it: the client went. Either way the
//! ticket settles once, in a fixed order:
//!
//! 1. the KV lease's bytes and batch slot, at once (the backend has stopped, or never started,
//!    using them);
//! 2. the buckets and the tenant's fairness counter in the admission queue: everything back before the request was forwarded (a refusal, a client gone
//!    while queued, a connection never made) or when the backend failed it; after that the
//!    prompt stays charged (as the backend counted it, when it said) and only the decode
//!    tokens not produced go back, past the decode floor ([`DecodeFloor`]) of a request the
//!    backend ran and never answered;
//! 3. the quota, with the buckets;
//! 4. the metrics, and the backend's counts against the gateway's ([`Reconcile`]);
//! 5. the record, once everything else is counted;
//! 6. the place in flight.
//!
//! When the output is still being counted (a stream whose backend sent no count, counted on the
//! tokenizer pool), steps 2-6 wait for the count off the request path; the KV does not. The
//! fairness counter waits with the buckets, so that a tenant's share of the queue is charged
//! the output it was served, not the prompt alone.

mod ending;
mod floor;
mod metering;
mod ticket;

pub use ending::{Ending, Output, Reading};
pub use floor::DecodeFloor;
pub use metering::{Metering, Reconcile, COUNT_WARNING_PERIOD};
pub use ticket::{Ticket, Ticketed};

#[cfg(test)]
mod tests;
