//! What several rooms use and none owns: bounded (and paced) reads of a body, a bounded HTTP
//! GET, decimal writing, the default assets the commands find beside the binary, and how
//! vLLM's request models (pydantic) read a field's value.

pub mod assets;
pub mod bounded;
pub mod decimal;
pub mod get;
pub mod pydantic;
