//! What several rooms use and none owns: bounded (and paced) reads of a body, a bounded HTTP
//! GET, decimal writing, the default assets the commands find beside the binary, how vLLM's
//! request models (pydantic) read a field's value, how a refusal names a JSON value, and a log
//! line's throttle.

pub mod assets;
pub mod bounded;
pub mod decimal;
pub mod get;
pub mod json;
pub mod pydantic;
pub mod throttle;
