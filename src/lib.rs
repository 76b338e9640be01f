//! tokengate: a token-aware rate-limiting reverse proxy for LLM inference.
//!
//! The request path (see `docs/` and the README): authenticate the tenant, tokenize the prompt
//! exactly, charge per-tenant prefill/decode/request buckets, admit by KV-cache footprint,
//! forward, meter the streamed answer and settle (refund unused decode tokens, free the KV lease)
//! on every path.
#![forbid(unsafe_code)]

pub mod clock;
pub mod error;
pub mod loadgen;
pub mod sim;
pub mod tokenize;
