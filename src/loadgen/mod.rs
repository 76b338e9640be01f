//! Room `loadgen`: `tokengate loadgen`, the open-loop load generator. Arrivals are planned up
//! front (Poisson per stream from a seed, or a JSONL trace) and sent at their instants whatever
//! the server does; each request streams and is measured (TTFT, TPOT, end-to-end, outcome); the
//! report gives P50/P95/P99 per tenant, throughput, SLA attainment and goodput, as a table, JSON
//! and an SVG.
//!
//! Layout: [`arrivals`] (Poisson process), [`workload`] (profiles, `--mix`, traces, the plan),
//! [`prompt`] (texts of exact token counts), [`client`] (the streaming client), [`report`] (the
//! numbers), [`sla`] (the TPOT SLA the target holds), [`plot`] (the SVG), [`cli`] (arguments and
//! the runner).

pub mod arrivals;
pub mod cli;
pub mod client;
pub mod plot;
pub mod prompt;
pub mod report;
pub mod sla;
pub mod workload;

pub use cli::{run_loadgen, run_plan, LoadgenArgs};

#[cfg(test)]
mod tests;
