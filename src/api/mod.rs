//! Wire formats: what clients send and what backends answer.

pub mod openai;
pub mod sse;
