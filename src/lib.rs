//! tokengate: a token-aware rate-limiting reverse proxy for LLM inference.
//!
//! The request path (see docs/request-path.md): authenticate the tenant, tokenize the prompt
//! exactly, charge per-tenant prefill/decode/request buckets, admit by KV-cache footprint,
//! forward, meter the streamed answer and settle (refund unused decode tokens, free the KV lease)
//! on every path.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admin_client;
pub mod admission;
pub mod api;
pub mod app;
pub mod body;
pub mod cache_salt;
pub mod capacity;
pub mod cli;
pub mod clock;
pub mod config;
pub mod diagnose;
pub mod digest;
pub mod error;
pub mod error_code;
pub mod feedback;
pub mod gateway;
pub mod healthcheck;
pub mod layers;
pub mod limiter;
pub mod loadgen;
pub mod metrics;
pub mod otel;
pub mod profile;
pub mod proxy;
pub mod quota;
pub mod record;
pub mod reload;
pub mod request_id;
pub mod server;
pub mod settle;
pub mod settled;
pub mod sim;
pub mod tenant;
pub mod tls;
pub mod tokenize;
pub mod trace_context;
pub mod usage_log;
pub mod util;
pub mod vision;
pub mod wire;
